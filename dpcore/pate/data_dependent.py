"""PromptPATE's data-dependent privacy analysis: Confident-GNMax's RDP from the vote histograms.

Papernot et al. 2018, "Scalable Private Learning with PATE" (ICLR 2018, arXiv:1802.08908):
its data-dependent RDP analysis of GNMax and Confident-GNMax, as PromptPATE uses it (Duan et
al. 2023, App. C.3: "the privacy analysis of our PromptPATE entirely follows Papernot et al.").
Neighbouring datasets and sensitivities are those of `dpcore.pate.privacy` (one record in one
teacher).

THE OUTPUTS OF THIS MODULE ARE DATA-DEPENDENT AND NOT DIFFERENTIALLY PRIVATE BY THEMSELVES.
They are functions of the private vote histograms: the epsilon they compute is a valid bound
for the particular histograms given, but releasing it (or anything else in a
`DataDependentReport`) leaks information about those histograms. The ledger charges the
data-independent plan (`dpcore.pate.privacy`); the data-dependent epsilon may be released only
through a mechanism that pays for it (Papernot et al.'s smooth sensitivity,
`dpcore.pate.smooth_sensitivity`), or reported, as the paper does, clearly marked
data-dependent. The reports stay in the private store. Both this bound and the data-independent
one hold for the run, so the smaller of the two is a valid (data-dependent) figure too.

For query i with vote histogram n (m classes, n_{i*} the largest count):

- GNMax, noise N(0, sigma2^2) per count. Proposition 7: q = P[noisy argmax != i*] <=
  sum_{j != i*} P[N(0, 2 sigma2^2) >= n_{i*} - n_j] (a union bound; also q <= 1 - 1/m).
  Proposition 8: data-independent RDP lambda / sigma2^2 (L2 sensitivity sqrt(2)). Theorem 6
  with Proposition 10's higher orders mu2 = sigma2 sqrt(log 1/q), mu1 = mu2 + 1,
  eps_k = mu_k / sigma2^2: if q < 1, mu2 > 1, q e^{eps2} < 1 and
  q <= e^{(mu2 - 1) eps2} / (mu1/(mu1-1) * mu2/(mu2-1))^{mu2}, then for lambda < mu1
      RDP(lambda) <= 1/(lambda-1) log((1-q) A^{lambda-1} + q B^{lambda-1}),
      A = (1-q) / (1 - (q e^{eps2})^{(mu2-1)/mu2}),  B = e^{eps1} / q^{1/(mu1-1)},
  and the data-independent bound otherwise (the smaller of the two is used).
- Threshold test, noise N(0, sigma1^2) on max_j n_j (sensitivity 1): data-independent RDP
  lambda / (2 sigma1^2). Its outcome is binary; with p = P[max_j n_j + N(0, sigma1^2) >= T],
  the less likely outcome has probability q = min(p, 1 - p), and Theorem 6 applies as above
  with the Gaussian's RDP curve lambda / (2 sigma1^2), i.e. sigma = sqrt(2) sigma1.

A query costs the threshold test's RDP, plus GNMax's RDP when it is answered. With the
realized answered mask (the threshold's noisy outcomes, which the method releases anyway), the
GNMax term counts the answered queries only; without it, its expectation p * RDP_GNMax is used
(Papernot et al.'s expected cost). RDP adds up over queries (Mironov 2017, Proposition 1) and
converts to (epsilon, delta) by epsilon = min_lambda RDP(lambda) + log(1/delta) / (lambda - 1)
(Mironov 2017, Proposition 3), the conversion Papernot et al. report with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr

from dpcore.errors import ConfigError, check_positive

# Renyi orders searched (lambda > 1): fine below 100, geometric up to 1000.
DEFAULT_ORDERS: np.ndarray = np.concatenate((np.array([1.25, 1.5, 1.75]), np.arange(2.0, 100.0, 0.5),
                                             np.geomspace(100.0, 1000.0, 60)))
DEFAULT_ORDERS.setflags(write=False)


@dataclass(frozen=True)
class DataDependentReport:
    """The data-dependent privacy of Confident-GNMax on given vote histograms (NOT DP by itself).

    `epsilon` holds at `delta` for these histograms only; `order` is the Renyi order attaining
    it. `answered` is the number of answered queries (realized mask given) or its expectation
    (`expected` True). Curves are over `orders`, summed over the queries."""

    epsilon: float
    order: float
    delta: float
    queries: int
    answered: float
    expected: bool
    orders: np.ndarray
    rdp: np.ndarray             # total RDP curve
    rdp_threshold: np.ndarray   # the threshold tests' share
    rdp_gnmax: np.ndarray       # GNMax's share (answered queries, or expected)


def _log1mexp(x):
    """log(1 - e^x) for x <= 0, stably, elementwise."""
    x = np.asarray(x, dtype=float)
    if np.any(x > 0):
        raise ValueError(f"log1mexp needs x <= 0, got {x[x > 0].flat[0]}")
    with np.errstate(divide="ignore"):  # x = 0: log 0 = -inf
        return np.where(x > -math.log(2), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def _orders(orders) -> np.ndarray:
    values = np.array(orders, dtype=float, ndmin=1)  # a copy: the report freezes its own
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 1):
        raise ConfigError("orders must be a non-empty list of finite Renyi orders > 1")
    return values


def check_vote_histograms(vote_histograms) -> np.ndarray:
    """The histograms as a float (queries x classes) array; ConfigError unless >= 2 classes, counts >= 0."""
    votes = np.asarray(vote_histograms, dtype=float)
    if votes.ndim == 1:
        votes = votes[None, :]
    if votes.ndim != 2 or votes.shape[0] < 1 or votes.shape[1] < 2:
        raise ConfigError(f"vote_histograms must be a (queries x classes) array with >= 2 classes, "
                          f"got shape {votes.shape}")
    if not np.all(np.isfinite(votes)) or np.any(votes < 0):
        raise ConfigError("vote_histograms must hold finite counts >= 0")
    return votes


def log_q_gnmax(counts, sigma2: float) -> float:
    """log of Proposition 7's bound on q = P[GNMax's noisy argmax != the true argmax]:
    log min(sum_{j != i*} P[N(0, 2 sigma2^2) >= n_{i*} - n_j], 1 - 1/m)."""
    votes = check_vote_histograms(counts)[0]
    sigma = check_positive("vote_sigma (sigma2)", sigma2)
    top = int(np.argmax(votes))
    gaps = votes[top] - np.delete(votes, top)
    log_tails = log_ndtr(-gaps / (math.sqrt(2.0) * sigma))  # log P[N(0, 2 sigma^2) >= gap]
    return float(min(np.logaddexp.reduce(log_tails), math.log1p(-1.0 / votes.size)))


def rdp_gaussian_data_independent(sigma: float, orders=DEFAULT_ORDERS) -> np.ndarray:
    """GNMax's data-independent RDP lambda / sigma^2 (Proposition 8; L2 sensitivity sqrt(2))."""
    return _orders(orders) / check_positive("sigma", sigma) ** 2


