"""Privacy events: what one use of private data costs, in the shape of dp-accounting's `DpEvent`s.

An event describes a mechanism well enough to account for it, alone or composed with others;
it carries no number of its own (`dpcore.privacy.composition` turns any list of events into epsilon at
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
  `dpcore.privacy.composition.rnm_step_epsilon`).

Other mechanisms follow the same pattern: a PATE-style noisy threshold or GNMax vote is a
Gaussian on a vote histogram with its own sensitivity, i.e. `gaussian_event(std, sensitivity)`,
sampled and composed with the same wrappers; a new noise distribution is a new event class here
and a new step kind in `dpcore.privacy.composition`. A mechanism known only by its Renyi-DP guarantee at
one order (PromptPATE's smooth-sensitivity release, Papernot et al. 2018) is a `RenyiDpEvent`; the probability
that a DP-released upper bound charged as such a guarantee fails is a `BoundFailureDpEvent`, added to delta.

The per-label counts |D_y| (hence q) are public, as in the paper; labels partition the private
set, so they compose in parallel (the run's cost is the worst label's event, not the sum).

Stored events. The ledger keeps each spend's event as JSON (`event_to_json` / `event_from_json`):
the fields of dp-accounting's own named-tuple form (`DpEvent.to_named_tuple`: `class_name` and the
attrs fields, nested events likewise) as nested objects, keys sorted, floats in their round-trip
repr. dp-accounting ships no JSON form, and its `from_named_tuple` imports whatever module the data
names; here only the classes of `dp_accounting.dp_event` and ours are read back (`EVENT_CLASSES`). `steps_parameters` reads (mechanism, sigma, q, T) back from an event of
the `sampled_steps_event` shape, for the ledger's display columns.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attr
from dp_accounting import dp_event as _dp_event
from dp_accounting.dp_event import (
    ComposedDpEvent,
    DpEvent,
    GaussianDpEvent,
    LaplaceDpEvent,
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


@attr.s(frozen=True, slots=True, auto_attribs=True)
class RenyiDpEvent(DpEvent):
    """A mechanism known only by a Renyi-DP guarantee at one order (Mironov 2017): D_order(M(D) || M(D'))
    <= epsilon for neighbouring D, D'. PromptPATE's smooth-sensitivity release (Papernot et al. 2018,
    Theorem 23) and its released data-dependent cost are such guarantees. Composed by adding epsilons at
    the same order and converting to (epsilon, delta) (`dpcore.privacy.composition`); sampling does not
    amplify it here."""

    order: float
    epsilon: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class BoundFailureDpEvent(DpEvent):
    """The failure probability of a data-dependent bound charged beside it: a cost charged as a DP-released
    upper bound (PromptPATE's labelling at its released data-dependent RDP) holds except with probability
    `probability` over that release's noise. It composes as (0, probability)-DP: `probability` is added to
    delta (the rest is converted at delta minus every such probability, `dpcore.privacy.composition`)."""

    probability: float


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


def tang_step(mechanism: str, noise_multiplier: float) -> DpEvent:
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


def tang_event(mechanism: str, noise_multiplier: float, sampling_rate: float, steps: int) -> DpEvent:
    """One label's generation (Tang et al. Theorem 1): T Poisson-sampled token steps,
    `SelfComposedDpEvent(PoissonSampledDpEvent(q, step), T)` with the step of `tang_step`.

    sigma = 0 (no noise) is `NonPrivateDpEvent` (epsilon = inf). For a run over several labels,
    q is the largest per-label rate (labels compose in parallel)."""
    event = sampled_steps_event(mechanism, noise_multiplier, sampling_rate, steps)
    return NonPrivateDpEvent() if float(noise_multiplier) == 0 else event


def sampled_steps_event(mechanism: str, noise_multiplier: float, sampling_rate: float, steps: int) -> DpEvent:
    """`tang_event` as a spend records it: sigma = 0 keeps its shape (a step of noise multiplier
    0, which dp-accounting's accountants and `dpcore.privacy.composition` read as non-private), so a stored
    non-private spend still says which mechanism, q and T it had."""
    step = _step_events().get(mechanism)
    if step is None:
        raise ConfigError(f"mechanism must be one of {', '.join(_step_events())}, got {mechanism!r}")
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigError(f"noise_multiplier must be a finite number >= 0, got {noise_multiplier}")
    q = float(sampling_rate)
    if not 0.0 < q <= 1.0:
        raise ConfigError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if isinstance(steps, bool) or int(steps) != steps or int(steps) < 1:
        raise ConfigError(f"steps must be an integer >= 1, got {steps}")
    return SelfComposedDpEvent(PoissonSampledDpEvent(q, step(sigma)), int(steps))


def steps_parameters(event: DpEvent) -> tuple[str, float, float, int] | None:
    """(mechanism, sigma, q, T) of an event of the `sampled_steps_event` shape (or a Laplace step in
    it; the sampling and the self-composition may be absent: q = 1, T = 1); None for any other."""
    steps, q = 1, 1.0
    if isinstance(event, SelfComposedDpEvent):
        steps, event = event.count, event.event
    if isinstance(event, PoissonSampledDpEvent):
        q, event = event.sampling_probability, event.event
    names = {cls: name for name, cls in _step_events().items()} | {LaplaceDpEvent: "laplace"}
    name = names.get(type(event))
    if name is None or isinstance(steps, bool) or not isinstance(steps, int):
        return None
    return name, float(event.noise_multiplier), float(q), steps


def event_kind(event: DpEvent) -> str:
    """A short name of what an event is, for people: its step's mechanism (`steps_parameters`), else
    its class ("composed", "nonprivate", ...)."""
    parameters = steps_parameters(event)
    if parameters is not None:
        return parameters[0]
    name = type(event).__name__
    return (name[:-len("DpEvent")] if name.endswith("DpEvent") else name).lower()


# --------------------------------------------------------------------------- stored form

# Every event class a stored event may name: dp-accounting's and ours (never a module from the data).
EVENT_CLASSES: dict[str, type[DpEvent]] = {
    **{name: cls for name, cls in vars(_dp_event).items()
       if isinstance(cls, type) and issubclass(cls, DpEvent) and cls is not DpEvent},
    ReportNoisyMaxDpEvent.__name__: ReportNoisyMaxDpEvent,
    RenyiDpEvent.__name__: RenyiDpEvent,
    BoundFailureDpEvent.__name__: BoundFailureDpEvent,
}


def event_to_dict(event: DpEvent) -> dict[str, Any]:
    """An event as plain data: {"class_name": ..., field: value}, nested events likewise, sequences as lists."""
    if not isinstance(event, DpEvent) or EVENT_CLASSES.get(type(event).__name__) is not type(event):
        raise ConfigError(f"event: cannot store {type(event).__name__}: known events are dp-accounting's "
                          "and dpcore.privacy.events'")
    out: dict[str, Any] = {"class_name": type(event).__name__}
    for field in attr.fields(type(event)):
        out[field.name] = _plain(getattr(event, field.name))
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, DpEvent):
        return event_to_dict(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise ConfigError(f"event: cannot store a field of type {type(value).__name__}")


def event_from_dict(data: Any) -> DpEvent:
    """The event `event_to_dict` wrote (ConfigError naming the class or field that does not fit)."""
    if not isinstance(data, dict) or not isinstance(data.get("class_name"), str):
        raise ConfigError("event: a stored event is an object with a class_name")
    cls = EVENT_CLASSES.get(data["class_name"])
    if cls is None:
        raise ConfigError(f"event: unknown event class {data['class_name']!r}")
    fields = {field.name for field in attr.fields(cls)}
    if set(data) - {"class_name"} - fields:
        raise ConfigError(f"event: {cls.__name__} has no field {sorted(set(data) - {'class_name'} - fields)[0]!r}")
    try:
        return cls(**{k: _unplain(v) for k, v in data.items() if k != "class_name"})
    except TypeError as exc:
        raise ConfigError(f"event: {cls.__name__}: {exc}") from None


def _unplain(value: Any) -> Any:
    if isinstance(value, dict):
        return event_from_dict(value)
    if isinstance(value, list):
        return [_unplain(item) for item in value]
    return value


def event_to_json(event: DpEvent) -> str:
    """The stored form of an event: `event_to_dict` as compact JSON with sorted keys (stable: the same
    event always gives the same text). Non-finite numbers are refused."""
    try:
        return json.dumps(event_to_dict(event), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise ConfigError(f"event: {exc}") from None


def event_from_json(text: str) -> DpEvent:
    """The event of `event_to_json`'s text."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        raise ConfigError("event: not a stored event (JSON expected)") from None
    return event_from_dict(data)


__all__ = [
    "EVENT_CLASSES", "BoundFailureDpEvent", "ComposedDpEvent", "DpEvent", "GaussianDpEvent", "LaplaceDpEvent", "NoOpDpEvent",
    "NonPrivateDpEvent", "PoissonSampledDpEvent", "ReportNoisyMaxDpEvent", "SelfComposedDpEvent",
    "tang_event", "tang_step", "event_from_dict", "event_from_json", "event_kind", "event_to_dict",
    "event_to_json", "gaussian_event", "sampled_steps_event", "steps_parameters",
]
