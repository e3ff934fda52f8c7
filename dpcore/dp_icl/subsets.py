"""DP-ICL's exemplar subsets: a fresh Poisson subsample of the private records per draw, split into M disjoint
subsets by a keyed hash of each record id (Wu et al. 2024, Section 3.1, "privacy amplification by subsampling").

The paper (and its code, `PATEStrategy`: for every test query a fresh sample of M x k training records, cut into M
subsets of k) draws new exemplar sets for every query and accounts for them with the subsampled-Gaussian PRV
accountant at rate q = M k / |D|. Here (deliberate difference, the sampler the accountant models exactly):

- inclusion is Poisson: for draw t every record is kept independently with probability q, decided by a keyed
  hash of (the draw's key, the record id) against q (`draw_key`: a per-draw key derived from one secret run key);
- a kept record goes to the subset its keyed hash names (uniform over the M subsets, independent of inclusion),
  and a subset's prompt holds its (at most) k kept records of smallest hash priority, in that order (a bounded
  prompt, as the paper's k-shot prompts; a subset that draws nothing votes with no demonstration).

A record's inclusion, subset and priority depend on its own id and the key only, never on a row position or on
the other records: adding or removing one record changes at most the one subset its hash names, so one vote of
the histogram moves (`dpcore.dp_icl.aggregation.VOTE_SENSITIVITY`), whatever the truncation to k does. The
bucket and priority hash is PromptPATE's (`dpcore.pate.teachers`), applied under a per-draw key.

Everything here is PRIVATE (which records make up each prompt); the key lives in the private store.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpcore.errors import ConfigError, DataValidationError
from dpcore.pate.teachers import bucket_and_priority

KEY_BYTES = 16
_PRIORITY_RANGE = 2**64  # `bucket_and_priority`'s priority is a uniform 64-bit integer


@dataclass(frozen=True)
class Subsets:
    """One draw's M exemplar subsets: the record ids of each subset's prompt, in prompt order (PRIVATE)."""

    demos: tuple[tuple[str, ...], ...]

    @property
    def count(self) -> int:
        return len(self.demos)

    def ids(self) -> list[str]:
        return [rid for demos in self.demos for rid in demos]


def check_count(name: str, value, minimum: int = 1) -> int:
    """`value` as an int >= minimum (ConfigError naming `name`)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer | float) or not math.isfinite(value) \
            or int(value) != value or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def sampling_rate(subsets: int, shots: int, records: int) -> float:
    """q = M k / |D|: each record's inclusion probability per draw (the paper's subsampling rate; |D| is public).
    ConfigError when q > 1 (fewer records than one draw's expected M k)."""
    m, k = check_count("subsets (M)", subsets), check_count("shots (k)", shots)
    n = check_count("records", records)
    if m * k > n:
        raise ConfigError(f"subsets x shots = {m} x {k} = {m * k} exceeds the {n} private records (q = M k / |D| "
                          f"> 1): use fewer subsets or shots")
    return m * k / n


def run_key(rng: np.random.Generator) -> bytes:
    """The run's secret subset key (PRIVATE: kept in the private store), drawn from the run's noise generator."""
    return rng.bytes(KEY_BYTES)


def draw_key(key: bytes, draw: int) -> bytes:
    """The key of draw t: a keyed hash of t under the run key, so draws are independent subsamples."""
    if not isinstance(key, bytes) or not 1 <= len(key) <= 64:
        raise ConfigError("key: 1 to 64 secret bytes expected (`run_key`)")
    t = check_count("draw", draw, 0)
    return hashlib.blake2b(b"dp-icl draw " + t.to_bytes(8, "little"), key=key, digest_size=KEY_BYTES).digest()


def inclusion_threshold(rate: float) -> int:
    """A record is kept when its 64-bit priority is below this: P = rate exactly up to 2^-64."""
    q = float(rate)
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"sampling_rate must be in (0, 1], got {rate}")
    return _PRIORITY_RANGE if q == 1.0 else math.floor(q * _PRIORITY_RANGE)


def record_draw(key: bytes, draw: int, record_id: str, subsets: int) -> tuple[int, int]:
    """(subset, priority) of one record in draw t: its own id and the key alone decide them."""
    return bucket_and_priority(draw_key(key, draw), str(record_id), subsets)


def check_ids(record_ids: Sequence[str]) -> list[str]:
    ids = [str(rid) for rid in record_ids]
    if len(set(ids)) != len(ids):
        raise DataValidationError("record ids: every private record needs its own id (duplicates found)")
    return ids


def draw_subsets(record_ids: Sequence[str], key: bytes, draw: int, subsets: int, shots: int,
                 rate: float) -> Subsets:
    """Draw t's M disjoint subsets of at most k ids each: Poisson inclusion at `rate`, subset and order by keyed
    hash (module docstring). Independent of the order of `record_ids`."""
    m, k = check_count("subsets (M)", subsets), check_count("shots (k)", shots)
    threshold = inclusion_threshold(rate)
    this_draw = draw_key(key, draw)
    buckets: list[list[tuple[int, str]]] = [[] for _ in range(m)]
    for rid in check_ids(record_ids):
        bucket, priority = bucket_and_priority(this_draw, rid, m)
        if priority < threshold:
            buckets[bucket].append((priority, rid))
    return Subsets(tuple(tuple(rid for _, rid in sorted(bucket)[:k]) for bucket in buckets))


__all__ = ["KEY_BYTES", "Subsets", "check_count", "draw_key", "draw_subsets", "inclusion_threshold", "record_draw",
           "run_key", "sampling_rate"]
