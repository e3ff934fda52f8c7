"""Privacy events: what one use of private data costs, in the shape of dp-accounting's `DpEvent`s.

An event describes a mechanism well enough to account for it, alone or composed with others;
it carries no number of its own (`dpcore.composition` turns any list of events into epsilon at
delta). dp-accounting's event classes are used where they fit: `GaussianDpEvent(sigma)` (noise
multiplier sigma = noise std / L2 sensitivity), `PoissonSampledDpEvent(q, event)`,
`SelfComposedDpEvent(event, T)`, `ComposedDpEvent([...])`, `NoOpDpEvent()` (no privacy cost)
and `NonPrivateDpEvent()` (epsilon = inf). Ours are declared in the same shape (frozen attrs
classes deriving from `DpEvent`, so they nest inside dp-accounting's events and convert to and
from its named-tuple form).

Tang et al. (Algorithm 1, Theorem 1 and Appendix A) as events. Neighbouring datasets: add/remove
one private record. Each token step draws its groups by Poisson sampling of the label's records
with rate q = M*N/|D_y|, so one step is a `PoissonSampledDpEvent(q, step)` and a label's
generation of T = max_tokens x demos_per_label steps is `SelfComposedDpEvent(..., T)`:

- Gaussian aggregation (Algorithm 1 line 12; Appendix A, proof of Theorem 1): each group's
  next-token distribution is a probability vector, so adding or removing one record changes the
  sum over groups by at most sqrt(2) in L2 norm. Noise N(0, 2 sigma^2 I) on that sum is a
  Gaussian mechanism with noise multiplier sigma (std / sensitivity = sqrt(2) sigma / sqrt(2)):
  `GaussianDpEvent(sigma)`. T such steps compose numerically (Theorem A.3).
- Report-noisy-max (Algorithm 1 lines 15-19; Theorems A.4, A.5): exponential noise of scale
  (mean) 2 sigma on each coordinate of the group sum, whose L_inf sensitivity is 1, so one step
  is pure epsilon_0 = 1/sigma DP for the sampled set: `ReportNoisyMaxDpEvent(sigma)`. Poisson
  subsampling amplifies it to epsilon' = log(1 + q (e^epsilon_0 - 1)) (Theorem A.5,
  `dpcore.composition.rnm_step_epsilon`).

Other mechanisms follow the same pattern: a PATE-style noisy threshold or GNMax vote is a
Gaussian on a vote histogram with its own sensitivity, i.e. `gaussian_event(std, sensitivity)`,
sampled and composed with the same wrappers; a new noise distribution is a new event class here
and a new step kind in `dpcore.composition`.

The per-label counts |D_y| (hence q) are public, as in the paper; labels partition the private
set, so they compose in parallel (the run's cost is the worst label's event, not the sum).
"""

from __future__ import annotations

import math

import attr
from dp_accounting.dp_event import (
    ComposedDpEvent,
    DpEvent,
    GaussianDpEvent,
    NonPrivateDpEvent,
    NoOpDpEvent,
    PoissonSampledDpEvent,
    SelfComposedDpEvent,
)

from dpcore.errors import ConfigError, check_positive


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ReportNoisyMaxDpEvent(DpEvent):
    """One report-noisy-max step: exponential noise of scale (mean) 2 * noise_multiplier on each
    coordinate of a sum with L_inf sensitivity 1, then the arg max (Tang et al. Algorithm 1 lines
    15-19). Pure epsilon_0 = 1 / noise_multiplier DP (Theorem A.4); noise_multiplier = 0 is no
    noise (not private)."""

    noise_multiplier: float


def gaussian_event(standard_deviation: float, sensitivity: float) -> DpEvent:
    """A Gaussian mechanism with noise std `standard_deviation` on a sum of L2 `sensitivity`:
    `GaussianDpEvent(std / sensitivity)`; std = 0 is `NonPrivateDpEvent`."""
    std, sens = float(standard_deviation), float(sensitivity)
    if not (math.isfinite(std) and std >= 0):
        raise ConfigError(f"standard_deviation must be a finite number >= 0, got {standard_deviation}")
    check_positive("sensitivity", sens)
    return NonPrivateDpEvent() if std == 0 else GaussianDpEvent(std / sens)


def _step_events() -> dict[str, type[DpEvent]]:
    """Algorithm 1's aggregation mechanisms (the names of `dpcore.config.MECHANISMS`) -> step event."""
    return {"gaussian": GaussianDpEvent, "rnm": ReportNoisyMaxDpEvent}


def dp_fewshot_step(mechanism: str, noise_multiplier: float) -> DpEvent:
    """One token step of Algorithm 1 on the sampled set (before sampling): `GaussianDpEvent(sigma)`
    or `ReportNoisyMaxDpEvent(sigma)`; sigma = 0 is `NonPrivateDpEvent`."""
    steps = _step_events()
    if mechanism not in steps:
        raise ConfigError(f"mechanism must be one of {', '.join(steps)}, got {mechanism!r}")
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    if sigma == 0:
        return NonPrivateDpEvent()
    return steps[mechanism](sigma)


def dp_fewshot_event(mechanism: str, noise_multiplier: float, sampling_rate: float, steps: int) -> DpEvent:
    """One label's generation (Tang et al. Theorem 1): T Poisson-sampled token steps,
    `SelfComposedDpEvent(PoissonSampledDpEvent(q, step), T)` with the step of `dp_fewshot_step`.

    sigma = 0 (no noise) is `NonPrivateDpEvent` (epsilon = inf). For a run over several labels,
    q is the largest per-label rate (labels compose in parallel)."""
    step = dp_fewshot_step(mechanism, noise_multiplier)
    if isinstance(step, NonPrivateDpEvent):
        return step
    q = float(sampling_rate)
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if isinstance(steps, bool) or int(steps) != steps or int(steps) < 1:
        raise ConfigError(f"steps must be an integer >= 1, got {steps}")
    return SelfComposedDpEvent(PoissonSampledDpEvent(q, step), int(steps))


__all__ = [
    "ComposedDpEvent", "DpEvent", "GaussianDpEvent", "NoOpDpEvent", "NonPrivateDpEvent",
    "PoissonSampledDpEvent", "ReportNoisyMaxDpEvent", "SelfComposedDpEvent", "dp_fewshot_event",
    "dp_fewshot_step", "gaussian_event",
]
