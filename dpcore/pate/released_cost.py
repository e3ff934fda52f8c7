"""PromptPATE's data-dependent accounting (`pate_accounting: data-dependent`): the labelling charged at a
DP-released upper bound on its data-dependent cost (Papernot et al. 2018, "Scalable Private Learning with
PATE", Section 4.3 and the smooth-sensitivity appendix; the bound as in Redberg, Zhu and Wang 2023,
generalized propose-test-release).

Confident-GNMax's data-dependent RDP at an order lambda, R(D) (`dpcore.pate.data_dependent`), is a function
of the private vote histograms: small when the teachers agree, so a high-consensus flock costs far less than
its bound for any votes (`dpcore.pate.privacy`). It is published as an upper bound through the GNSS
mechanism (`dpcore.pate.smooth_sensitivity`): R^ = R(D) + k SS_beta(D) + c SS_beta(D) N(0, sigma_ss^2), itself
(lambda, eps_GNSS)-RDP (Theorem 23) for lambda, beta, sigma_ss and delta0 fixed before any vote is seen, and
below R(D) with probability exactly delta0. Three ledger spends, all charged before the labels or anything
made from them is published (`dpcore.privacy.composition` adds the Renyi ones at lambda and delta0 to delta):

1. before any teacher votes: the release, (lambda, eps_GNSS), and the bound's failure probability delta0
   (`release_spends`), both data-independent;
2. after the labelling, before any label is published: the labelling at its released upper bound,
   (lambda, R^) (`labelling_spend`). When the three compose over the epsilon the run asked, nothing is
   published (the test of propose-test-release: it reads only the DP release).

What it guarantees: the ledger's total is an (epsilon, delta)-DP bound whose delta includes delta0, the
probability that the release fell below the labelling's data-dependent cost. The data-dependent cost itself
is Papernot et al.'s analysis of the votes (R(D) bounds the labelling's Renyi divergence against every
neighbour of D). It pays when the teachers agree (a large flock of a strong model, where SS_beta(D) is
tiny); near the threshold, where one vote moves the answer, SS_beta(D) is large and the bound costs more
than the data-independent one (benchmarks/RESULTS.md, PromptPATE at Table 7's size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from dpcore.errors import BudgetExceededError, ConfigError, check_positive
from dpcore.flags import flag
from dpcore.pate import smooth_sensitivity as gnss
from dpcore.pate.privacy import PURPOSE, pate_plan
from dpcore.privacy import composition
from dpcore.privacy.events import BoundFailureDpEvent, RenyiDpEvent
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

ORDERS = tuple(float(order) for order in range(2, 65))  # where the default order is looked for
BETA_FRACTION = 0.4  # default beta = BETA_FRACTION / order, inside Theorem 23's beta < 1 / (2 order) ...
SHIFT_GROWTH = 0.5  # ... and at most where z sigma_ss (e^beta - 1) = SHIFT_GROWTH (the noise scale c <= 2)
DELTA0_FRACTION = 0.5  # default delta0: this share of the run's delta
ACCOUNTING = "data-dependent"


@dataclass(frozen=True)
class ReleaseParameters:
    """The GNSS release's public parameters, fixed before any vote is seen."""

    order: float
    beta: float
    sigma_ss: float
    delta0: float  # the probability that the released bound falls below the labelling's data-dependent cost

    @property
    def cost(self) -> float:
        """The release's own RDP at `order` (Theorem 23)."""
        return gnss.gnss_rdp(self.beta, self.sigma_ss, self.order)


