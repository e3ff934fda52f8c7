"""Composition of privacy events into epsilon at delta, and noise calibration over an event family.

The one place where privacy numerics live. `compose(events, delta)` takes any list of events
(`dpcore.privacy.events`: dp-accounting's `DpEvent`s and ours) and returns a `Composition`;
`calibrate(family, target_epsilon, delta)` finds the smallest noise multiplier sigma with
`compose([family(sigma)], delta).epsilon <= target_epsilon`, like dp-accounting's
`calibrate_dp_mechanism`. Everything is add/remove-one-record neighbouring.

Events are reduced to steps: `SelfComposedDpEvent` multiplies counts, `ComposedDpEvent`
concatenates, `NoOpDpEvent` costs nothing, `NonPrivateDpEvent` (or a step with noise multiplier
0) makes epsilon infinite, and every other event is a step (optionally inside a
`PoissonSampledDpEvent`) of a registered kind (`STEP_KINDS`): "gaussian" (`GaussianDpEvent`,
Poisson-subsampled Gaussian mechanism), "rnm" (`ReportNoisyMaxDpEvent`, pure 1/sigma-DP,
amplified by sampling to log(1 + q (e^{1/sigma} - 1)), Tang et al. Theorems A.4, A.5) or
"laplace" (`LaplaceDpEvent`, scale sigma on an L1-sensitivity-1 sum, composed by its PLD). Steps
with the same (kind, sigma, q) are one group whose counts add up. A mechanism known only by a Renyi
guarantee at one order (`RenyiDpEvent`: PromptPATE's smooth-sensitivity release and its released cost) has
no PLD: those are added at their order and composed with the rest by `_compose_with_renyi`.

Three computations, one answer:

- Upper bound: prv-accountant 0.2.0 (Gopi et al. 2021; Tang et al. Theorem A.3), one privacy
  random variable per group composed heterogeneously; its eps_error is 1% of epsilon (between
  1e-3 and 0.01), its (lower, estimate, upper) are reported.
- Cross-check: dp-accounting's privacy loss distributions (pessimistic, "connect the dots"
  for the Gaussian; an upper bound at any discretisation), composed the same way. When every
  step is pure DP with one epsilon', the interval is epsilon' itself, so the loss values lie
  on the grid and the PLD composition is exact.
- Exact closed form where one exists: the T-fold composition of randomised response with
  epsilon', which dominates any epsilon'-DP step (Kairouz et al. 2015), when every step is
  pure DP with one epsilon'.

`epsilon` is the largest of the values computed (all upper bounds), and never above the pure
bound sum(T * epsilon') when every step is pure DP (that is a valid (epsilon, delta) bound for
any delta). One cross-check tolerance (`CROSSCHECK_TOLERANCE`, 2%, or 1e-3 absolute):
prv-accountant's estimate and the PLD agree within it; before a disagreement is declared the
PLD is refined ten times finer. prv-accountant 0.2.0 is unreliable on pure-DP random variables
(grid truncation) and at large epsilon ("Discrete mean differs from continuous mean",
microsoft/prv_accountant#36, fixed by microsoft/prv_accountant#38 after the 0.2.0 release): when it fails or
disagrees and the exact form exists, the cross-check passes only if the PLD agrees with the
exact composition. Every failure or disagreement is a warning; nothing is hidden.

Every distinct (kind, sigma, q) group is composed as it is: no merging, no worst-case rounding (a
ledger of months of scheduled regenerations is exactly the heterogeneous case, and a looser bound
wastes the user's budget). dp-accounting's PLD composes heterogeneous groups directly (100 distinct
groups in seconds, `benchmarks/bench_ledger.py`). prv-accountant is the cross-check up to
PRV_MAX_GROUPS distinct groups; beyond, its cost grows too fast (about 30 s at 30 groups), and the
cross-check is dp-accounting's RDP bound, an independent upper bound the PLD must not exceed (it
cannot catch a PLD that is too small, which prv-accountant can: said in the composition's notes).
Where prv-accountant fails, the composition says so and is not marked agreed. Speed guards, each of which only makes the bound
larger and adds a warning: prv-accountant's eps_error is doubled (up to PRV_EPS_ERROR_LIMIT) while
its grid would exceed PRV_MAX_GRID_POINTS, and prv-accountant is skipped beyond (the PLD answers);
the PLD interval grows with the privacy-loss range.

Answers are remembered in memory and on disk (`dpcore.privacy.memo`, keyed by the groups, delta and a digest
of this code): a scheduled rerun's calibrations and the ledger's repeated compositions are read back. This
module imports prv-accountant and dp-accounting only when it computes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.errors import ConfigError, check_positive
from dpcore.privacy import memo

logger = logging.getLogger(__name__)

CROSSCHECK_TOLERANCE = 0.02      # relative disagreement of prv-accountant's estimate and the PLD that raises a flag
CROSSCHECK_ABS_FLOOR = 1e-3      # ... or this absolute difference, whichever is larger
PRV_EPS_ERROR_MAX = 0.01         # prv-accountant eps_error (absolute): 1% of epsilon below epsilon = 1 ...
PRV_EPS_ERROR_MIN = 1e-3         # ... and never below this
PRV_EPS_ERROR_LIMIT = 0.16       # grid guard: eps_error is doubled up to this, then prv-accountant is skipped
PRV_MAX_GRID_POINTS = 4_000_000  # larger prv-accountant grids (only at vacuous epsilons) are not built
PLD_INTERVAL = 1e-3              # dp-accounting value discretisation interval
PLD_INTERVAL_FINE_FACTOR = 10    # ... refined this much before a disagreement is declared
PLD_INTERVAL_COARSE = 5e-3       # ... coarse, for the calibration's first pass only
PLD_MAX_RANGE_POINTS = 40_000    # the interval grows with the privacy-loss range beyond this many points
PRV_MAX_GROUPS = 8               # more distinct events: prv-accountant (30 s at 30 events) gives way to RDP
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512])
SIGMA_TOLERANCE = 1e-3           # calibration: bisection until the sigma bracket is this narrow
SIGMA_MIN, SIGMA_MAX = 0.01, 1e4  # calibration search range (sigma is never searched below SIGMA_MIN)
# The largest finite epsilon dpicl plans a run for or takes as a budget: beyond it a guarantee is vacuous
# (epsilon = inf, sigma = 0, is the non-private baseline).
MAX_EPSILON = 100.0

NONPRIVATE = "nonprivate"
Group = tuple[str, float, float, int]  # (step kind, noise multiplier sigma, sampling rate q, steps)


@dataclass(frozen=True)
class Composition:
    """The composed privacy loss of some events at one delta. None: not computed (see warnings)."""

    epsilon: float                     # the reported upper bound; inf if any event is non-private
    delta: float
    epsilon_prv: float | None          # prv-accountant upper bound
    epsilon_pld: float | None          # dp-accounting PLD (pessimistic: an upper bound)
    crosscheck_agreed: bool
    warnings: tuple[str, ...] = ()
    epsilon_lower: float | None = None     # prv-accountant lower bound
    epsilon_estimate: float | None = None  # prv-accountant estimate
    epsilon_exact: float | None = None     # exact closed form (randomised response), where one exists
    epsilon_pure: float = math.inf         # sum of T * epsilon' when every step is pure DP (delta = 0)
    prv_eps_error: float | None = None     # the eps_error prv-accountant ran with


@dataclass(frozen=True)
class Calibration:
    """The smallest noise multiplier (to the tolerance) whose composition meets the target."""

    noise_multiplier: float
    composition: Composition
    evaluations: int                   # full compositions computed
    seconds: float


# ---------------------------------------------------------------------------------------------
# Step kinds (the registry)


def rnm_step_epsilon(noise_multiplier: float, sampling_rate: float) -> float:
    """epsilon' = log(1 + q (e^{1/sigma} - 1)): one report-noisy-max step, amplified by Poisson
    sampling (Tang et al. Theorem A.5).

    Per-step pure epsilon_0 = 1/sigma (exponential noise of scale 2 sigma, L_inf sensitivity 1,
    Theorem A.4); sigma = 0 is math.inf. Computed stably for large epsilon_0."""
    try:
        sigma, q = float(noise_multiplier), float(sampling_rate)
    except (TypeError, ValueError):
        raise ConfigError(f"noise_multiplier and sampling_rate must be numbers, got {noise_multiplier!r}, "
                          f"{sampling_rate!r}") from None
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if sigma == 0:
        return math.inf
    eps0 = 1.0 / sigma
    if eps0 > 30:  # 1 + q(e^a - 1) = e^a (q + (1 - q) e^-a)
        return eps0 + math.log(q + (1.0 - q) * math.exp(-eps0))
    return math.log1p(q * math.expm1(eps0))


def _gaussian_prv(sigma: float, q: float):
    from prv_accountant.privacy_random_variables import GaussianMechanism, PoissonSubsampledGaussianMechanism

    if q >= 1.0:
        return GaussianMechanism(noise_multiplier=sigma)
    return PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)


@functools.lru_cache(maxsize=64)  # PLDs are immutable; calibration and every ledger composition repeat them
def _gaussian_pld(sigma: float, q: float, interval: float):
    """dp-accounting's `from_gaussian_mechanism(sigma, sensitivity=1, sampling_prob=q)`, pessimistic and
    connect-the-dots (Doroshenko et al. 2022, Algorithm 1), assembled from its own parts: its
    `GaussianPrivacyLoss` gives the grid's bounds and the mixtures' CDFs, its `pld_pmf` discretises, and only
    the hockey-stick divergences at the grid's epsilons are computed here (`_gaussian_hockey_stick`), as one
    array expression where dp-accounting 0.6.0 makes one Python call per grid point. The same PMFs bit for bit,
    about 7x faster."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType

    remove = _gaussian_pmf(sigma, q, interval, AdjacencyType.REMOVE)
    if q == 1.0:  # add and remove are the same distribution
        return pld_lib.PrivacyLossDistribution(remove)
    return pld_lib.PrivacyLossDistribution(remove, _gaussian_pmf(sigma, q, interval, AdjacencyType.ADD))


