"""Subsampling a label's private records into M groups (Tang et al., Algorithm 1 lines 3-5).

`poisson_groups` is the sampler the privacy accountant assumes (Remark A.6 of the paper):
each record of D_y is included independently with probability q = MN/|D_y|, and each
included record is assigned independently and uniformly to one of the M groups. Under
add/remove neighbours one record changes at most one group, so the L2 sensitivity of the
sum of the group distributions (line 12) stays sqrt(2). A group that receives no record
contributes nothing to the sum.

`fixed_size_groups` is the paper's reference code: MN records drawn without replacement (a
uniformly random ordered sequence of MN distinct records) and cut into M groups of N. Under
the neighbouring relation of this project (add/remove one record, `dpcore.fewshot.accounting`), the
Poisson accountant's bound at q = MN/|D_y| covers it too. Proof (m = MN, n = |D|, D' = D + x):

  1. Coupling. A uniform ordered m-sequence of D' either avoids x, with probability
     1 - m/(n+1), and is then a uniform ordered m-sequence of D; or holds x, with probability
     p = m/(n+1), at a uniform slot j, the other slots being a uniform ordered (m-1)-sequence
     of D, which is exactly "a uniform ordered m-sequence S of D with slot j replaced by x".
     So, for the groups G(S) of a sample S and S_x = S with a uniform slot replaced by x,
         out(D)  = E_S[ A_S ],                 A_S = mechanism on G(S),
         out(D') = E_S[ (1 - p) A_S + p B_S ], B_S = mechanism on G(S_x).
     Poisson sampling at rate q has the same form with B_S the mechanism on G(S) plus x in a
     uniform group (`tests/test_sampling.py` checks the identity exactly by enumeration).
  2. One group changes. G(S_x) and G(S) differ in the one group holding slot j: one
     probability vector replaced by another, so the sum of line 12 moves by at most sqrt(2)
     in L2 (and the max-normalised sum of report-noisy-max by at most 1 in L_inf), the same
     bound as a Poisson addition. A_S and B_S are then the per-sample pair of a Gaussian
     (exponential) mechanism at that sensitivity, exactly as for Poisson.
  3. Joint convexity of the hockey-stick divergence H_alpha (every alpha >= 0) over S (both
     distributions are mixtures over the same S with the same weights) bounds each direction,
     H(out(D') || out(D)) and H(out(D) || out(D')), by the worst per-sample pair, ((1 - p) A + p B, A) and its
     reverse: the pair the Poisson accountant composes (Theorem A.3 / A.5), with p in place
     of q. The pair is monotone in the mixing weight (for p' = r p, r <= 1,
     (1 - p')A + p'B = (1 - r)A + r((1 - p)A + pB), joint convexity again, and
     H_alpha(A || A) = max(0, 1 - alpha) <= H_alpha of any pair), so p <= q suffices. For the two neighbours of the private set D_y: removing a record gives
     p = m/|D_y| = q; adding one gives p = m/(|D_y| + 1) < q.
  4. Steps and labels compose as for Poisson: every step draws a fresh sample from the
     stream's own generator (adaptive composition of T identical pairs), labels in parallel.

So the fixed sampler needs no count-dependent rate at all (m does not depend on |D|), and the
per-label counts are public here exactly as for the Poisson sampler (they set the reported q
and whether MN <= |D_y|). What IS materially weaker (REFERENCE.md: RDP 8.99 against 5.59) is
sampling without replacement under the replace-one (substitution) relation, where both
neighbours are mixtures ((1 - p)A + pB against (1 - p)A + pB'); that relation is not the one
this project's guarantee is stated for. The sampler still exists to reproduce the paper's
code; Poisson stays the default because it is what the accountant models exactly (fixed is
only bounded by it). `ACCOUNTED_SAMPLERS` lists the samplers the release gate accepts.

Both are called afresh at every token step (line 3 sits inside the loop over t).
Randomness comes from the caller's `np.random.Generator`; nothing here touches record text.
"""

from __future__ import annotations

import math

import numpy as np

from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.names import SAMPLERS

# Samplers whose privacy the Poisson accountant's bound covers (module docstring): the release gate
# refuses demos drawn with any other (or with no recorded sampler). Every sampler offered is one today.
ACCOUNTED_SAMPLERS: tuple[str, ...] = SAMPLERS


def sampling_rate(num_subsets: int, subset_size: int, num_records: int) -> float:
    """q = MN/|D_y|: the Poisson inclusion probability of one record. ConfigError when q > 1."""
    check_group_sizes(num_subsets, subset_size)
    if num_records < 1:
        raise ConfigError("num_records: a label needs at least one record")
    rate = num_subsets * subset_size / num_records
    if rate > 1:
        raise ConfigError(
            f"sampling rate q = M*N/records = {num_subsets}*{subset_size}/{num_records} = {rate:.3g} > 1: lower "
            f"{flag('num_subsets')} (M) or {flag('subset_size')} (N)"
        )
    return rate


def check_group_sizes(num_subsets: int, subset_size: int) -> None:
    if int(num_subsets) != num_subsets or num_subsets < 1:
        raise ConfigError(f"{flag('num_subsets')} (M) must be an integer >= 1, got {num_subsets!r}")
    if int(subset_size) != subset_size or subset_size < 1:
        raise ConfigError(f"{flag('subset_size')} (N) must be an integer >= 1, got {subset_size!r}")


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

    Returns a uniformly random ordered sequence of MN distinct indices cut into M consecutive
    groups of N (each group's order is its prompt order). Under add/remove neighbours it is
    dominated by the Poisson accountant's pair at q = MN/num_records (module docstring).
    ConfigError when MN > num_records.
    """
    check_group_sizes(num_subsets, subset_size)
    total = num_subsets * subset_size
    if total > num_records:
        raise ConfigError(
            f"fixed sampler: {flag('num_subsets')} x {flag('subset_size')} = {total} exceeds the label's "
            f"{num_records} records"
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
