"""PromptPATE's data-dependent accounting (`pate_accounting: data-dependent`): the labelling charged at its
released data-dependent cost (Papernot et al. 2018, "Scalable Private Learning with PATE", Section 4.3 and
the smooth-sensitivity appendix), as Duan et al. Table 2 reports PromptPATE's epsilon.

Confident-GNMax's data-dependent RDP at an order lambda, R(D) (`dpcore.pate.data_dependent`), is a function
of the private vote histograms: small when the teachers agree, so a high-consensus flock costs far less than
its bound for any votes (`dpcore.pate.privacy`). It is published through the GNSS mechanism
(`dpcore.pate.smooth_sensitivity`): R~ = R(D) + SS_beta(D) N(0, sigma_ss^2), itself (lambda, eps_GNSS)-RDP
(Theorem 23) for lambda, beta and sigma_ss fixed before any vote is seen. Two ledger spends, both
`RenyiDpEvent`s at lambda, so they add up there (`dpcore.privacy.composition`):

1. before any teacher votes: the release, (lambda, eps_GNSS), a data-independent cost (`release_spend`);
2. after the labelling, before any label or anything made from one is published: the labelling at its
   released cost, (lambda, R~) (`labelling_spend`). Over the epsilon the run asked, nothing is published.

What it is: R~ is a differentially private ESTIMATE of the labelling's data-dependent cost; its noise can
place it below R(D). The charge is therefore not a bound that holds for every pair of neighbouring datasets,
as the data-independent default is: it is the analysis Papernot et al. and Duan et al. publish. It pays
when the teachers agree (a large flock of a strong model); near the threshold, where one vote moves the
answer, SS_beta(D) is large and the release costs more than the data-independent bound (benchmarks/RESULTS.md,
PromptPATE at Table 7's size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpcore.config import flag
from dpcore.errors import BudgetExceededError, ConfigError, check_positive
from dpcore.pate import smooth_sensitivity as gnss
from dpcore.pate.privacy import PURPOSE, pate_plan
from dpcore.privacy import composition
from dpcore.privacy.events import RenyiDpEvent
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

ORDERS = tuple(float(order) for order in range(2, 65))  # where the default order is looked for
BETA_FRACTION = 0.4  # default beta = BETA_FRACTION / order, inside Theorem 23's beta < 1 / (2 order)
ACCOUNTING = "data-dependent"


@dataclass(frozen=True)
class ReleaseParameters:
    """The GNSS release's public parameters, fixed before any vote is seen."""

    order: float
    beta: float
    sigma_ss: float

    @property
    def cost(self) -> float:
        """The release's own RDP at `order` (Theorem 23)."""
        return gnss.gnss_rdp(self.beta, self.sigma_ss, self.order)


def release_parameters(sigma2: float, classes: int, order: float | None = None, beta: float | None = None,
                       sigma_ss: float = 10.0) -> ReleaseParameters:
    """The release's parameters from public settings alone: `order` (default: the largest of ORDERS where the
    smooth-sensitivity analysis's conditions C5 and C6 hold at sigma2 and this many classes), beta (default
    BETA_FRACTION / order) and sigma_ss. ConfigError naming the flag when the analysis does not apply."""
    sigma2 = check_positive(flag("pate_sigma2"), sigma2)
    sigma_ss = check_positive(flag("pate_gnss_sigma"), sigma_ss)
    if order is None:
        order = _largest_order(sigma2, classes)
    order = float(order)
    if not (math.isfinite(order) and order > 1):
        raise ConfigError(f"{flag('pate_gnss_order')}: must be a finite number > 1, got {order}")
    if not all(gnss.check_conditions(sigma2, classes, order)):
        raise ConfigError(f"{flag('pate_gnss_order')} {order:g}: the smooth-sensitivity analysis does not apply at "
                          f"{flag('pate_sigma2')} {sigma2:g} with {classes} classes (conditions C5/C6); choose a "
                          "smaller order")
    beta = BETA_FRACTION / order if beta is None else check_positive(flag("pate_gnss_beta"), beta)
    if not beta < 1 / (2 * order):
        raise ConfigError(f"{flag('pate_gnss_beta')}: must be below 1 / (2 order) = {1 / (2 * order):.4g}, got {beta}")
    return ReleaseParameters(order, float(beta), float(sigma_ss))


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


def release_spend(release: ReleaseParameters) -> Spend:
    """Spend 1, charged before any teacher votes: the GNSS release, (order, eps_GNSS)-RDP."""
    return Spend(RenyiDpEvent(release.order, release.cost), PURPOSE,
                 "PromptPATE: the smooth-sensitivity release of the labelling's data-dependent cost")