def _gaussian_pmf(sigma: float, q: float, interval: float, adjacency):
    """One side's PMF, as `privacy_loss_distribution._create_pld_pmf_from_monotone_privacy_loss` builds a
    continuous mechanism's: deltas at every multiple of `interval` between the connect-the-dots bounds."""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    loss = GaussianPrivacyLoss(sigma, sensitivity=1.0, pessimistic_estimate=True, log_mass_truncation_bound=-50,
                               sampling_prob=q, adjacency_type=adjacency)
    bounds = loss.connect_dots_bounds()
    upper = math.ceil(bounds.epsilon_upper / interval)
    lower = math.floor(bounds.epsilon_lower / interval)
    deltas = _gaussian_hockey_stick(loss, sigma, q, np.arange(lower, upper + 1) * interval)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(interval, lower, upper, deltas)


def _gaussian_hockey_stick(loss, sigma: float, q: float, epsilons: np.ndarray) -> np.ndarray:
    """`loss.get_delta_for_epsilon(epsilons)` (dp-accounting's `AdditiveNoisePrivacyLoss`) with its per-epsilon
    `inverse_privacy_loss` written as array operations in the same order: delta(eps) = mu_upper_cdf(x) -
    e^eps mu_lower_cdf(x) at the largest x whose privacy loss is at least eps."""
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType

    add = loss.adjacency_type == AdjacencyType.ADD
    deltas = np.zeros_like(epsilons, dtype=float)
    if q == 1.0:
        inverse = np.full_like(epsilons, True, dtype=bool)
    elif add:  # the divergence is 0 from eps = -log(1 - q) on
        inverse = epsilons < -math.log1p(-q)
    else:      # ... and 1 - e^eps up to eps = log(1 - q)
        inverse = epsilons > math.log1p(-q)
        deltas[~inverse] = -np.expm1(epsilons[~inverse])
    eps = epsilons[inverse]
    x = np.empty_like(eps)
    if q == 1.0:
        close = np.zeros_like(eps, dtype=bool)
    else:  # math.isclose(eps, the edge): the inverse of an infinite loss
        edge = -math.log(1 - q) if add else math.log(1 - q)
        close = np.abs(eps - edge) <= 1e-9 * np.maximum(np.abs(eps), abs(edge))
        x[close] = -math.inf if add else math.inf
    x[~close] = _gaussian_inverse_loss(eps[~close], sigma, q, add)
    deltas[inverse] = loss.mu_upper_cdf(x) - np.exp(eps + loss.mu_lower_log_cdf(x))
    return np.clip(deltas, 0, 1)