def rdp_from_log_q(log_q: float, sigma: float, orders=DEFAULT_ORDERS) -> np.ndarray:
    """RDP at `orders` of a mechanism with GNMax's RDP curve lambda / sigma^2 whose likely outcome
    fails with probability at most e^log_q: Theorem 6 with Proposition 10's mu1, mu2 where its
    conditions hold (the smaller of it and the data-independent bound), else lambda / sigma^2.
    q = 0 (log_q = -inf): the output is fixed, RDP 0."""
    return _rdp_table([log_q], sigma, _orders(orders))[0]


def rdp_from_log_qs(log_qs, sigma: float, order: float) -> np.ndarray:
    """`rdp_from_log_q` at one order for many log q at once (the smooth-sensitivity analysis checks its
    conditions on grids of thousands of q)."""
    return _rdp_table(log_qs, sigma, _orders([order]))[:, 0]


def _rdp_table(log_qs, sigma: float, lam: np.ndarray) -> np.ndarray:
    """(log q, order) table of `rdp_from_log_q`: Theorem 6's conditions and bound elementwise."""
    independent = rdp_gaussian_data_independent(sigma, lam)
    log_q = np.asarray(log_qs, dtype=float)
    bad = np.isnan(log_q) | (log_q > 0)
    if bad.any():
        raise ConfigError(f"log_q must be <= 0, got {log_q[bad][0]}")
    log_q = log_q[:, None]
    variance = float(sigma) ** 2
    with np.errstate(all="ignore"):  # where Theorem 6 does not apply its terms may be inf or nan: not used
        mu2 = np.sqrt(variance * -log_q)
        mu1 = mu2 + 1.0
        eps1, eps2 = mu1 / variance, mu2 / variance
        theorem_6 = (mu2 > 1) & (-log_q > eps2)  # Theorem 6 needs mu2 > 1 and q e^{eps2} < 1 ...
        # ... and q within the range where its bound holds (Lemma 9)
        theorem_6 &= log_q <= (mu2 - 1) * eps2 - mu2 * (np.log1p(1 / (mu1 - 1)) + np.log1p(1 / (mu2 - 1)))
        log_1q = _log1mexp(log_q)
        log_a = log_1q - _log1mexp(np.minimum((log_q + eps2) * (1 - 1 / mu2), 0.0))
        log_b = eps1 - log_q / (mu1 - 1)
        dependent = np.logaddexp(log_1q + (lam - 1) * log_a, log_q + (lam - 1) * log_b) / (lam - 1)
        rdp = np.where(theorem_6 & (lam < mu1), np.minimum(independent, dependent), independent)
    return np.where(log_q == -np.inf, 0.0, rdp)


