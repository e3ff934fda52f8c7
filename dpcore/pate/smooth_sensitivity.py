"""Releasing PromptPATE's data-dependent privacy cost through smooth sensitivity (Papernot et al. 2018).

The data-dependent RDP of Confident-GNMax (`dpcore.pate.data_dependent`) is a function of the
private vote histograms, so it cannot be published as is. Papernot et al. 2018 ("Scalable
Private Learning with PATE", arXiv:1802.08908, smooth-sensitivity analysis of the appendix)
publish it through the GNSS mechanism (Gaussian noise scaled by smooth sensitivity):
at one Renyi order lambda fixed in advance,

    released RDP = R(D) + SS_beta(D) * N(0, sigma_ss^2),

where R(D) is the data-dependent RDP at lambda summed over the queries and
SS_beta(D) = max_{d >= 0} e^{-beta d} A^(d)(D) is a beta-smooth upper bound on its local
sensitivity, A^(d)(D) bounding the local sensitivity of R over all histograms within d changed
teachers (one record is in one teacher: one change moves at most one vote). The release itself
is (lambda, eps_GNSS)-RDP with (Theorem 23)

    eps_GNSS = lambda e^{2 beta} / sigma_ss^2 + (beta lambda - log(1 - 2 lambda beta) / 2) / (lambda - 1),

for 1 < lambda < 1 / (2 beta). That release is an ESTIMATE of R(D): its noise places it below R(D)
about half the time, so it cannot be charged as the labelling's cost.

What is released here is an upper bound instead: the GNSS release of the upward-shifted function

    f(D) = R(D) + k SS_beta(D),    released f~ = f(D) + c SS_beta(D) N(0, sigma_ss^2),  clipped at 0,

with c = 1 + k (e^beta - 1). Why it is still a GNSS release: SS_beta is beta-smooth, so for neighbours
|SS_beta(D) - SS_beta(D')| <= (e^beta - 1) SS_beta(D), and the local sensitivity of f is at most
LS_R(D) + k (e^beta - 1) SS_beta(D) <= c SS_beta(D); c SS_beta is beta-smooth as well, so Theorem 23
applies to f with the smooth bound c SS_beta, at the same eps_GNSS. Why it is a bound: f~ < R(D) only when
k + c sigma_ss Z < 0, i.e. Z < -k / (c sigma_ss). With z = Phi^{-1}(1 - delta0) and

    k = z sigma_ss / (1 - z sigma_ss (e^beta - 1))   (which needs z sigma_ss (e^beta - 1) < 1),

k / (c sigma_ss) = z, so P[f~ < R(D)] = delta0 exactly (clipping at 0 only raises f~, and R(D) >= 0). Charged
as (lambda, f~)-RDP, the labelling's guarantee holds except with probability delta0 over the release's
noise: delta0 is added to the run's delta (the generalized propose-test-release argument of Redberg, Zhu
and Wang, AISTATS 2023, whose PATE application tests a privately released upper bound of the same
data-dependent RDP). lambda, beta, sigma_ss and delta0 must be fixed without looking at the votes.

Local sensitivities (Papernot et al., appendix Section B.4):

- GNMax at order lambda is a function beta(q) of the union bound q (Proposition 7): Theorem 6's
  bound below q0, the data-independent lambda / sigma2^2 above (q0: where they cross). One
  changed teacher moves q within [B_L(q), B_U(q)] (the bounds of Proposition 13),
  B_{L,U}(q) = (m-1)/2 erfc(erfcinv(2q / (m-1)) +- 1/sigma2) (B_U capped at 1), so the local
  sensitivity at q is max(beta(B_U(q)) - beta(q), beta(q) - beta(B_L(q))) (Algorithm 3), and it
  is largest on the plateau [q1, q0], q1 = B_L(q0), under conditions C5 (beta non-decreasing on
  (0, q0)) and C6 (beta(B_U(q)) - beta(q) non-decreasing on (0, q1)), which `check_conditions`
  verifies numerically. A^(d) walks the histogram d teachers towards the plateau (Algorithms 4
  and 5): votes from the runner-up to the top class when q > q0, from the top class to the
  runner-up when q < q1.
- The threshold test's RDP depends only on the largest count v (0..E): A^(d) is the largest
  difference of consecutive values around v +- d.

Each query's A^(d) is made non-decreasing in d (a bound for every histogram WITHIN d changed
teachers, not only at d): the queries' histograms move together when teachers change, so only
then is the sum over queries a bound for the sum's local sensitivity within d. (The published
analysis code sums the at-distance-d values, which can be smaller.) The GNMax term counts the
answered queries only (the released answered mask is public), so the local sensitivity of the
sum is at most the sum of the queries' local sensitivities.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erfc, erfcinv, ndtri

from dpcore.errors import ConfigError, check_positive
from dpcore.pate import data_dependent as dd

_CONDITION_GRID = 4000   # points of the numerical check of conditions C5, C6
_CONDITION_SLACK = 1e-12  # relative decrease tolerated as rounding in that check


@dataclass(frozen=True)
class SmoothSensitivityRelease:
    """The released upper bound on the data-dependent RDP and what it was computed with (all public: the
    parameters were fixed in advance and the bound is noised)."""

    epsilon: float         # rdp_released + rdp_gnss converted at delta: the guarantee holds at delta + delta0
    delta: float
    delta0: float          # the probability that rdp_released < R(D)
    order: float
    beta: float
    sigma_ss: float
    rdp_released: float    # R(D) + k SS_beta(D) + c SS_beta(D) N(0, sigma_ss^2), clipped at 0
    rdp_gnss: float        # the release's own cost at `order` (Theorem 23)


def gnss_rdp(beta: float, sigma_ss: float, order: float) -> float:
    """eps_GNSS of Theorem 23 (Papernot et al. 2018): the RDP at `order` of adding
    SS_beta * N(0, sigma_ss^2); requires 1 < order < 1 / (2 beta)."""
    b, s, lam = check_positive("beta", beta), check_positive("sigma_ss", sigma_ss), check_positive("order", order)
    if not 1 < lam < 1 / (2 * b):
        raise ConfigError(f"order must be in (1, 1 / (2 beta)) = (1, {1 / (2 * b):.4g}), got {order}")
    return lam * math.exp(2 * b) / s ** 2 + (b * lam - 0.5 * math.log1p(-2 * lam * b)) / (lam - 1)


def upper_bound_factors(beta: float, sigma_ss: float, delta0: float) -> tuple[float, float]:
    """(k, c) of the upward-shifted release (module docstring): the shift k SS_beta and the noise scale
    c SS_beta sigma_ss that put the release below R(D) with probability exactly delta0. ConfigError when
    z sigma_ss (e^beta - 1) >= 1 (no finite shift does it: lower beta or sigma_ss, or raise delta0)."""
    b, s = check_positive("beta", beta), check_positive("sigma_ss", sigma_ss)
    d0 = float(delta0)
    if not 0.0 < d0 < 0.5:
        raise ConfigError(f"delta0 must be in (0, 0.5), got {delta0}")
    z = -float(ndtri(d0))  # Phi^{-1}(1 - delta0), accurate for small delta0
    growth = z * s * math.expm1(b)
    if not growth < 1.0:
        raise ConfigError(f"beta {b:.4g} with sigma_ss {s:g} at delta0 {d0:.3g}: z sigma_ss (e^beta - 1) = "
                          f"{growth:.3g} must be below 1 for a finite upward shift; lower beta or sigma_ss")
    k = z * s / (1.0 - growth)
    return k, 1.0 + k * math.expm1(b)


def _log_bound(log_q: float, sigma2: float, classes: int, upper: bool) -> float:
    """log B_U(q) or log B_L(q) (Proposition 13's bounds): q after one teacher changes its vote."""
    return float(_log_bounds(log_q, sigma2, classes, upper))


def _log_bounds(log_q, sigma2: float, classes: int, upper: bool) -> np.ndarray:
    """`_log_bound` elementwise (q = 0 stays 0)."""
    half = (classes - 1) / 2
    shift = -1 / sigma2 if upper else 1 / sigma2
    value = half * erfc(erfcinv(np.exp(np.asarray(log_q, dtype=float)) / half) + shift)
    if upper:
        value = np.minimum(1.0, value)
    with np.errstate(divide="ignore"):
        return np.where(value > 0, np.log(value), -np.inf)


@functools.lru_cache(maxsize=256)
def _log_q0(sigma2: float, order: float) -> float:
    """log q0: GNMax's data-dependent bound is below the data-independent one for q < q0 (bisection;
    -inf when it never is)."""
    independent = order / sigma2 ** 2

    def dependent_better(log_q: float) -> bool:
        return dd.rdp_from_log_qs([log_q], sigma2, order)[0] < independent

    lo, hi = -1.0, 0.0  # at hi (q = 1) the bound is data-independent
    while not dependent_better(lo):
        lo *= 2
        if lo < -1e6:
            return -math.inf
    # dependent_better(lo) holds, not at hi = 0 (q = 1): bisect the crossing
    while hi - lo > 1e-12 * max(1.0, abs(lo)):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dependent_better(mid) else (lo, mid)
    return lo


def _ls_gnmax(log_q, sigma2: float, classes: int, order: float, log_q0: float, log_q1: float) -> np.ndarray:
    """Algorithm 3 (correct by Proposition 13), elementwise: an upper bound on GNMax's local sensitivity at each
    q (the plateau value on [q1, q0])."""
    log_q = np.asarray(log_q, dtype=float)
    log_q = np.where((log_q1 <= log_q) & (log_q <= log_q0), log_q1, log_q)
    here = dd.rdp_from_log_qs(log_q, sigma2, order)
    up = dd.rdp_from_log_qs(_log_bounds(log_q, sigma2, classes, upper=True), sigma2, order)
    down = dd.rdp_from_log_qs(_log_bounds(log_q, sigma2, classes, upper=False), sigma2, order)
    return np.maximum(up - here, here - down)


@functools.lru_cache(maxsize=256)
def check_conditions(sigma2: float, classes: int, order: float) -> tuple[bool, bool]:
    """Conditions C5 and C6 of Papernot et al. (appendix Section B.4.2), checked numerically on a fine grid of
    log q: GNMax's beta(q) non-decreasing on (0, q0), beta(B_U(q)) - beta(q) non-decreasing on
    (0, q1). The smooth-sensitivity bound relies on both."""
    sigma, lam = float(sigma2), float(order)
    log_q0 = _log_q0(sigma, lam)
    if log_q0 == -math.inf:
        return True, True  # data-independent everywhere: nothing depends on the data
    log_q1 = _log_bound(log_q0, sigma, classes, upper=False)

    def non_decreasing(values: np.ndarray) -> bool:
        return bool(np.all(np.diff(values) >= -_CONDITION_SLACK * np.maximum(np.abs(values[1:]), 1e-300)))

    def grid(top: float) -> np.ndarray:
        return np.linspace(max(20 * top, -700.0), top, _CONDITION_GRID)

    beta = dd.rdp_from_log_qs(grid(log_q0), sigma, lam)
    c5 = non_decreasing(beta)
    if not c5 or log_q1 == -math.inf:
        return c5, False
    log_q = grid(log_q1)
    gap = dd.rdp_from_log_qs(_log_bounds(log_q, sigma, classes, upper=True), sigma, lam) - dd.rdp_from_log_qs(log_q, sigma, lam)
    return c5, non_decreasing(gap)


def local_sensitivities_gnmax(counts, teachers: int, sigma2: float, order: float) -> np.ndarray:
    """A^(d) for d = 0..E of GNMax's data-dependent RDP at `order` on one vote histogram
    (Algorithms 4 and 5): the largest local sensitivity within d changed teachers."""
    votes = sorted((float(v) for v in dd.check_vote_histograms(counts)[0]), reverse=True)
    classes = len(votes)
    sigma, lam = float(sigma2), float(order)
    log_q0 = _log_q0(sigma, lam)
    log_q1 = _log_bound(log_q0, sigma, classes, upper=False)

    def sensitivities(log_qs: list[float]) -> np.ndarray:
        return _ls_gnmax(log_qs, sigma, classes, lam, log_q0, log_q1)

    result = np.full(int(teachers) + 1, sensitivities([log_q1])[0])  # the plateau bounds every distance
    log_q = dd.log_q_gnmax(votes, sigma)
    if log_q1 <= log_q <= log_q0:
        return result
    walk = [log_q]  # q at distance d = 0, 1, ...: the walk depends on the votes only
    towards_smaller_q = log_q > log_q0
    while len(walk) < result.size and ((towards_smaller_q and log_q > log_q0 and votes[1] > 0)
                                       or (not towards_smaller_q and log_q < log_q1)):
        if towards_smaller_q:  # a runner-up vote goes to the top class; keep the votes sorted
            votes[0] += 1
            votes[1] -= 1
            votes[1:] = sorted(votes[1:], reverse=True)
        else:  # a top vote goes to the runner-up
            votes[0] -= 1
            votes[1] += 1
        log_q = dd.log_q_gnmax(votes, sigma)
        walk.append(log_q)
    result[:len(walk)] = sensitivities(walk)
    return np.maximum.accumulate(result)  # within d, not only at d (the discounted max is the same)


@functools.lru_cache(maxsize=64)
def _threshold_local_sensitivity_by_count(teachers: int, threshold: float, sigma1: float, order: float) -> np.ndarray:
    """The threshold test's local sensitivity when the largest count is v, for v = 0..E (public)."""
    rdp = np.array([float(dd.rdp_threshold(dd.log_pr_answered([v, 0], threshold, sigma1), sigma1, [order])[0])
                    for v in range(teachers + 1)])
    steps = np.abs(np.diff(rdp))                       # steps[v]: between v and v + 1
    local = np.zeros(teachers + 1)
    local[:-1] = steps
    local[1:] = np.maximum(local[1:], steps)           # LS at v: the larger step next to v
    local.setflags(write=False)
    return local


def local_sensitivities_threshold(counts, teachers: int, threshold: float, sigma1: float, order: float
                                  ) -> np.ndarray:
    """A^(d) for d = 0..E of the threshold test's data-dependent RDP at `order` on one vote histogram:
    its RDP depends on the largest count v only, which one changed teacher moves by at most 1."""
    e = int(teachers)
    local = _threshold_local_sensitivity_by_count(e, float(threshold), float(sigma1), float(order))
    top = int(round(float(dd.check_vote_histograms(counts)[0].max())))
    top = min(max(top, 0), e)
    d = np.arange(e + 1)
    above = np.where(top + d <= e, local[np.minimum(top + d, e)], 0.0)
    below = np.where(top - d >= 0, local[np.maximum(top - d, 0)], 0.0)
    return np.maximum.accumulate(np.maximum(above, below))  # within d, not only at d


def smooth_sensitivity(vote_histograms, answered, *, teachers: int, threshold: float, sigma1: float, sigma2: float,
                       order: float, beta: float) -> float:
    """SS_beta = max_d e^{-beta d} sum_i A_i^(d) of R(D) = sum_i (threshold RDP + answered_i GNMax RDP)
    at `order`. DATA-DEPENDENT: never publish it; it scales the GNSS noise."""
    votes = dd.check_vote_histograms(vote_histograms)
    mask = _mask(answered, votes.shape[0])
    total = np.zeros(int(teachers) + 1)
    for row, is_answered in zip(votes, mask, strict=True):
        total += local_sensitivities_threshold(row, teachers, threshold, sigma1, order)
        if is_answered:
            total += local_sensitivities_gnmax(row, teachers, sigma2, order)
    return float(np.max(total * np.exp(-float(beta) * np.arange(total.size))))


def _mask(answered, queries: int) -> np.ndarray:
    mask = np.asarray(answered)
    if mask.shape != (queries,) or mask.dtype != bool:
        raise ConfigError(f"answered must be one bool per query ({queries}), got {mask.dtype} of shape {mask.shape}")
    return mask


def shifted_release(rdp, smooth_sens, noise, *, beta: float, sigma_ss: float, delta0: float):
    """The upper bound's arithmetic (module docstring): max(0, R + SS_beta (k + c sigma_ss noise)) for standard
    normal `noise` (elementwise over arrays of any of the three). Pure: the noise is drawn by the caller."""
    shift, scale = upper_bound_factors(beta, sigma_ss, delta0)
    value = np.asarray(rdp, dtype=float) + np.asarray(smooth_sens, dtype=float) * (
        shift + scale * float(sigma_ss) * np.asarray(noise, dtype=float))
    return np.maximum(0.0, value)


def release_data_dependent_epsilon(vote_histograms, answered, *, teachers: int, threshold: float, sigma1: float,
                                   sigma2: float, delta: float, order: float, beta: float, sigma_ss: float,
                                   delta0: float, rng: np.random.Generator) -> SmoothSensitivityRelease:
    """Publish an upper bound on Confident-GNMax's data-dependent RDP at `order` (GNMax counted on the
    `answered` queries) that holds except with probability `delta0`: the GNSS release of
    R(D) + k SS_beta(D) with noise c SS_beta(D) N(0, sigma_ss^2) from `rng` (module docstring), and its
    epsilon at `delta` with eps_GNSS. `order`, `beta`, `sigma_ss`, `delta0` must be fixed without looking at
    the votes. Raises ConfigError when conditions C5/C6 fail at these parameters or no finite shift exists."""
    votes = dd.check_vote_histograms(vote_histograms)
    mask = _mask(answered, votes.shape[0])
    cost = gnss_rdp(beta, sigma_ss, order)
    upper_bound_factors(beta, sigma_ss, delta0)  # ConfigError before any computation on the votes
    e = int(teachers)
    if e < 1 or float(votes.sum(axis=1).max()) > e:
        raise ConfigError(f"teachers must be >= 1 and at least every histogram's total, got {teachers}")
    c5, c6 = check_conditions(sigma2, votes.shape[1], order)
    if not (c5 and c6):
        raise ConfigError(f"the smooth-sensitivity analysis does not apply at sigma2 = {sigma2}, order = {order}, "
                          f"{votes.shape[1]} classes (condition {'C6' if c5 else 'C5'} fails)")
    report = dd.data_dependent_epsilon(votes, threshold, sigma1, sigma2, delta, orders=[order], answered=mask)
    ss = smooth_sensitivity(votes, mask, teachers=e, threshold=threshold, sigma1=sigma1, sigma2=sigma2,
                            order=order, beta=beta)
    released = float(shifted_release(float(report.rdp[0]), ss, float(rng.standard_normal()), beta=beta,
                                     sigma_ss=sigma_ss, delta0=delta0))
    epsilon = released + cost + math.log(1 / float(delta)) / (float(order) - 1)
    return SmoothSensitivityRelease(epsilon, float(delta), float(delta0), float(order), float(beta), float(sigma_ss),
                                    released, cost)


__all__ = [
    "SmoothSensitivityRelease", "check_conditions", "gnss_rdp", "local_sensitivities_gnmax",
    "local_sensitivities_threshold", "release_data_dependent_epsilon", "shifted_release", "smooth_sensitivity",
    "upper_bound_factors",
]