def _gaussian_inverse_loss(eps: np.ndarray, sigma: float, q: float, add: bool) -> np.ndarray:
    """The largest x whose subsampled-Gaussian privacy loss is at least eps (dp-accounting's
    `_inverse_privacy_loss_add`/`_remove` and `common.log_a_times_exp_b_plus_c`, elementwise): the loss
    without subsampling is log(1 + (e^{+-eps} - 1) / q), then x = -1/2 - loss sigma^2 (plus 1 for add: the
    sensitivity)."""
    if q == 1.0:
        unsampled = eps
    else:
        a, c = 1 / q, 1 - 1 / q
        b = -eps if add else eps
        d = b + np.log(a)
        log_minus_c = np.log(-c)
        if np.any(log_minus_c >= d):
            raise ValueError("privacy loss outside the subsampled mechanism's range")
        unsampled = np.where(b == 0, np.log(a + c), d + np.log1p(-np.exp(log_minus_c - d)))
        if add:
            unsampled = -unsampled
    x = -0.5 - unsampled * sigma ** 2
    return 1.0 + x if add else x


def _rnm_prv(sigma: float, q: float):
    from prv_accountant.privacy_random_variables import PureDPMechanism

    return PureDPMechanism(eps=rnm_step_epsilon(sigma, q))


def _rnm_pld(sigma: float, q: float, interval: float):
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    return pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(rnm_step_epsilon(sigma, q), 0.0),
                                           value_discretization_interval=interval)


def _laplace_prv(sigma: float, q: float):
    from prv_accountant.privacy_random_variables import LaplaceMechanism

    if q < 1.0:  # the PLD composes it alone (the failure is a note)
        raise ValueError("prv-accountant 0.2.0 has no Poisson-subsampled Laplace mechanism")
    return LaplaceMechanism(mu=1.0 / sigma)


def _laplace_pld(sigma: float, q: float, interval: float):
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    return pld_lib.from_laplace_mechanism(parameter=sigma, sensitivity=1.0, sampling_prob=q,
                                          pessimistic_estimate=True, value_discretization_interval=interval)


@dataclass(frozen=True)
class StepKind:
    """How the accountants read one kind of step: its privacy random variable (prv-accountant),
    its privacy loss distribution (dp-accounting) and, for pure-DP steps, its epsilon."""

    name: str
    event_type: str                                    # the event class's name in dpcore.privacy.events
    prv: Callable[[float, float], Any]                 # (sigma, q) -> PrivacyRandomVariable
    pld: Callable[[float, float, float], Any]          # (sigma, q, interval) -> PrivacyLossDistribution
    pure_epsilon: Callable[[float, float], float] | None = None  # (sigma, q) -> per-step pure epsilon


STEP_KINDS: dict[str, StepKind] = {
    "gaussian": StepKind("gaussian", "GaussianDpEvent", _gaussian_prv, _gaussian_pld),
    "rnm": StepKind("rnm", "ReportNoisyMaxDpEvent", _rnm_prv, _rnm_pld, rnm_step_epsilon),
    # Laplace noise of scale sigma on a sum of L1 sensitivity 1 (dp-accounting's LaplaceDpEvent). Pure
    # 1/sigma-DP, but not marked pure: its PLD is tighter than the randomised-response bound.
    "laplace": StepKind("laplace", "LaplaceDpEvent", _laplace_prv, _laplace_pld),
}


# ---------------------------------------------------------------------------------------------
# Events -> groups


def groups(events: Iterable) -> tuple[Group, ...]:
    """The steps of `events` as (kind, sigma, q, total steps) per distinct (kind, sigma, q), in a
    stable order; any non-private event gives the single group (NONPRIVATE, 0.0, 1.0, 1)."""
    from dpcore.privacy import events as ev

    kinds = {getattr(ev, kind.event_type): name for name, kind in STEP_KINDS.items()}
    totals: dict[tuple[str, float, float], int] = {}
    nonprivate = False

    def visit(event, count: int) -> None:
        nonlocal nonprivate
        if count == 0 or isinstance(event, ev.NoOpDpEvent):
            return
        if isinstance(event, ev.NonPrivateDpEvent):
            nonprivate = True
            return
        if isinstance(event, ev.SelfComposedDpEvent):
            if isinstance(event.count, bool) or int(event.count) != event.count or event.count < 0:
                raise ConfigError(f"SelfComposedDpEvent count must be an integer >= 0, got {event.count!r}")
            visit(event.event, count * int(event.count))
            return
        if isinstance(event, ev.ComposedDpEvent):
            for item in event.events:
                visit(item, count)
            return
        q, step = 1.0, event
        if isinstance(event, ev.PoissonSampledDpEvent):
            q, step = float(event.sampling_probability), event.event
            if not 0.0 <= q <= 1.0:
                raise ConfigError(f"sampling_probability must be in [0, 1], got {event.sampling_probability}")
            if q == 0.0 or isinstance(step, ev.NoOpDpEvent):
                return
            if isinstance(step, ev.NonPrivateDpEvent):
                nonprivate = True
                return
        kind = kinds.get(type(step))
        if kind is None:
            raise ConfigError(f"cannot account for {event!r}: supported steps are "
                              f"{', '.join(k.event_type for k in STEP_KINDS.values())}, optionally Poisson-sampled")
        sigma = float(step.noise_multiplier)
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {step.noise_multiplier}")
        if sigma == 0:
            nonprivate = True
            return
        totals[(kind, sigma, q)] = totals.get((kind, sigma, q), 0) + count

    for item in events:
        visit(item, 1)
    if nonprivate:
        return ((NONPRIVATE, 0.0, 1.0, 1),)
    return tuple((m, s, q, n) for (m, s, q), n in sorted(totals.items()))


def step_groups(events: Iterable) -> tuple[Group, ...]:
    """`groups` of the events' steps, the Renyi guarantees and bound failure probabilities set aside (each
    checked as it is set aside): ConfigError for any event the accountants cannot compose."""
    return groups(split_renyi(split_bound_failures(events)[0])[0])


def _pure_epsilons(groups: Sequence[Group]) -> list[float] | None:
    """Per-group pure step epsilons, or None when some step is not pure DP."""
    values = []
    for kind, sigma, q, _ in groups:
        pure = STEP_KINDS[kind].pure_epsilon
        if pure is None:
            return None
        values.append(pure(sigma, q))
    return values


# ---------------------------------------------------------------------------------------------
# The accountants


def _prv_eps_error(epsilon_guess: float) -> float:
    """prv-accountant's eps_error: 0.01, or 1% of epsilon below epsilon = 1 (at least 1e-3)."""
    return min(PRV_EPS_ERROR_MAX, max(PRV_EPS_ERROR_MIN, 0.01 * epsilon_guess))