def labelling_spend(release: ReleaseParameters, released_rdp: float) -> Spend:
    """Spend 2, charged after the labelling and before any label is published: its released cost at the order."""
    value = float(released_rdp)
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"released RDP must be a finite number >= 0, got {released_rdp}")
    return Spend(RenyiDpEvent(release.order, value), PURPOSE,
                 "PromptPATE: Confident-GNMax labelling at its released data-dependent cost")


def data_dependent_plan(*, epsilon_target: float, delta: float, queries: int, threshold_sigma: float,
                        vote_sigma: float, teachers: int, threshold: float, release: ReleaseParameters) -> PrivacyPlan:
    """The plan charged before any teacher votes: the release (spend 1). Its `epsilon` is the cap the
    labelling is settled against (finite: the epsilon the run asked); the release alone must fit in it.
    `parameters`: the data-independent plan's (for Q = `queries`, every query asked), the accounting mode,
    the release's order, beta, sigma_ss and its epsilon alone."""
    target = float(epsilon_target)
    if not (math.isfinite(target) and target > 0):
        raise ConfigError(f"{flag('pate_accounting', ACCOUNTING)}: the labelling is settled against the epsilon "
                          f"asked, which must be finite and > 0, got {epsilon_target}")
    reference = pate_plan(epsilon_target=None, delta=delta, queries=queries, threshold_sigma=threshold_sigma,
                          vote_sigma=vote_sigma, teachers=teachers, threshold=threshold)
    spend = release_spend(release)
    alone = composition.compose([spend.event], delta).epsilon
    if alone >= target:
        raise ConfigError(f"{flag('pate_accounting', ACCOUNTING)}: the release alone costs epsilon {alone:.3g} at "
                          f"delta {delta:.3g}, not less than the {target:g} asked; raise {flag('pate_gnss_sigma')} "
                          "or the epsilon")
    parameters = {**reference.parameters, "accounting": ACCOUNTING, "gnss_order": release.order,
                  "gnss_beta": release.beta, "gnss_sigma": release.sigma_ss, "epsilon_release": alone}
    return PrivacyPlan(method="pate", epsilon=target, delta=delta, spends=(spend,), parameters=parameters)


def released_labelling_rdp(histograms: np.ndarray, answered: Sequence[np.ndarray], *, teachers: int,
                           threshold: float, sigma1: float, sigma2: float, delta: float,
                           release: ReleaseParameters, rng: np.random.Generator) -> float:
    """R~ of the whole labelling, every repeat (R Confident-GNMax passes over the same histograms, the
    `answered` mask of each), in one GNSS release: the repeats' costs add up at the order, so the release is
    of their sum (the histograms stacked, one teacher change moving every copy). DP output; `rng` its noise."""
    stacked = np.concatenate([np.asarray(histograms)] * len(answered))
    mask = np.concatenate([np.asarray(a, dtype=bool) for a in answered])
    return gnss.release_data_dependent_epsilon(
        stacked, mask, teachers=teachers, threshold=threshold, sigma1=sigma1, sigma2=sigma2, delta=delta,
        order=release.order, beta=release.beta, sigma_ss=release.sigma_ss, rng=rng).rdp_released


def settled_plan(plan: PrivacyPlan, released_rdp: float) -> PrivacyPlan:
    """The plan as charged once the labelling is settled: both spends, `epsilon` their composition (what the
    run spent). BudgetExceededError when that exceeds the plan's cap: nothing may be published."""
    release = ReleaseParameters(plan.parameters["gnss_order"], plan.parameters["gnss_beta"],
                                plan.parameters["gnss_sigma"])
    spends = (*plan.spends, labelling_spend(release, released_rdp))
    spent = composition.compose([s.event for s in spends], plan.delta).epsilon
    if spent > plan.epsilon:
        raise BudgetExceededError(f"PromptPATE data-dependent accounting: the labelling's released cost brings the run to "
                          f"epsilon {spent:.3g}, over the {plan.epsilon:g} asked: no label is published")
    parameters = {**plan.parameters, "released_rdp": float(released_rdp)}
    return PrivacyPlan(method="pate", epsilon=spent, delta=plan.delta, spends=spends, parameters=parameters)


__all__ = [
    "ACCOUNTING", "BETA_FRACTION", "ORDERS", "ReleaseParameters", "data_dependent_plan", "labelling_spend",
    "release_parameters", "release_spend", "released_labelling_rdp", "settled_plan",
]
