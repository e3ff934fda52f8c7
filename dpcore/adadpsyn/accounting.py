"""AdaDPSyn's privacy events: one token step's sub-mechanisms, their Gaussian composition, T Poisson-sampled
steps (Gao et al. 2024, privacy analysis; the authors' `privacy_analysis.py`, `DP_AdaDPSyn`).

Neighbouring datasets: add/remove one private record. As in Tang et al.'s Algorithm 1
(`dpcore.fewshot.sampling`), every token step draws its M groups by Poisson sampling of the label's records
at q = MN/|D_y|, so one record takes part in a step with probability q; in that case it changes one group's
prompt, hence one of the M points (an empty group's point is the public distribution,
`dpcore.adadpsyn.pfirr.pad_groups`): on the sampled set the neighbouring relation is one point replaced.

One step on the sampled set is an adaptive composition of Gaussian mechanisms, each charged at its most
(`step_mechanisms`; the loop may stop early, which is post-processing of the full sequence):

  what                       at most            L2 sensitivity              noise std          multiplier
  DP-GoodRadius query L(r)   2 ceil(log2(.707/tol))  2                       2 sigma_radius     sigma_radius
  coverage test (a count)    T_update           1                           sigma_test         sigma_test
  DP average (clipped sum)   T_update + 1       2R (R = sqrt(2)/2 first)     2 R sigma_avg      sigma_avg

An adaptive composition of Gaussian mechanisms with noise multipliers sigma_i is exactly mu-GDP with
mu^2 = sum_i 1/sigma_i^2 (Dong, Roth and Su 2022, "Gaussian differential privacy", the composition theorem
for GDP): it has the trade-off function, hence the dominating pair, of ONE Gaussian mechanism with noise
multiplier sigma_eff = mu^-1 (`effective_noise_multiplier`). Poisson subsampling acts on a mechanism only
through its dominating pair (Zhu, Dong and Wang 2022, dominating pairs of subsampled mechanisms), so the
sampled step is `PoissonSampledDpEvent(q, GaussianDpEvent(sigma_eff))` exactly, and T steps are
`SelfComposedDpEvent(..., T)`: the shape of Tang et al.'s Gaussian spend (`sampled_steps_event`), composed
by `dpcore.privacy.composition` (PRV upper bound, PLD cross-check). `step_event_composed` keeps the step's
sub-mechanisms as events, for people; the accountants cannot sample a composed event, hence the reduction.

Deliberate difference from the authors' accountant: they compose the step's RDP and amplify it by sampling
without replacement under replace-one neighbours (autodp); here the Poisson sampler and add/remove
neighbours of this project, with the numerical (PRV/PLD) accountant, which is tight for this pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcore.adadpsyn.params import PfirrParams
from dpcore.adadpsyn.pfirr import COUNT_SENSITIVITY
from dpcore.adadpsyn.radius import L_SENSITIVITY
from dpcore.privacy import composition

MECHANISM = "gaussian"  # the step kind of the reduced event


@dataclass(frozen=True)
class SubMechanism:
    """One Gaussian sub-mechanism of a token step: how many times at most, its noise multiplier
    (std / sensitivity) and its sensitivity (the averages': 2R for the ball's radius R)."""

    name: str
    count: int
    noise_multiplier: float
    sensitivity: str


def step_mechanisms(params: PfirrParams) -> tuple[SubMechanism, ...]:
    """The sub-mechanisms of one token step (module docstring's table), each at its most."""
    return (
        SubMechanism("DP-GoodRadius query L(r)", params.radius_queries, params.sigma_radius,
                     f"{L_SENSITIVITY:g} (L(r), one point replaced)"),
        SubMechanism("coverage test", params.tests, params.sigma_test,
                     f"{COUNT_SENSITIVITY:g} (a count of points in a ball)"),
        SubMechanism("DP average", params.averages, params.sigma_avg,
                     "2R (sum of points clipped to a ball of radius R; R = sqrt(2)/2 for the first)"),
    )


def effective_noise_multiplier(params: PfirrParams) -> float:
    """sigma_eff = (sum over sub-mechanisms of count / sigma^2)^(-1/2): the one Gaussian mechanism a step's
    composition equals (module docstring); 0.0 when some sub-mechanism has no noise (not private)."""
    mechanisms = [m for m in step_mechanisms(params) if m.count > 0]
    if any(m.noise_multiplier == 0 for m in mechanisms):
        return 0.0
    return 1.0 / math.sqrt(sum(m.count / m.noise_multiplier ** 2 for m in mechanisms))


def step_event_composed(params: PfirrParams):
    """One step on the sampled set as its sub-mechanisms' events (for people and for tests; not sampled)."""
    from dpcore.privacy.events import ComposedDpEvent, SelfComposedDpEvent, gaussian_event

    return ComposedDpEvent([SelfComposedDpEvent(gaussian_event(m.noise_multiplier, 1.0), m.count)
                            for m in step_mechanisms(params) if m.count > 0])


def step_event(params: PfirrParams):
    """One step on the sampled set as the Gaussian it equals: `GaussianDpEvent(sigma_eff)` (non-private when
    some sigma is 0)."""
    from dpcore.privacy.events import gaussian_event

    return gaussian_event(effective_noise_multiplier(params), 1.0)


def adadpsyn_event(params: PfirrParams, sampling_rate: float, steps: int):
    """One label's generation: T Poisson-sampled steps at rate q, `SelfComposedDpEvent(PoissonSampledDpEvent(
    q, GaussianDpEvent(sigma_eff)), T)` (`sampled_steps_event`; sigma_eff = 0 keeps the shape, non-private)."""
    from dpcore.privacy.events import sampled_steps_event

    return sampled_steps_event(MECHANISM, effective_noise_multiplier(params), sampling_rate, steps)


def epsilon_for(params: PfirrParams, sampling_rate: float, steps: int, delta: float, *,
                cache=True) -> composition.Composition:
    """The composition of `adadpsyn_event` at delta (`dpcore.privacy.composition.compose`)."""
    return composition.compose([adadpsyn_event(params, sampling_rate, steps)], delta, cache=cache)


__all__ = ["MECHANISM", "SubMechanism", "adadpsyn_event", "effective_noise_multiplier", "epsilon_for",
           "step_event", "step_event_composed", "step_mechanisms"]
