"""Privacy accounting for Algorithm 1 (Tang et al., Theorem 1 and Appendix A): epsilon of a
run, sigma calibration, and an independent cross-check.

This module is the paper-specific front: it validates the run's parameters, describes one
label's generation as an event (`dpcore.privacy.events.tang_event`), has it composed or
calibrated by `dpcore.privacy.composition` (where every accountant call lives), and caches the
resulting `PrivacyReport`s on disk. The ledger (`dpcore.privacy.ledger`) composes its entries'
events through the same module.

Neighbouring datasets: add/remove one private record (one (text, label) row of the train
split). Each token step draws the groups of the step by Poisson sampling of the label's
records with rate q = M*N/|D_y| (`sampling_rate`), so one record takes part in a step with
probability q; the accountant assumes exactly this sampler (the paper's fixed-size sampler
without replacement is dominated by the same pair under add/remove neighbours, so the bound
covers it too: proof in `dpcore.fewshot.sampling`).

Gaussian mechanism (Algorithm 1 line 12; Appendix A, proof of Theorem 1): each group's
next-token distribution is a probability vector, so adding or removing one record changes the
sum over groups by at most sqrt(2) in L2 norm. Adding N(0, 2 sigma^2 I) noise to that sum is a
Gaussian mechanism with noise multiplier sigma (std / sensitivity = sqrt(2) sigma / sqrt(2)).
One step is a Poisson-subsampled Gaussian mechanism; T = max_tokens x demos_per_label steps
(`SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)`) are composed numerically with the PRV accountant (Gopi et al. 2021; Theorem A.3) and cross-checked
with Google's dp-accounting PLD accountant (pessimistic "connect the dots" discretisation).

Report-noisy-max ("rnm", Algorithm 1 lines 15-19; Theorems A.4, A.5): `noise_multiplier`
sigma means exponential noise of scale (mean) 2*sigma on each coordinate of the group sum,
whose L_inf sensitivity is 1, so one step is pure epsilon_0 = 1/sigma DP for the sampled set
(`ReportNoisyMaxDpEvent(sigma)`). Subsampling amplifies it to epsilon' = log(1 + q (e^epsilon_0 - 1)) (Theorem A.5). T steps
compose to the pure bound T*epsilon' (`epsilon_pure`, delta = 0) and, numerically, to an
(epsilon, delta) bound: prv-accountant's PureDPMechanism(epsilon') composed T times, checked
against dp-accounting's PLD of an (epsilon', 0)-DP mechanism. Randomised response with
epsilon' dominates any epsilon'-DP step, and its T-fold composition is also computed exactly
(`epsilon_exact`, binomial closed form). prv-accountant 0.2.0 is unreliable on pure-DP random
variables (grid truncation; "Discrete mean differs" errors): when it fails or disagrees, the
cross-check passes only if the PLD agrees with the exact composition, and a warning says so.
The reported epsilon is never above the pure bound (an (epsilon', 0)-DP composition is
(T epsilon', delta)-DP for any delta).

Labels: the private set is partitioned by label and each label's generation reads only its
own records, so the labels compose in parallel: the epsilon of a run is the maximum over
labels, not the sum. One sigma serves the whole run, calibrated at the largest per-label
sampling rate (`calibrate_for_labels`). The per-label counts |D_y| (hence q) are treated as
public, as in the paper.

Reported numbers: `epsilon` is an upper bound: the larger of prv-accountant's upper bound and
the PLD value (both upper bounds). prv-accountant 0.2.0 has a known numerical bug at large
epsilon (microsoft/prv_accountant#36); when the two accountants' point values differ by more
than 2% (or prv-accountant raises), the larger is reported, `crosscheck_agreed` is False and a warning says why (rnm:
unless the PLD agrees with the exact composition, see above). The 2% tolerance, the
accountants' resolutions and their speed guards are `dpcore.privacy.composition`'s, shared with the ledger.
sigma = 0 means no noise: epsilon is math.inf everywhere, never a number.

Calibration results (and single evaluations), and the compositions behind them, are cached as JSON under
$DPICL_HOME/cache/accounting/ (`dpcore.privacy.memo`), keyed by every input, the accountant versions and
a digest of the accounting code.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from dpcore.display import fmt_delta, fmt_sigma
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.names import Mechanism, check_mechanism
from dpcore.privacy import composition, memo
from dpcore.privacy.composition import MAX_EPSILON, SIGMA_MAX, SIGMA_MIN, SIGMA_TOLERANCE, rnm_step_epsilon
from dpcore.privacy.memo import CacheDir

logger = logging.getLogger(__name__)

MAX_TARGET_EPSILON = MAX_EPSILON  # larger targets are vacuous; epsilon = inf (sigma = 0) is the baseline


@dataclass(frozen=True)
class PrivacyReport:
    """The privacy guarantee of one label's generation (and, at the largest q, of the run)."""

    mechanism: Mechanism
    noise_multiplier: float   # sigma; 0.0 means no noise (epsilon = inf)
    sampling_rate: float      # q = M*N/|D_y|
    steps: int                # T = max_tokens * demos_per_label
    delta: float
    epsilon: float            # upper bound (math.inf when sigma == 0); the larger of prv upper and PLD
    epsilon_lower: float      # prv-accountant lower bound (nan when prv-accountant was unavailable)
    epsilon_estimate: float   # prv-accountant estimate (nan when prv-accountant was unavailable)
    epsilon_crosscheck: float  # dp-accounting PLD
    crosscheck_agreed: bool
    warnings: tuple[str, ...]
    epsilon_pure: float = math.inf   # rnm: pure-DP bound T*epsilon' (delta = 0); gaussian: inf (none)
    step_epsilon: float = math.inf   # rnm: amplified per-step pure epsilon'; gaussian: inf (none)
    prv_eps_error: float = math.nan  # the eps_error prv-accountant ran with
    epsilon_exact: float = math.nan  # rnm: exact T-fold randomised-response composition; gaussian: nan

    def _key(self) -> tuple:
        return tuple(None if isinstance(v, float) and math.isnan(v) else v
                     for v in (getattr(self, f.name) for f in fields(self)))

    def __eq__(self, other: object) -> bool:  # nan fields (quantities not computed) compare equal
        if not isinstance(other, PrivacyReport):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyReport:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["warnings"] = tuple(values.get("warnings") or ())
        return cls(**values)