def _delta_error(delta: float) -> float:
    return delta / 1000


def _prv_variables(groups: Sequence[Group]) -> tuple[list, list[int]]:
    return [STEP_KINDS[kind].prv(sigma, q) for kind, sigma, q, _ in groups], [int(n) for *_, n in groups]


# The RDP orders where the safe domain is read: 22 of the 151 of prv-accountant's own RDP accountant (its
# `other_accountants.RDP` default). A subset gives an RDP bound at least as large, so a domain at least as wide:
# still safe, and at most about 3% wider (a grid that much finer), for a seventh of the cost: the fractional
# orders are numerical series, 0.1-0.3 s a step kind at every calibration's fresh sigma
# (`benchmarks/bench_accounting.py`).
_SAFE_DOMAIN_ORDERS = np.array([1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0,
                                12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 63], dtype=float)


@functools.lru_cache(maxsize=1024)
def _rdp_curve(kind: str, sigma: float, q: float) -> np.ndarray:
    """One step's RDP at `_SAFE_DOMAIN_ORDERS`, from its privacy random variable. Cached: every ledger
    composition repeats the entries before it."""
    prv = STEP_KINDS[kind].prv(sigma, q)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        curve = np.array([prv.rdp(order) for order in _SAFE_DOMAIN_ORDERS])
    curve.setflags(write=False)
    return curve


def _rdp_epsilon(rdp: np.ndarray, delta: float) -> float:
    """The RDP-to-(epsilon, delta) conversion prv-accountant's safe domain uses (its RDP accountant)."""
    orders = _SAFE_DOMAIN_ORDERS
    with np.errstate(all="ignore"):
        eps = rdp - np.log(delta * orders) / (orders - 1) + np.log1p(-1 / orders)
    return float(eps[np.nanargmin(eps)])


def _safe_domain(groups: Sequence[Group], delta: float) -> float:
    """prv-accountant's safe privacy-loss domain half-width L (its remark 5.6: the RDP bound of the whole
    composition at delta_error / 4 and of each single step at delta_error / (8 T), plus 3), computed as
    `prv_accountant.accountant.compute_safe_domain_size` does, from cached per-step RDP curves at fewer orders
    (`_SAFE_DOMAIN_ORDERS`: never narrower)."""
    curves = [_rdp_curve(kind, sigma, q) for kind, sigma, q, _ in groups]
    counts = [int(n) for *_, n in groups]
    delta_error = _delta_error(delta)
    total = sum(curve * n for curve, n in zip(curves, counts, strict=True))
    widest = _rdp_epsilon(total, delta_error / 4)
    for curve in curves:
        widest = max(widest, _rdp_epsilon(curve, delta_error / 8 / sum(counts)))
    return max(widest, PRV_EPS_ERROR_MAX) + 3


def _grid_points(domain: float, eps_error: float, steps: int, delta: float) -> tuple[float, float]:
    """(half width, number of points) of the grid prv-accountant builds (its Theorem 5.5 mesh), the half width
    widened from the safe domain to the nearest grid whose length is a fast FFT length.

    prv-accountant's grid on [-L, L] with mesh m (`Domain.create_aligned`) has 2 (ceil(L / m) + 1) points,
    and its composition runs a real FFT and its inverse of that length: at a length with a large prime
    factor (2 x 39799 for 100 steps at sigma 0.61, q 0.01) they take about 0.14 s, at the next
    2^a 3^b 5^c length 0.003 s. A wider domain only truncates less of the privacy loss: still valid."""
    half_width = max(domain, eps_error + 3)
    mesh = eps_error / math.sqrt(steps / 2 * math.log(12 / _delta_error(delta)))
    cells = fast_fft_length(2 * (math.ceil(half_width / mesh + 0.5) + 1)) // 2 - 1
    # (cells - 1/2) m: ceil(L / m) is `cells` whatever the last bit of prv-accountant's own mesh
    return (cells - 0.5) * mesh, 2 * (cells + 1)