def release_parameters(sigma2: float, classes: int, delta: float, order: float | None = None,
                       beta: float | None = None, sigma_ss: float = 10.0,
                       delta0: float | None = None) -> ReleaseParameters:
    """The release's parameters from public settings alone: `order` (default: the largest of ORDERS where the
    smooth-sensitivity analysis's conditions C5 and C6 hold at sigma2 and this many classes), delta0 (default
    DELTA0_FRACTION of the run's `delta`, below it), beta (default BETA_FRACTION / order, lowered where the
    upward shift would need more than twice the noise: `SHIFT_GROWTH`) and sigma_ss. ConfigError naming the
    flag when the analysis does not apply."""
    sigma2 = check_positive(flag("pate_sigma2"), sigma2)
    sigma_ss = check_positive(flag("pate_gnss_sigma"), sigma_ss)
    delta0 = DELTA0_FRACTION * float(delta) if delta0 is None else check_positive(flag("pate_gnss_delta0"), delta0)
    if not delta0 < float(delta):
        raise ConfigError(f"{flag('pate_gnss_delta0')}: must be below the run's delta {float(delta):.3g} (it is "
                          f"part of it), got {delta0:.3g}")
    if order is None:
        order = _largest_order(sigma2, classes)
    order = float(order)
    if not (math.isfinite(order) and order > 1):
        raise ConfigError(f"{flag('pate_gnss_order')}: must be a finite number > 1, got {order}")
    if not all(gnss.check_conditions(sigma2, classes, order)):
        raise ConfigError(f"{flag('pate_gnss_order')} {order:g}: the smooth-sensitivity analysis does not apply at "
                          f"{flag('pate_sigma2')} {sigma2:g} with {classes} classes (conditions C5/C6); choose a "
                          "smaller order")
    if beta is None:
        z = -float(ndtri(delta0))
        beta = min(BETA_FRACTION / order, math.log1p(SHIFT_GROWTH / (z * sigma_ss)))
    beta = check_positive(flag("pate_gnss_beta"), beta)
    if not beta < 1 / (2 * order):
        raise ConfigError(f"{flag('pate_gnss_beta')}: must be below 1 / (2 order) = {1 / (2 * order):.4g}, got {beta}")
    try:
        gnss.upper_bound_factors(beta, sigma_ss, delta0)
    except ConfigError as exc:
        raise ConfigError(f"{flag('pate_gnss_beta')}: {exc}") from None
    return ReleaseParameters(order, float(beta), float(sigma_ss), float(delta0))


def _largest_order(sigma2: float, classes: int) -> float:
    """The largest of ORDERS where conditions C5 and C6 hold, by bisection: they hold at small orders and fail
    from some order on (each check is a fine numerical grid, about 2 ms). The order returned is
    one where they were checked to hold."""
    def holds(index: int) -> bool:
        return all(gnss.check_conditions(sigma2, classes, ORDERS[index]))

    if not holds(0):
        raise ConfigError(f"{flag('pate_accounting', ACCOUNTING)}: the smooth-sensitivity analysis applies at no "
                          f"order of 2-64 at {flag('pate_sigma2')} {sigma2:g}; raise sigma2 or give "
                          f"{flag('pate_gnss_order')}")
    lo, hi = 0, len(ORDERS) - 1
    if holds(hi):
        return ORDERS[hi]
    while hi - lo > 1:  # holds(lo), not holds(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return ORDERS[lo]


def release_spends(release: ReleaseParameters) -> tuple[Spend, Spend]:
    """Spend 1, charged before any teacher votes: the GNSS release, (order, eps_GNSS)-RDP, and the probability
    delta0 that its upper bound fails, added to delta."""
    return (Spend(RenyiDpEvent(release.order, release.cost), PURPOSE,
                  "PromptPATE: the smooth-sensitivity release of an upper bound on the labelling's data-dependent cost"),
            Spend(BoundFailureDpEvent(release.delta0), PURPOSE,
                  "PromptPATE: the probability that the released upper bound fails (added to delta)"))


def labelling_spend(release: ReleaseParameters, released_rdp: float) -> Spend:
    """Spend 2, charged after the labelling and before any label is published: its released upper bound at the
    order."""
    value = float(released_rdp)
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"released RDP must be a finite number >= 0, got {released_rdp}")
    return Spend(RenyiDpEvent(release.order, value), PURPOSE,
                 "PromptPATE: Confident-GNMax labelling at the released upper bound on its data-dependent cost")