def log_pr_answered(counts, threshold: float, sigma1: float) -> float:
    """log P[max_j n_j + N(0, sigma1^2) >= T]: the probability that the threshold test answers.
    (max_j n_j is rounded to an integer: vote counts are integers.)"""
    votes = check_vote_histograms(counts)[0]
    return float(log_ndtr((round(float(votes.max())) - float(threshold)) / check_positive("threshold_sigma (sigma1)",
                                                                                   sigma1)))


def rdp_threshold(log_p_answered: float, sigma1: float, orders=DEFAULT_ORDERS) -> np.ndarray:
    """The threshold test's data-dependent RDP: Theorem 6 on its binary outcome, the less likely
    of which has probability q = min(p, 1 - p), with the Gaussian's curve lambda / (2 sigma1^2)
    (sensitivity 1: GNMax's curve at sigma = sqrt(2) sigma1)."""
    log_p = float(log_p_answered)
    log_q = min(log_p, float(_log1mexp(log_p)))
    return rdp_from_log_q(log_q, math.sqrt(2.0) * check_positive("threshold_sigma (sigma1)", sigma1), orders)


def epsilon_from_rdp(orders, rdp, delta: float) -> tuple[float, float]:
    """(epsilon, order): min over orders of RDP(lambda) + log(1/delta) / (lambda - 1) (Mironov 2017,
    Proposition 3)."""
    lam = _orders(orders)
    curve = np.asarray(rdp, dtype=float)
    if curve.shape != lam.shape:
        raise ConfigError(f"rdp must have one value per order ({lam.size}), got shape {curve.shape}")
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    eps = curve + math.log(1.0 / d) / (lam - 1)
    best = int(np.argmin(eps))
    return float(eps[best]), float(lam[best])


def data_dependent_epsilon(vote_histograms, threshold: float, sigma1: float, sigma2: float, delta: float,
                           orders=DEFAULT_ORDERS, answered: Sequence[bool] | np.ndarray | None = None
                           ) -> DataDependentReport:
    """Confident-GNMax's data-dependent (epsilon, delta) on `vote_histograms` (queries x classes;
    row i: how many teachers voted each class on public query i). NOT DP by itself: see the module.

    Each query costs `rdp_threshold` plus, if answered, GNMax's `rdp_from_log_q(log_q_gnmax)`;
    `answered` (one bool per query: the realized noisy threshold outcomes) counts GNMax on the
    answered queries only; without it GNMax's cost is weighted by P[answered] (the expected cost).
    The curves add up over queries and convert with `epsilon_from_rdp`."""
    votes = check_vote_histograms(vote_histograms)
    lam = _orders(orders)
    sigma1, sigma2 = check_positive("threshold_sigma (sigma1)", sigma1), check_positive("vote_sigma (sigma2)", sigma2)
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise ConfigError(f"threshold must be a number, got {threshold!r}") from None
    if not math.isfinite(t):
        raise ConfigError(f"threshold must be finite, got {threshold}")
    if answered is not None:
        mask = np.asarray(answered)
        if mask.shape != (votes.shape[0],) or mask.dtype != bool:
            raise ConfigError(f"answered must be one bool per query ({votes.shape[0]}), got "
                              f"{mask.dtype} of shape {mask.shape}")
    rdp_thr = np.zeros_like(lam)
    rdp_gn = np.zeros_like(lam)
    count = 0.0
    for i, row in enumerate(votes):
        log_p = log_pr_answered(row, t, sigma1)
        rdp_thr += rdp_threshold(log_p, sigma1, lam)
        weight = float(mask[i]) if answered is not None else math.exp(log_p)
        count += weight
        if weight > 0:
            rdp_gn += weight * rdp_from_log_q(log_q_gnmax(row, sigma2), sigma2, lam)
    total = rdp_thr + rdp_gn
    epsilon, order = epsilon_from_rdp(lam, total, delta)
    for curve in (lam, total, rdp_thr, rdp_gn):
        curve.setflags(write=False)
    return DataDependentReport(epsilon, order, float(delta), int(votes.shape[0]), count, answered is None, lam,
                               total, rdp_thr, rdp_gn)


__all__ = [
    "DEFAULT_ORDERS", "DataDependentReport", "check_vote_histograms", "data_dependent_epsilon", "epsilon_from_rdp",
    "log_pr_answered",
    "log_q_gnmax", "rdp_from_log_q", "rdp_gaussian_data_independent", "rdp_threshold",
]