def fast_fft_length(n: int) -> int:
    """The smallest even 2^a 3^b 5^c >= n: a length pocketfft transforms without Bluestein's algorithm (twice
    SciPy's next 5-smooth real-FFT length for half of n)."""
    from scipy.fft import next_fast_len  # scipy loads with the accountants, not with this module

    return 2 * next_fast_len(-(-n // 2), real=True)


def _prv_epsilon(groups: Sequence[Group], delta: float, eps_error: float,
                 half_width: float) -> tuple[float, float, float]:
    """prv-accountant (lower, estimate, upper) on the domain [-half_width, half_width]; raises on failure."""
    from prv_accountant import PRVAccountant

    prvs, counts = _prv_variables(groups)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the eps_max notice: half_width is the safe domain size
        accountant = PRVAccountant(prvs=prvs, max_self_compositions=counts, eps_error=eps_error,
                                   delta_error=_delta_error(delta), eps_max=half_width)
        lower, estimate, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=counts)
    lower, estimate, upper = float(lower), float(estimate), float(upper)
    if not all(math.isfinite(v) for v in (lower, estimate, upper)):
        raise RuntimeError(f"non-finite result ({lower}, {estimate}, {upper})")
    return max(lower, 0.0), max(estimate, 0.0), max(upper, 0.0)


def _pld_epsilon(groups: Sequence[Group], delta: float, interval: float) -> float:
    """dp-accounting PLD epsilon of the groups composed (pessimistic: an upper bound)."""
    composed = None
    for kind, sigma, q, steps in groups:
        one = STEP_KINDS[kind].pld(sigma, q, interval).self_compose(int(steps))
        composed = one if composed is None else composed.compose(one)
    epsilon = float(composed.get_epsilon_for_delta(delta))
    if math.isnan(epsilon):
        raise RuntimeError("dp-accounting PLD returned nan")
    return max(epsilon, 0.0)


def _rdp_bounds_pld(groups: Sequence[Group], delta: float, pld: float, notes: list[str]) -> bool:
    """The cross-check beyond PRV_MAX_GROUPS: dp-accounting's RDP bound (an independent analysis, an upper
    bound on epsilon) is not below the PLD's."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    accountant = rdp.RdpAccountant(list(RDP_ORDERS))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            logging.getLogger("absl").setLevel(logging.ERROR)  # orders that do not converge are skipped
            for kind, sigma, q, steps in groups:
                step = (dp_event.GaussianDpEvent(sigma) if kind == "gaussian"
                        else dp_event.LaplaceDpEvent(sigma) if kind == "laplace"
                        else dp_event.EpsilonDeltaDpEvent(rnm_step_epsilon(sigma, 1.0), 0.0))
                accountant.compose(step if q >= 1.0 else dp_event.PoissonSampledDpEvent(q, step), int(steps))
            bound = float(accountant.get_epsilon(delta))
    except Exception as exc:  # noqa: BLE001 - any accountant failure is reported, never hidden
        notes.append(f"prv-accountant skipped ({len(groups)} distinct events); the RDP cross-check failed "
                     f"({type(exc).__name__}: {exc}); epsilon from dp-accounting PLD alone")
        return False
    agreed = pld <= bound * (1 + 1e-9) + CROSSCHECK_ABS_FLOOR
    notes.append(f"{len(groups)} distinct events: prv-accountant skipped (its cost grows with each); dp-accounting "
                 f"PLD {_fmt(pld)} {'is within' if agreed else 'EXCEEDS'} the RDP upper bound {_fmt(bound)}")
    return agreed


def _randomized_response_epsilon(step_epsilon: float, steps: int, delta: float) -> float:
    """Exact epsilon(delta) of T-fold randomised response with epsilon'.

    Randomised response dominates every epsilon'-DP mechanism (Kairouz et al. 2015), and its
    T-fold privacy loss is epsilon' (2K - T) with K ~ Binomial(T, e^eps'/(1 + e^eps')), so
    delta(epsilon) = E[(1 - e^(epsilon - L))_+] is computed in closed form and inverted."""
    from scipy.optimize import brentq
    from scipy.stats import binom

    k = np.arange(steps + 1)
    loss = step_epsilon * (2.0 * k - steps)
    pmf = np.exp(binom.logpmf(k, steps, 1.0 / (1.0 + math.exp(-step_epsilon))))

    def delta_at(epsilon: float) -> float:
        above = loss > epsilon
        return float(np.sum(pmf[above] * -np.expm1(epsilon - loss[above])))

    if delta_at(0.0) <= delta:
        return 0.0
    return float(brentq(lambda e: delta_at(e) - delta, 0.0, steps * step_epsilon, xtol=1e-12))


def _disagreement(a: float, b: float) -> float:
    """Relative difference of two epsilons, 0 when within the absolute floor."""
    diff = abs(a - b)
    if diff <= CROSSCHECK_ABS_FLOOR:
        return 0.0
    return diff / max(a, b)


def _fmt(value: float) -> str:
    return f"{value:.4f}"


# ---------------------------------------------------------------------------------------------
# Composition


def _check_delta(delta: Any) -> float:
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise ConfigError(f"delta: must be a number in (0, 1), got {delta!r}") from None
    if not 0.0 < value < 1.0:
        raise ConfigError(f"delta: must be in (0, 1), got {delta}")
    return value


def compose(events: Iterable, delta: float, *, cache: bool | Path = True) -> Composition:
    """Epsilon at `delta` of all `events` composed (any order, adaptively): the module docstring. Events
    known only by a Renyi guarantee (`RenyiDpEvent`) are composed by `_compose_with_renyi`; the failure
    probabilities of data-dependent bounds (`BoundFailureDpEvent`) are taken out of delta first.

    `cache`: remember the answer in memory and on disk (`dpcore.privacy.memo`: True, the home's cache; a
    folder, that one), keyed by the events' steps and delta; False computes it afresh."""
    events, failure = split_bound_failures(events)
    if failure:
        return _compose_with_failures(events, failure, _check_delta(delta), cache)
    others, renyi = split_renyi(events)
    if renyi:
        return _compose_with_renyi(others, renyi, _check_delta(delta), cache)
    steps, d = groups(others), _check_delta(delta)
    if cache is False:
        return _compose_groups(steps, d)
    return _compose_cached(steps, d, _memo_folder(cache))


# ---------------------------------------------------------------------------------------------
# Failure probabilities of data-dependent bounds


def _split_out(events: Iterable, kind: type, take: Callable[[Any, int], None], what: str) -> list:
    """The events with every `kind` event taken out (`take(event, count)` receives each, with how many times
    it composes: a self-composition multiplies); nested compositions are followed. A `kind` event inside any
    other wrapper (a sampled event) is refused: no amplification theorem is applied to it."""
    from dpcore.privacy import events as ev

    others: list = []

    def holds(event) -> bool:
        if isinstance(event, kind):
            return True
        if isinstance(event, ev.ComposedDpEvent):
            return any(holds(item) for item in event.events)
        inner = getattr(event, "event", None)
        return isinstance(inner, ev.DpEvent) and holds(inner)

    def visit(event, count: int) -> None:
        if not holds(event):
            if count:
                others.append(event if count == 1 else ev.SelfComposedDpEvent(event, count))
            return
        if isinstance(event, kind):
            take(event, count)
        elif isinstance(event, ev.ComposedDpEvent):
            for item in event.events:
                visit(item, count)
        elif isinstance(event, ev.SelfComposedDpEvent):
            if isinstance(event.count, bool) or int(event.count) != event.count or event.count < 0:
                raise ConfigError(f"SelfComposedDpEvent count must be an integer >= 0, got {event.count!r}")
            visit(event.event, count * int(event.count))
        else:
            raise ConfigError(f"cannot account for {what} inside {type(event).__name__}: only compositions of it "
                              "are supported")

    for item in events:
        visit(item, 1)
    return others


def split_bound_failures(events: Iterable) -> tuple[list, float]:
    """(the events with every `BoundFailureDpEvent` taken out, the sum of their probabilities)."""
    from dpcore.privacy import events as ev

    total = 0.0

    def take(event, count: int) -> None:
        nonlocal total
        probability = float(event.probability)
        if not (math.isfinite(probability) and 0.0 <= probability < 1.0):
            raise ConfigError(f"BoundFailureDpEvent probability must be in [0, 1), got {event.probability!r}")
        total += count * probability

    others = _split_out(events, ev.BoundFailureDpEvent, take, "a bound's failure probability")
    return others, total


def _compose_with_failures(others: list, failure: float, delta: float, cache: bool | Path) -> Composition:
    """Events beside failure probabilities summing to `failure`: each is (0, p)-DP, so by basic composition
    the rest converted at delta - failure is an (epsilon, delta) bound for them all; infinite when the
    failures leave no delta."""
    note = f"failure probability {failure:.3g} of data-dependent bounds added to delta"
    if failure >= delta:
        return Composition(math.inf, delta, math.inf, math.inf, True,
                           (note + f": it is not below delta {delta:.3g}, so epsilon is infinite",),
                           epsilon_lower=math.inf, epsilon_estimate=math.inf)
    rest = compose(others, delta - failure, cache=cache)
    return dataclasses.replace(rest, delta=delta, warnings=(*rest.warnings, note))


# ---------------------------------------------------------------------------------------------
# Renyi guarantees


def split_renyi(events: Iterable) -> tuple[list, dict[float, float]]:
    """(the events with every `RenyiDpEvent` taken out, {order: the summed epsilon of the Renyi guarantees at
    that order}); a Renyi guarantee inside a sampled event is refused (`_split_out`)."""
    from dpcore.privacy import events as ev

    renyi: dict[float, float] = {}

    def take(event, count: int) -> None:
        order, epsilon = float(event.order), float(event.epsilon)
        if not (math.isfinite(order) and order > 1):
            raise ConfigError(f"RenyiDpEvent order must be a finite number > 1, got {event.order!r}")
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ConfigError(f"RenyiDpEvent epsilon must be a finite number >= 0, got {event.epsilon!r}")
        renyi[order] = renyi.get(order, 0.0) + count * epsilon

    others = _split_out(events, ev.RenyiDpEvent, take, "a Renyi guarantee")
    return others, renyi


def renyi_epsilon(rdp: float, order: float, delta: float) -> float:
    """(order, rdp)-RDP as (epsilon, delta)-DP: rdp + log(1 - 1/order) - log(delta * order) / (order - 1)
    (Canonne, Kamath and Steinke 2020, Proposition 12; the conversion of dp-accounting's RDP accountant),
    never below 0."""
    return max(0.0, float(rdp) + math.log1p(-1.0 / order) - math.log(delta * order) / (order - 1.0))


def _rdp_at(others: Sequence, order: float, renyi: float, delta: float) -> float | None:
    """Everything composed in RDP at one order and converted once: dp-accounting's RDP accountant at that
    order alone, the others' steps as they are and the Renyi guarantee as its constant (a `ZCDpEvent` with
    rho 0 and xi = epsilon is (order, epsilon)-RDP at every order, so at this one). None where the
    accountant does not take a step (report-noisy-max)."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    accountant = rdp.RdpAccountant([order])
    for kind, sigma, q, steps in groups(others):
        if kind == NONPRIVATE:
            return math.inf
        if kind not in ("gaussian", "laplace"):
            return None
        step = dp_event.GaussianDpEvent(sigma) if kind == "gaussian" else dp_event.LaplaceDpEvent(sigma)
        accountant.compose(step if q >= 1.0 else dp_event.PoissonSampledDpEvent(q, step), int(steps))
    accountant.compose(dp_event.ZCDpEvent(rho=0.0, xi=renyi))
    return float(accountant.get_epsilon(delta))


def _compose_with_renyi(others: list, renyi: dict[float, float], delta: float, cache: bool | Path) -> Composition:
    """Events of which some are known only by Renyi guarantees, composed two ways, the smaller reported (both
    are upper bounds):

    - split: delta shared equally between the other events (composed by `compose`: PLD, prv-accountant) and
      each order's summed Renyi guarantee (converted by `renyi_epsilon`); the epsilons add up (basic
      composition of (epsilon_i, delta_i) guarantees);
    - together (one order only): every event in RDP at that order (`_rdp_at`), converted once at delta."""
    parts = len(renyi) + (1 if others else 0)
    share = delta / parts
    base = compose(others, share, cache=cache) if others else None
    notes = list(base.warnings) if base else []
    split = (base.epsilon if base else 0.0) + sum(renyi_epsilon(total, order, share) for order, total in renyi.items())
    candidates = [split]
    if len(renyi) == 1:
        ((order, total),) = renyi.items()
        together = _rdp_at(others, order, total, delta)
        if together is not None:
            candidates.append(together)
    epsilon = min(candidates)
    orders = ", ".join(f"{order:g}" for order in sorted(renyi))
    if parts == 1:
        notes.append(f"Renyi guarantee at order {orders} converted at delta (Canonne et al. 2020, Proposition 12)")
    else:
        notes.append(f"Renyi guarantees at order {orders} composed with the other events: delta split {parts} ways "
                     f"{_fmt(split)}" + (f", all in RDP at order {orders} {_fmt(candidates[1])}"
                                          if len(candidates) > 1 else "") + "; the smaller reported")
    # the cross-check is the other events' (their accountants at their share of delta); the Renyi part is
    # one closed form
    return Composition(float(epsilon), delta, None, None, base.crosscheck_agreed if base else True, tuple(notes))


def _memo_folder(cache: bool | Path) -> Path | None:
    """The folder of a `cache=` that is not False: None for True (the home's cache), else the one given."""
    return None if cache is True else Path(cache)


def _compose_groups(groups: tuple[Group, ...], delta: float) -> Composition:
    """Uncached composition of validated groups: the module docstring's three computations, the larger
    reported."""
    if not groups:
        return Composition(0.0, delta, 0.0, 0.0, True, epsilon_lower=0.0, epsilon_estimate=0.0, epsilon_pure=0.0)
    inf = math.inf
    if any(kind == NONPRIVATE or sigma <= 0 for kind, sigma, _, _ in groups):
        return Composition(inf, delta, inf, inf, True, ("noise_multiplier = 0 (no noise): epsilon is infinite",),
                           epsilon_lower=inf, epsilon_estimate=inf, epsilon_exact=inf)
    notes: list[str] = []
    pure, exact_step = _pure_bound(groups)
    try:  # the privacy-loss range (an RDP computation), for prv-accountant's grid and the PLD interval
        domain: float | None = _safe_domain(groups, delta)
        domain_failure = None
    except Exception as exc:  # noqa: BLE001 - any accountant failure is reported, never hidden
        domain, domain_failure = None, f"{type(exc).__name__}: {exc}"
    interval = exact_step if exact_step is not None else max(PLD_INTERVAL, (domain or 0.0) / PLD_MAX_RANGE_POINTS)
    pld: float | None
    try:
        pld = _pld_epsilon(groups, delta, interval)
    except Exception as exc:  # noqa: BLE001
        pld = None
        notes.append(f"dp-accounting PLD failed ({type(exc).__name__}: {exc})")
    eps_error = _prv_eps_error(pld if pld is not None else 1.0)
    prv, eps_error = _prv_upper(groups, delta, domain, domain_failure, eps_error, exact_step is not None, notes)
    exact = _exact_epsilon(exact_step, groups, delta, notes)
    if prv is not None and pld is not None and exact_step is None \
            and _disagreement(prv[1], pld) > CROSSCHECK_TOLERANCE / 2:
        try:  # rule out the PLD's own discretisation error before declaring a disagreement
            pld = _pld_epsilon(groups, delta, interval / PLD_INTERVAL_FINE_FACTOR)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"dp-accounting PLD refinement failed ({type(exc).__name__}: {exc})")
    agreed = _crosscheck(groups, delta, prv, pld, exact, exact_step is not None, notes)

    candidates = [v for v in ((prv[2] if prv else None), pld, exact) if v is not None and not math.isnan(v)]
    if candidates:
        epsilon = min(max(candidates), pure)  # T epsilon' is a valid (epsilon, delta) bound too
    else:
        epsilon = inf
        notes.append("no accountant could compose these events: epsilon is treated as infinite")
    return Composition(
        float(epsilon), delta, prv[2] if prv else None, pld, bool(agreed), tuple(notes),
        epsilon_lower=prv[0] if prv else None, epsilon_estimate=prv[1] if prv else None,
        epsilon_exact=None if math.isnan(exact) else exact, epsilon_pure=pure, prv_eps_error=eps_error,
    )


def _pure_bound(groups: Sequence[Group]) -> tuple[float, float | None]:
    """(sum of T * epsilon' when every step is pure DP, else inf; the one epsilon' of every step, when
    there is one: randomised response then composes exactly, and the PLD on the epsilon' grid is exact)."""
    pure_steps = _pure_epsilons(groups)
    if pure_steps is None:
        return math.inf, None
    pure = sum(e * n for e, (*_, n) in zip(pure_steps, groups, strict=True))
    return pure, (pure_steps[0] if len(set(pure_steps)) == 1 else None)


def _prv_upper(groups: Sequence[Group], delta: float, domain: float | None, domain_failure: str | None,
               eps_error: float, exact: bool, notes: list[str]) -> tuple[tuple[float, float, float] | None, float]:
    """prv-accountant's (lower, estimate, upper) under the grid guard (None: skipped or failed, said in
    `notes`), and the eps_error it ran with."""
    alone = "dp-accounting PLD and the exact composition" if exact else "dp-accounting PLD alone"
    failure, prv = domain_failure, None
    if domain is not None and len(groups) <= PRV_MAX_GROUPS:
        total = sum(n for *_, n in groups)
        first = eps_error
        half_width, points = _grid_points(domain, eps_error, total, delta)
        while points > PRV_MAX_GRID_POINTS and eps_error < PRV_EPS_ERROR_LIMIT:
            eps_error = min(2 * eps_error, PRV_EPS_ERROR_LIMIT)
            half_width, points = _grid_points(domain, eps_error, total, delta)
        if points > PRV_MAX_GRID_POINTS:
            notes.append(f"prv-accountant skipped: privacy-loss domain too large (L={half_width:.4g}, "
                         f"epsilon far beyond any meaningful guarantee); epsilon from {alone}")
        else:
            if eps_error > first:
                notes.append(f"prv-accountant eps_error raised from {first:.3g} to {eps_error:.3g} to bound its "
                             "grid (a looser, valid upper bound)")
            try:
                prv = _prv_epsilon(groups, delta, eps_error, half_width)
            except Exception as exc:  # noqa: BLE001
                failure = f"{type(exc).__name__}: {exc}"
    if failure is not None:
        notes.append(f"prv-accountant failed ({failure}); epsilon from {alone}")
    return prv, eps_error


def _exact_epsilon(exact_step: float | None, groups: Sequence[Group], delta: float, notes: list[str]) -> float:
    """The exact randomised-response composition when every step is pure epsilon'-DP (nan otherwise)."""
    if exact_step is None:
        return math.nan
    try:
        return _randomized_response_epsilon(exact_step, sum(n for *_, n in groups), delta)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"exact randomised-response composition failed ({type(exc).__name__}: {exc})")
        return math.nan