def data_dependent_plan(*, epsilon_target: float, delta: float, queries: int, threshold_sigma: float,
                        vote_sigma: float, teachers: int, threshold: float, release: ReleaseParameters) -> PrivacyPlan:
    """The plan charged before any teacher votes: the release and its failure probability (spend 1). Its
    `epsilon` is the cap the labelling is settled against (finite: the epsilon the run asked); the release
    alone must fit in it. `parameters`: the data-independent plan's (for Q = `queries`, every query asked), the
    accounting mode, the release's order, beta, sigma_ss, delta0 and its epsilon alone."""
    target = float(epsilon_target)
    if not (math.isfinite(target) and target > 0):
        raise ConfigError(f"{flag('pate_accounting', ACCOUNTING)}: the labelling is settled against the epsilon "
                          f"asked, which must be finite and > 0, got {epsilon_target}")
    reference = pate_plan(epsilon_target=None, delta=delta, queries=queries, threshold_sigma=threshold_sigma,
                          vote_sigma=vote_sigma, teachers=teachers, threshold=threshold)
    spends = release_spends(release)
    alone = composition.compose([spend.event for spend in spends], delta).epsilon
    if alone >= target:
        raise ConfigError(f"{flag('pate_accounting', ACCOUNTING)}: the release alone costs epsilon {alone:.3g} at "
                          f"delta {delta:.3g}, not less than the {target:g} asked; raise {flag('pate_gnss_sigma')} "
                          "or the epsilon")
    parameters = {**reference.parameters, "accounting": ACCOUNTING, "gnss_order": release.order,
                  "gnss_beta": release.beta, "gnss_sigma": release.sigma_ss, "gnss_delta0": release.delta0,
                  "epsilon_release": alone}
    return PrivacyPlan(method="pate", epsilon=target, delta=delta, spends=spends, parameters=parameters)


def released_labelling_rdp(histograms: np.ndarray, answered: Sequence[np.ndarray], *, teachers: int,
                           threshold: float, sigma1: float, sigma2: float, delta: float,
                           release: ReleaseParameters, rng: np.random.Generator) -> float:
    """R^, the released upper bound on the whole labelling's data-dependent RDP, every repeat (R Confident-GNMax
    passes over the same histograms, the `answered` mask of each), in one GNSS release: the repeats' costs add
    up at the order, so the release is of their sum (the histograms stacked, one teacher change moving every
    copy). Below the true cost with probability delta0. DP output; `rng` its noise."""
    stacked = np.concatenate([np.asarray(histograms)] * len(answered))
    mask = np.concatenate([np.asarray(a, dtype=bool) for a in answered])
    return gnss.release_data_dependent_epsilon(
        stacked, mask, teachers=teachers, threshold=threshold, sigma1=sigma1, sigma2=sigma2, delta=delta,
        order=release.order, beta=release.beta, sigma_ss=release.sigma_ss, delta0=release.delta0,
        rng=rng).rdp_released


def settled_plan(plan: PrivacyPlan, released_rdp: float) -> PrivacyPlan:
    """The plan as charged once the labelling is settled: every spend, `epsilon` their composition (what the
    run spent). BudgetExceededError when that exceeds the plan's cap: nothing may be published."""
    release = ReleaseParameters(plan.parameters["gnss_order"], plan.parameters["gnss_beta"],
                                plan.parameters["gnss_sigma"], plan.parameters["gnss_delta0"])
    spends = (*plan.spends, labelling_spend(release, released_rdp))
    spent = composition.compose([s.event for s in spends], plan.delta).epsilon
    if spent > plan.epsilon:
        raise BudgetExceededError(f"PromptPATE data-dependent accounting: the released upper bound on the labelling's "
                                  f"cost brings the run to epsilon {spent:.3g}, over the {plan.epsilon:g} asked: no "
                                  "label is published")
    parameters = {**plan.parameters, "released_rdp": float(released_rdp)}
    return PrivacyPlan(method="pate", epsilon=spent, delta=plan.delta, spends=spends, parameters=parameters)


__all__ = [
    "ACCOUNTING", "BETA_FRACTION", "DELTA0_FRACTION", "ORDERS", "SHIFT_GROWTH", "ReleaseParameters",
    "data_dependent_plan", "labelling_spend", "release_parameters", "release_spends", "released_labelling_rdp",
    "settled_plan",
]
