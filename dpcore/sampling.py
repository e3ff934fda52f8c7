"""Subsampling a label's private records into M groups (Tang et al., Algorithm 1 lines 3-5).

`poisson_groups` is the sampler the privacy accountant assumes (Remark A.6 of the paper):
each record of D_y is included independently with probability q = MN/|D_y|, and each
included record is assigned independently and uniformly to one of the M groups. Under
add/remove neighbours one record changes at most one group, so the L2 sensitivity of the
sum of the group distributions (line 12) stays sqrt(2). A group that receives no record
contributes nothing to the sum.

`fixed_size_groups` is the paper's reference code: MN records drawn without replacement and
cut into M groups of N. Its privacy is NOT what the Poisson accountant computes (replace-one
sampling without replacement is materially weaker); it exists only for reproducing the paper.

Both are called afresh at every token step (line 3 sits inside the loop over t).
Randomness comes from the caller's `np.random.Generator`; nothing here touches record text.
"""

from __future__ import annotations

import math

import numpy as np

from dpcore.errors import ConfigError

SAMPLERS = ("poisson", "fixed")


def sampling_rate(num_subsets: int, subset_size: int, num_records: int) -> float:
    """q = MN/|D_y|: the Poisson inclusion probability of one record. ConfigError when q > 1."""
    check_group_sizes(num_subsets, subset_size)
    if num_records < 1:
        raise ConfigError("num_records: a label needs at least one record")
    rate = num_subsets * subset_size / num_records
    if rate > 1:
        raise ConfigError(
            f"sampling rate q = num_subsets*subset_size/records = {num_subsets}*{subset_size}/{num_records} "
            f"= {rate:.3g} > 1: lower --num-subsets or --subset-size"
        )
    return rate


def check_group_sizes(num_subsets: int, subset_size: int) -> None:
    if int(num_subsets) != num_subsets or num_subsets < 1:
        raise ConfigError(f"num_subsets (M) must be an integer >= 1, got {num_subsets!r}")
    if int(subset_size) != subset_size or subset_size < 1:
        raise ConfigError(f"subset_size (N) must be an integer >= 1, got {subset_size!r}")


def poisson_groups(
    num_records: int, sampling_rate: float, num_subsets: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Algorithm 1 lines 3-5 with Poisson subsampling (the accountant's sampler).

    Every record index in [0, num_records) is kept independently with probability
    `sampling_rate`; every kept index goes to one of `num_subsets` groups, independently and
    uniformly. Returns M int64 arrays of record indices (possibly empty), in random order
    within each group (the order records appear in the group's prompt).
    """
    if num_records < 0:
        raise ConfigError(f"num_records must be >= 0, got {num_records}")
    if not (0.0 <= sampling_rate <= 1.0) or math.isnan(sampling_rate):
        raise ConfigError(f"sampling_rate must lie in [0, 1], got {sampling_rate}")
    check_group_sizes(num_subsets, 1)
    kept = np.flatnonzero(rng.random(num_records) < sampling_rate)
    kept = rng.permutation(kept)
    group_of = rng.integers(0, num_subsets, size=kept.size)
    return [kept[group_of == m].astype(np.int64) for m in range(num_subsets)]


def fixed_size_groups(
    num_records: int, num_subsets: int, subset_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """The paper's reference sampler: MN records without replacement, M groups of N.

    NOT covered by the Poisson accountant (see module docstring); use only to reproduce
    the paper's code. ConfigError when MN > num_records.
    """
    check_group_sizes(num_subsets, subset_size)
    total = num_subsets * subset_size
    if total > num_records:
        raise ConfigError(
            f"fixed sampler: num_subsets*subset_size = {total} exceeds the label's {num_records} records"
        )
    chosen = rng.choice(num_records, size=total, replace=False).astype(np.int64)
    return [chosen[m * subset_size:(m + 1) * subset_size] for m in range(num_subsets)]


def draw_groups(
    sampler: str, num_records: int, num_subsets: int, subset_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One token step's groups for one label with the configured sampler ("poisson" or "fixed")."""
    if sampler == "poisson":
        return poisson_groups(num_records, sampling_rate(num_subsets, subset_size, num_records), num_subsets, rng)
    if sampler == "fixed":
        return fixed_size_groups(num_records, num_subsets, subset_size, rng)
    raise ConfigError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