def _crosscheck(groups: Sequence[Group], delta: float, prv: tuple[float, float, float] | None, pld: float | None,
                exact: float, exact_form: bool, notes: list[str]) -> bool:
    """Whether two independent accountants agree: prv-accountant's estimate and the PLD within
    CROSSCHECK_TOLERANCE; failing that, the PLD and the exact composition; beyond PRV_MAX_GROUPS, the
    PLD within the RDP bound. Every disagreement is a note."""
    agreed = prv is not None and pld is not None and _disagreement(prv[1], pld) <= CROSSCHECK_TOLERANCE
    if prv is not None and pld is not None and not agreed:
        notes.append(
            f"accountants disagree by {_disagreement(prv[1], pld):.1%}: prv-accountant estimate {_fmt(prv[1])} "
            f"(upper {_fmt(prv[2])}) vs dp-accounting PLD {_fmt(pld)}; reporting the larger"
        )
    if not agreed and pld is not None and math.isfinite(exact):
        # prv-accountant is unreliable on pure-DP privacy random variables (its grid truncation and its
        # numerical mean of a step CDF); the exact composition is the independent second opinion.
        agreed = _disagreement(exact, pld) <= CROSSCHECK_TOLERANCE
        notes.append(f"dp-accounting PLD {_fmt(pld)} {'agrees' if agreed else 'DISAGREES'} with the exact "
                     f"randomised-response composition {_fmt(exact)}")
    if len(groups) > PRV_MAX_GROUPS and pld is not None and not exact_form:
        agreed = _rdp_bounds_pld(groups, delta, pld, notes)
    return agreed


