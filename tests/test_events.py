"""dpcore.events: the DpEvent shape of what the product runs, and how events reduce to steps."""

from __future__ import annotations

import math

import pytest
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

from dpcore import composition, events
from dpcore.errors import ConfigError
from dpcore.events import ReportNoisyMaxDpEvent, dp_fewshot_event, gaussian_event
from dpcore.ledger import ChargeRequest, LedgerEntry
from dpcore.names import MECHANISMS


def test_fewshot_event_is_self_composed_poisson_sampled_step():
    assert dp_fewshot_event("gaussian", 0.5, 0.01, 40) == SelfComposedDpEvent(
        PoissonSampledDpEvent(0.01, GaussianDpEvent(0.5)), 40)
    assert dp_fewshot_event("rnm", 0.5, 0.01, 40) == SelfComposedDpEvent(
        PoissonSampledDpEvent(0.01, ReportNoisyMaxDpEvent(0.5)), 40)
    for mechanism in MECHANISMS:  # no noise: not private, whatever the sampling
        assert dp_fewshot_event(mechanism, 0.0, 0.01, 40) == NonPrivateDpEvent()
    assert set(events._step_events()) == set(MECHANISMS)  # one list of mechanisms, every one an event


@pytest.mark.parametrize("args, match", [
    (("laplace", 0.5, 0.01, 10), "mechanism"),
    (("gaussian", -1.0, 0.01, 10), "noise_multiplier"),
    (("gaussian", math.inf, 0.01, 10), "noise_multiplier"),
    (("gaussian", 0.5, 0.0, 10), "sampling_rate"),
    (("gaussian", 0.5, 1.5, 10), "sampling_rate"),
    (("gaussian", 0.5, 0.01, 0), "steps"),
    (("gaussian", 0.5, 0.01, 2.5), "steps"),
])
def test_fewshot_event_rejects_bad_input(args, match):
    with pytest.raises(ConfigError, match=match):
        dp_fewshot_event(*args)


def test_report_noisy_max_event_has_dp_accountings_shape():
    event = ReportNoisyMaxDpEvent(0.5)
    assert isinstance(event, DpEvent) and hash(event) == hash(ReportNoisyMaxDpEvent(0.5))
    with pytest.raises(AttributeError):
        event.noise_multiplier = 1.0  # frozen
    nested = dp_fewshot_event("rnm", 0.5, 0.01, 3)
    assert DpEvent.from_named_tuple(nested.to_named_tuple()) == nested  # dp-accounting's serialised form


def test_gaussian_event_with_its_own_sensitivity():
    # e.g. a noisy vote histogram: noise std 4 on counts of L2 sensitivity 2 is noise multiplier 2
    assert gaussian_event(4.0, 2.0) == GaussianDpEvent(2.0)
    assert gaussian_event(0.0, 2.0) == NonPrivateDpEvent()
    with pytest.raises(ConfigError, match="sensitivity"):
        gaussian_event(1.0, 0.0)


def test_ledger_rows_are_events():
    request = ChargeRequest("ds", "h", "run", "rnm", 0.7, 0.02, 30, 1e-5, "pipeline")
    entry = LedgerEntry(1, "ds", "h", "run", "gaussian", 0.7, 0.02, 30, 1e-5, 2.0, "pipeline", "charged", "now")
    assert request.event() == dp_fewshot_event("rnm", 0.7, 0.02, 30)
    assert entry.event() == dp_fewshot_event("gaussian", 0.7, 0.02, 30)


def test_events_reduce_to_groups_of_steps():
    a = dp_fewshot_event("gaussian", 0.7, 0.01, 30)
    b = SelfComposedDpEvent(ComposedDpEvent([a, NoOpDpEvent(), dp_fewshot_event("rnm", 1.0, 0.01, 5)]), 2)
    assert composition.groups([a, b]) == (("gaussian", 0.7, 0.01, 90), ("rnm", 1.0, 0.01, 10))
    assert composition.groups([b, a]) == composition.groups([a, b])  # order does not matter
    # sampling at q = 1 is no sampling; q = 0 touches nobody
    assert composition.groups([PoissonSampledDpEvent(1.0, GaussianDpEvent(2.0)), GaussianDpEvent(2.0),
                               PoissonSampledDpEvent(0.0, GaussianDpEvent(0.1))]) == (("gaussian", 2.0, 1.0, 2),)
    assert composition.groups([NoOpDpEvent()]) == ()
    assert composition.groups([a, NonPrivateDpEvent()]) == ((composition.NONPRIVATE, 0.0, 1.0, 1),)
    assert composition.groups([GaussianDpEvent(0.0)]) == ((composition.NONPRIVATE, 0.0, 1.0, 1),)
    with pytest.raises(ConfigError, match="cannot account"):
        composition.groups([LaplaceDpEvent(1.0)])