# ---------------------------------------------------------------------------------------------
# Inputs


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"{flag(name)} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ConfigError(f"{flag(name)} must be an integer >= {minimum}, got {value}")
    return value


def _check_float(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(number):
        raise ConfigError(f"{name} must be a number, got nan")
    return number


def _check_common(sampling_rate: Any, steps: Any, delta: Any, mechanism: str) -> tuple[float, int, float, str]:
    q = _check_float("sampling_rate", sampling_rate)
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"sampling_rate must be in (0, 1], got {q}")
    t = _check_int("steps", steps, 1)
    d = _check_float("delta", delta)
    if not 0.0 < d < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {d}")
    return q, t, d, check_mechanism(mechanism)


def _check_noise_multiplier(noise_multiplier: Any) -> float:
    sigma = _check_float("noise_multiplier", noise_multiplier)
    if sigma < 0 or math.isinf(sigma):
        raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {sigma}")
    return sigma


def sampling_rate(num_subsets: int, subset_size: int, label_count: int) -> float:
    """q = M*N/|D_y|: the Poisson rate at which one record of label y joins a token step."""
    m = _check_int("num_subsets", num_subsets, 1)
    n = _check_int("subset_size", subset_size, 1)
    count = _check_int("label_count", label_count, 1)
    if m * n > count:
        raise ConfigError(
            f"{flag('num_subsets')} x {flag('subset_size')} = {m} x {n} = {m * n} exceeds the label's {count} "
            "private records (sampling rate q > 1): lower either"
        )
    return m * n / count


def total_steps(max_tokens: int, demos_per_label: int) -> int:
    """T: token steps composed per label (each demonstration of the label is max_tokens steps)."""
    return _check_int("max_tokens", max_tokens, 1) * _check_int("demos_per_label", demos_per_label, 1)


def default_delta(num_private_records: int) -> float:
    """delta = 1/|D_priv| (the paper's choice, over the whole private set)."""
    n = _check_int("num_private_records", num_private_records, 2)
    return 1.0 / n


def _no_noise_report(q: float, steps: int, delta: float, mechanism: str) -> PrivacyReport:
    inf = math.inf
    return PrivacyReport(mechanism=mechanism, noise_multiplier=0.0, sampling_rate=q, steps=steps, delta=delta,
                         epsilon=inf, epsilon_lower=inf, epsilon_estimate=inf, epsilon_crosscheck=inf,
                         crosscheck_agreed=True,
                         warnings=("noise_multiplier = 0: no noise, epsilon = inf (not private)",),
                         epsilon_pure=inf, step_epsilon=inf)