@functools.lru_cache(maxsize=256)
def _compose_cached(groups: tuple[Group, ...], delta: float, folder: Path | None) -> Composition:
    """`_compose_groups`, remembered in memory and on disk (in `folder`; None: the home's cache)."""
    where, key = memo.folder(folder), memo.key("compose", groups=groups, delta=delta)
    stored = memo.get(where, key)
    if stored is not None:
        try:
            return Composition(**{**stored, "warnings": tuple(stored["warnings"])})
        except (KeyError, TypeError):
            pass
    result = _compose_groups(groups, delta)
    memo.put(where, key, dataclasses.asdict(result))
    return result


def _fast_epsilon_cached(groups: tuple[Group, ...], delta: float, folder: Path | None) -> float:
    """`_fast_epsilon`, remembered on disk (a calibration's first pass repeats on every scheduled run)."""
    where, key = memo.folder(folder), memo.key("fast", groups=groups, delta=delta)
    stored = memo.get(where, key)
    if stored is not None and isinstance(stored.get("epsilon"), float):
        return stored["epsilon"]
    epsilon = _fast_epsilon(groups, delta)
    memo.put(where, key, {"epsilon": float(epsilon)})
    return epsilon


def _fast_epsilon(groups: tuple[Group, ...], delta: float) -> float:
    """dp-accounting PLD alone on a coarse grid (capped by the pure bound): the calibration's first pass."""
    if not groups:
        return 0.0
    if any(kind == NONPRIVATE for kind, *_ in groups):
        return math.inf
    pure_steps = _pure_epsilons(groups)
    if pure_steps is not None and len(set(pure_steps)) == 1:
        return min(_pld_epsilon(groups, delta, pure_steps[0]), pure_steps[0] * sum(n for *_, n in groups))
    pure = math.inf if pure_steps is None else sum(e * n for e, (*_, n) in zip(pure_steps, groups, strict=True))
    return min(_pld_epsilon(groups, delta, PLD_INTERVAL_COARSE), pure)


