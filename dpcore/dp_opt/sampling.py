"""Which private records each subset of one token step holds (Hong et al. 2024, Algorithm 1's subsampling).

Per token, DP-OPT draws a Poisson sample of the training records at rate q = M k / n and cuts it into M disjoint
demo subsets of k records (the authors' `sample_demos(..., poisson=True)` under `--tokenwise_gen`). Both steps
here read one record at a time through a keyed hash of its id, never its row position:

- sampled: `hash_unit(id, sample_key) < q` (`dpcore.data.splits.hash_unit`), so inclusions are independent
  Bernoulli(q) across records (the accountant's Poisson sampling) and a record's inclusion does not depend on
  the other records;
- subset: the keyed bucket and priority of `dpcore.pate.teachers` (PromptPATE's disjoint teachers); a subset keeps
  its k sampled records of smallest priority.

Both keys are drawn from the run's noise generator for every step. So adding a record changes at most the one
subset it falls into (hence one vote), and every other record's membership is unchanged.

Deliberate difference: the authors cut the Poisson sample into consecutive chunks of k by position, so one added
record shifts every later chunk (many votes change); the keyed partition keeps the sensitivity at one vote.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpcore.data.splits import hash_split, hash_unit
from dpcore.errors import ConfigError
from dpcore.pate.teachers import bucket_and_priority


def sampling_rate(subsets: int, shots: int, records: int) -> float:
    """q = min(1, M k / n): the paper's rate (`dp_batch_size / n_sample`), n the public record count."""
    if records < 1:
        raise ConfigError(f"dp-opt: no private records to write an instruction from (got {records})")
    return min(1.0, subsets * shots / records)


def poisson_sample(record_ids: Sequence[str], rate: float, key: bytes) -> list[str]:
    """The ids included at rate q: each by its own keyed hash (independent across records given the key)."""
    if not 0.0 < rate <= 1.0:
        raise ConfigError(f"dp-opt sampling rate must be in (0, 1], got {rate}")
    return [str(rid) for rid in record_ids if rate >= 1.0 or hash_unit(str(rid), key) < rate]


def partition(sampled_ids: Sequence[str], subsets: int, shots: int, key: bytes) -> tuple[tuple[str, ...], ...]:
    """M disjoint subsets of at most k ids: a record's subset and priority are its keyed hash (PromptPATE's
    `bucket_and_priority`); each subset keeps its k smallest priorities. Independent of the ids' order."""
    buckets: list[list[tuple[int, str]]] = [[] for _ in range(subsets)]
    for rid in sampled_ids:
        bucket, priority = bucket_and_priority(key, str(rid), subsets)
        buckets[bucket].append((priority, str(rid)))
    return tuple(tuple(rid for _, rid in sorted(bucket)[:shots]) for bucket in buckets)


def step_subsets(record_ids: Sequence[str], subsets: int, shots: int, rate: float,
                 rng: np.random.Generator) -> tuple[tuple[str, ...], ...]:
    """One token step's M subsets (PRIVATE): fresh sampling and partition keys from `rng` (two 16-byte draws,
    whatever the records), then `poisson_sample` and `partition`."""
    sample_key, partition_key = rng.bytes(16), rng.bytes(16)
    return partition(poisson_sample(record_ids, rate, sample_key), subsets, shots, partition_key)


def holdout_mask(record_ids: Sequence[str], fraction: float, key: bytes) -> np.ndarray:
    """True where a record scores the candidates rather than writing them: a keyed-hash split
    (`dpcore.data.splits.hash_split`), so the two parts are disjoint and neighbour-stable."""
    return hash_split([str(r) for r in record_ids], fraction, key, name="dp-opt holdout_fraction")