def _family(q: float, steps: int, mechanism: str):
    """sigma -> the event of one label's generation (`dpcore.privacy.events.tang_event`)."""
    # dp-accounting loads here, not when the module is imported
    from dpcore.privacy.events import tang_event

    return lambda sigma: tang_event(mechanism, sigma, q, steps)


def _report(sigma: float, q: float, steps: int, delta: float, mechanism: str,
            result: composition.Composition) -> PrivacyReport:
    """A label's PrivacyReport from the composition of its event (sigma > 0)."""
    if result.epsilon_prv is None and result.epsilon_pld is None:
        raise ConfigError(
            f"neither accountant could compute epsilon for noise_multiplier={fmt_sigma(sigma)}, sampling_rate={q:.3g}, "
            f"steps={steps}, delta={fmt_delta(delta)}: {'; '.join(result.warnings)}"
        )
    nan = math.nan
    step_eps = rnm_step_epsilon(sigma, q) if mechanism == "rnm" else math.inf
    return PrivacyReport(
        mechanism=mechanism, noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=delta,
        epsilon=result.epsilon,
        epsilon_lower=nan if result.epsilon_lower is None else result.epsilon_lower,
        epsilon_estimate=nan if result.epsilon_estimate is None else result.epsilon_estimate,
        epsilon_crosscheck=nan if result.epsilon_pld is None else result.epsilon_pld,
        crosscheck_agreed=result.crosscheck_agreed, warnings=result.warnings,
        epsilon_pure=result.epsilon_pure, step_epsilon=step_eps,
        prv_eps_error=nan if result.prv_eps_error is None else result.prv_eps_error,
        epsilon_exact=nan if result.epsilon_exact is None else result.epsilon_exact,
    )


def _evaluate(sigma: float, q: float, steps: int, delta: float, mechanism: str,
              cache: bool | Path = True) -> PrivacyReport:
    """Epsilon of validated inputs (sigma > 0), through `dpcore.privacy.composition.compose`."""
    result = composition.compose([_family(q, steps, mechanism)(sigma)], delta, cache=cache)
    return _report(sigma, q, steps, delta, mechanism, result)


# ---------------------------------------------------------------------------------------------
# Disk cache (`dpcore.privacy.memo`)


def _composition_cache(cache_dir: CacheDir) -> bool | Path:
    """`composition.compose`'s `cache` for `cache_dir`: the home's cache as True, so the compositions are one
    memory entry whoever asks (the ledger asks with True)."""
    if cache_dir is None or cache_dir is False:
        return cache_dir is None
    return Path(cache_dir)


def _cached_report(where: Path | None, full_key: dict[str, Any]) -> PrivacyReport | None:
    stored = memo.get(where, full_key)
    try:
        return None if stored is None else PrivacyReport.from_dict(stored)
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------------------------
# Public API


def epsilon_for(noise_multiplier: float, sampling_rate: float, steps: int, delta: float,
                mechanism: str = "gaussian", cache_dir: CacheDir = None) -> PrivacyReport:
    """Epsilon of one label's generation: T Poisson-subsampled steps of the mechanism at sigma.

    `cache_dir`: None = $DPICL_HOME/cache/accounting, a path, or False (no cache)."""
    sigma = _check_noise_multiplier(noise_multiplier)
    q, t, d, mech = _check_common(sampling_rate, steps, delta, mechanism)
    if sigma == 0:
        return _no_noise_report(q, t, d, mech)
    folder = memo.folder(cache_dir)
    key = memo.key("epsilon", noise_multiplier=sigma, sampling_rate=q, steps=t, delta=d, mechanism=mech)
    cached = _cached_report(folder, key)
    if cached is not None:
        return cached
    report = _evaluate(sigma, q, t, d, mech, cache=_composition_cache(cache_dir))
    memo.put(folder, key, report.to_dict())
    return report