# ---------------------------------------------------------------------------------------------
# Calibration


def _solve_fast(family: Callable[[float], Any], target: float, delta: float, sigma_min: float,
                sigma_max: float, cache: bool | Path = True) -> float:
    """sigma with the fast (PLD alone, coarse) epsilon of family(sigma) ~= target, to 1e-4.

    Brackets by doubling/halving from sigma = 1, then Brent's method on log epsilon."""
    from scipy.optimize import brentq

    def eps(sigma: float) -> float:
        steps = groups([family(sigma)])
        if cache is False:
            return _fast_epsilon(steps, delta)
        return _fast_epsilon_cached(steps, delta, _memo_folder(cache))

    lo, hi = 0.5, 1.0
    eps_lo, eps_hi = eps(lo), eps(hi)
    while eps_hi > target:
        lo, hi, eps_lo = hi, 2 * hi, eps_hi
        if hi > sigma_max:
            raise ConfigError(f"target_epsilon {target} is unreachable: even noise_multiplier {sigma_max:g} "
                              "does not reach it")
        eps_hi = eps(hi)
    while eps_lo <= target:
        if lo <= sigma_min:  # the target holds even at the smallest sigma searched
            return lo
        lo, hi, eps_hi = max(lo / 2, sigma_min), lo, eps_lo
        eps_lo = eps(lo)
    if eps_hi <= 0:
        return hi
    log_target = math.log(target)
    return float(brentq(lambda sigma: math.log(max(eps(sigma), 1e-300)) - log_target, lo, hi, xtol=1e-4))


def largest_count(fits: Callable[[int], bool], cap: int) -> int:
    """The largest n in [1, cap] with fits(n), for a `fits` that holds up to some n and fails beyond (epsilon grows
    with the number of steps): doubling, then bisection, O(log n) compositions; 0 when not even fits(1). The most
    queries or steps a budget affords (PromptPATE's queries, DP-ICL's draws)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2  # fits(lo); hi is tried next
    while hi <= cap and fits(hi):
        lo, hi = hi, 2 * hi
    if hi > cap:
        if fits(cap):
            return cap
        hi = cap
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def calibrate(family: Callable[[float], Any], target_epsilon: float, delta: float, *,
              tolerance: float = SIGMA_TOLERANCE, sigma_min: float = SIGMA_MIN, sigma_max: float = SIGMA_MAX,
              cache: bool | Path = True) -> Calibration:
    """The smallest sigma (to `tolerance`, absolute) with compose([family(sigma)], delta).epsilon <= target.

    `family` maps a noise multiplier to an event (e.g. `lambda s: tang_event("gaussian", s, q, T)`);
    its epsilon must fall as sigma grows. A first pass on dp-accounting alone (Brent's method on a
    coarse grid, aiming just below the target by prv-accountant's eps_error) places the bracket,
    then a walk and a bisection on the full composition (`compose`) shrink it to `tolerance`; the
    upper end is returned, so the guarantee holds, and family(sigma - tolerance) breaks the target.
    sigma is searched in [sigma_min, sigma_max]; `cache`: every composition remembered in memory and on
    disk (`compose`). Raises ConfigError for a bad input or an unreachable target."""
    target = check_positive("target_epsilon", target_epsilon)
    d = _check_delta(delta)
    started = time.perf_counter()
    margin = 1.2 * _prv_eps_error(target)  # prv's upper bound sits about eps_error above the estimate
    if target - margin <= 0:
        raise ConfigError(f"target_epsilon {target} is unreachable: below the accountants' resolution "
                          f"(about {margin:.2g})")
    guess = max(_solve_fast(family, target - margin, d, sigma_min, sigma_max, cache), sigma_min)
    evaluations = 0

    def full(sigma: float) -> Composition:
        nonlocal evaluations
        evaluations += 1
        return compose([family(sigma)], d, cache=cache)

    best = full(guess)
    hi = lo = guess
    step = tolerance
    if best.epsilon <= target:  # walk down until the lower end fails
        while True:
            lo = max(hi - step, sigma_min)
            if lo >= hi:
                break
            result = full(lo)
            if result.epsilon > target:
                break
            hi, best, step = lo, result, step * 2
    else:  # walk up until the upper end holds
        while best.epsilon > target:
            lo, hi, step = hi, hi + step, step * 2
            if hi > sigma_max:
                raise ConfigError(f"target_epsilon {target} is unreachable: even noise_multiplier {sigma_max:g} "
                                  "does not reach it")
            best = full(hi)
    # the walk's first step leaves hi - lo = tolerance up to rounding (0.5512 - 0.5502 > 0.001 in floats): a
    # bracket that wide is done, not bisected once more for a sigma no nearer than the tolerance promises
    while hi - lo > tolerance * (1 + 1e-9):
        mid = (lo + hi) / 2
        result = full(mid)
        if result.epsilon <= target:
            hi, best = mid, result
        else:
            lo = mid
    if best.epsilon > target:  # defensive: the loops above keep epsilon(hi) <= target
        raise ConfigError(f"target_epsilon {target} is unreachable (accountant resolution)")
    seconds = time.perf_counter() - started
    logger.debug("calibrated sigma %.4f for epsilon %s: %d full evaluations, %.1f s", hi, target, evaluations,
                 seconds)
    return Calibration(hi, best, evaluations, seconds)


__all__ = [
    "CROSSCHECK_TOLERANCE", "Calibration", "Composition", "STEP_KINDS", "StepKind", "calibrate", "compose",
    "groups", "rnm_step_epsilon",
]