def calibrate(target_epsilon: float, sampling_rate: float, steps: int, delta: float,
              mechanism: str = "gaussian", cache_dir: CacheDir = None) -> PrivacyReport:
    """The smallest sigma (to SIGMA_TOLERANCE) whose reported epsilon is at most the target.

    `dpcore.privacy.composition.calibrate` over the family sigma -> tang_event(mechanism, sigma, q, T):
    bisection on the reported (upper-bound) epsilon; the upper end of the final bracket is
    returned, so the guarantee holds. A first pass on dp-accounting alone (Brent's method,
    aiming just below the target by prv-accountant's eps_error) places the bracket, so usually
    two full evaluations suffice. target_epsilon = inf gives sigma = 0 (no noise). sigma is not
    searched below SIGMA_MIN. Raises ConfigError for a bad input or an unreachable target."""
    target = _check_float("target_epsilon", target_epsilon)
    if target <= 0:
        raise ConfigError(f"target_epsilon must be > 0 (epsilon 0 means instruction-only generation, which needs "
                          f"no noise calibration), got {target}")
    q, t, d, mech = _check_common(sampling_rate, steps, delta, mechanism)
    if math.isinf(target):
        return _no_noise_report(q, t, d, mech)
    if target > MAX_TARGET_EPSILON:
        raise ConfigError(f"target_epsilon {target} is above {MAX_TARGET_EPSILON:g}, a vacuous guarantee; "
                          "use epsilon = inf for the non-private (sigma = 0) baseline")
    folder = memo.folder(cache_dir)
    key = memo.key("calibrate", target_epsilon=target, sampling_rate=q, steps=t, delta=d, mechanism=mech,
                   tolerance=SIGMA_TOLERANCE)
    cached = _cached_report(folder, key)
    if cached is not None:
        return cached

    result = composition.calibrate(_family(q, t, mech), target, d, tolerance=SIGMA_TOLERANCE,
                                   sigma_min=SIGMA_MIN, sigma_max=SIGMA_MAX, cache=_composition_cache(cache_dir))
    logger.debug("calibrated sigma %.4f for epsilon %s: %d full evaluations, %.1f s", result.noise_multiplier,
                 target, result.evaluations, result.seconds)
    best = _report(result.noise_multiplier, q, t, d, mech, result.composition)
    memo.put(folder, key, best.to_dict())
    return best


def parallel_composition(reports: Mapping[str, PrivacyReport]) -> PrivacyReport:
    """The run's guarantee over disjoint labels: the report with the largest epsilon (not the sum)."""
    if not reports:
        raise ConfigError("no per-label privacy reports to compose")
    return max(reports.values(), key=lambda report: report.epsilon)


def calibrate_for_labels(target_epsilon: float, label_counts: Mapping[str, int], num_subsets: int, subset_size: int,
                         steps: int, delta: float, mechanism: str = "gaussian",
                         cache_dir: CacheDir = None) -> dict[str, Any]:
    """One sigma for the run, calibrated at the largest per-label sampling rate q = MN/|D_y|.

    Labels are disjoint partitions of the private set, so the run's epsilon is the maximum of
    the per-label epsilons (parallel composition). Labels with no private record have no
    privacy cost and are listed under `empty_labels`.

    Returns a dict: noise_multiplier, epsilon (run, = max over labels), delta, steps, mechanism,
    sampling_rate (the largest q), limiting_label, crosscheck_agreed (all labels), warnings,
    report (the run-level PrivacyReport), per_label {label: PrivacyReport}, empty_labels."""
    if not label_counts:
        raise ConfigError("label_counts is empty: no labelled private records")
    counts = {}
    for label, count in label_counts.items():
        counts[str(label)] = _check_int(f"label_counts[{label!r}]", count, 0)
    empty = sorted(label for label, count in counts.items() if count == 0)
    rates = {label: sampling_rate(num_subsets, subset_size, count) for label, count in counts.items() if count > 0}
    if not rates:
        raise ConfigError("label_counts holds no label with private records")
    limiting = max(rates, key=lambda label: rates[label])
    report = calibrate(target_epsilon, rates[limiting], steps, delta, mechanism=mechanism, cache_dir=cache_dir)
    per_rate: dict[float, PrivacyReport] = {rates[limiting]: report}
    per_label = {}
    for label, q in rates.items():
        if q not in per_rate:
            per_rate[q] = epsilon_for(report.noise_multiplier, q, steps, delta, mechanism=mechanism,
                                      cache_dir=cache_dir)
        per_label[label] = per_rate[q]
    run = parallel_composition(per_label)
    if run.epsilon > report.epsilon:  # cannot happen for a monotone accountant; report the worst honestly
        report = run
    notes = list(report.warnings)
    for label, item in per_label.items():
        if item is not report:
            notes.extend(f"label {label!r}: {w}" for w in item.warnings if w not in report.warnings)
    return {
        "noise_multiplier": report.noise_multiplier,
        "epsilon": report.epsilon,
        "target_epsilon": float(target_epsilon),
        "delta": report.delta,
        "steps": report.steps,
        "mechanism": report.mechanism,
        "sampling_rate": report.sampling_rate,
        "limiting_label": limiting,
        "crosscheck_agreed": all(item.crosscheck_agreed for item in per_label.values()),
        "warnings": tuple(dict.fromkeys(notes)),
        "report": report,
        "per_label": per_label,
        "empty_labels": empty,
    }
