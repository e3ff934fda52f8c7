"""dpcore.privacy.events: the DpEvent shape of what the product runs, and how events reduce to steps."""

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
    RandomizedResponseDpEvent,
    SelfComposedDpEvent,
)

from dpcore.errors import ConfigError
from dpcore.names import MECHANISMS
from dpcore.privacy import composition, events
from dpcore.privacy.events import ReportNoisyMaxDpEvent, gaussian_event, tang_event
from dpcore.privacy.spend import Spend


def test_fewshot_event_is_self_composed_poisson_sampled_step():
    assert tang_event("gaussian", 0.5, 0.01, 40) == SelfComposedDpEvent(
        PoissonSampledDpEvent(0.01, GaussianDpEvent(0.5)), 40)
    assert tang_event("rnm", 0.5, 0.01, 40) == SelfComposedDpEvent(
        PoissonSampledDpEvent(0.01, ReportNoisyMaxDpEvent(0.5)), 40)
    for mechanism in MECHANISMS:  # no noise: not private, whatever the sampling
        assert tang_event(mechanism, 0.0, 0.01, 40) == NonPrivateDpEvent()
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
        tang_event(*args)


def test_report_noisy_max_event_has_dp_accountings_shape():
    event = ReportNoisyMaxDpEvent(0.5)
    assert isinstance(event, DpEvent) and hash(event) == hash(ReportNoisyMaxDpEvent(0.5))
    with pytest.raises(AttributeError):
        event.noise_multiplier = 1.0  # frozen
    nested = tang_event("rnm", 0.5, 0.01, 3)
    assert DpEvent.from_named_tuple(nested.to_named_tuple()) == nested  # dp-accounting's serialised form


def test_gaussian_event_with_its_own_sensitivity():
    # e.g. a noisy vote histogram: noise std 4 on counts of L2 sensitivity 2 is noise multiplier 2
    assert gaussian_event(4.0, 2.0) == GaussianDpEvent(2.0)
    assert gaussian_event(0.0, 2.0) == NonPrivateDpEvent()
    with pytest.raises(ConfigError, match="sensitivity"):
        gaussian_event(1.0, 0.0)


def test_a_spend_is_its_event_and_reads_its_parameters_back():
    request = Spend.sampled_steps("rnm", 0.7, 0.02, 30, "pipeline", dataset_id="ds", content_hash="h", run_id="run",
                                  delta=1e-5)
    assert request.event == tang_event("rnm", 0.7, 0.02, 30)
    assert (request.mechanism, request.noise_multiplier, request.sampling_rate, request.steps) == ("rnm", 0.7, 0.02, 30)
    # no noise keeps the spend's shape (what ran), and still composes to an infinite spend
    baseline = Spend.sampled_steps("gaussian", 0.0, 1.0, 1, "baseline")
    assert baseline.event == SelfComposedDpEvent(PoissonSampledDpEvent(1.0, GaussianDpEvent(0.0)), 1)
    assert baseline.non_private and (baseline.mechanism, baseline.noise_multiplier) == ("gaussian", 0.0)
    assert math.isinf(composition.compose([baseline.event], 1e-5).epsilon)
    # another event shape: its kind, and no sigma, q or T to show
    other = Spend(ComposedDpEvent([tang_event("gaussian", 1.0, 0.1, 3), LaplaceDpEvent(2.0)]), "pate")
    assert (other.mechanism, other.noise_multiplier, other.sampling_rate, other.steps) == ("composed", None, None, None)
    assert Spend(LaplaceDpEvent(2.0), "pate").mechanism == "laplace"


@pytest.mark.parametrize("event", [
    tang_event("gaussian", 0.7, 0.02, 30),
    tang_event("rnm", 1 / 3, 0.1, 7),
    ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent(0.25, LaplaceDpEvent(0.1 + 0.2)), 3),
                     NonPrivateDpEvent(), NoOpDpEvent(), ComposedDpEvent([])]),
])
def test_stored_events_read_back_equal(event):
    text = events.event_to_json(event)
    assert events.event_from_json(text) == event
    assert events.event_to_json(events.event_from_json(text)) == text  # stable: one text per event
    assert '"class_name":"' in text and "dpcore" not in text  # names classes, never modules


def test_a_stored_event_names_only_known_classes():
    with pytest.raises(ConfigError, match="unknown event class"):
        events.event_from_json('{"class_name":"Popen","args":["true"]}')
    with pytest.raises(ConfigError, match="no field"):
        events.event_from_json('{"class_name":"GaussianDpEvent","noise_multiplier":1.0,"extra":2}')
    with pytest.raises(ConfigError, match="JSON"):
        events.event_from_json("not json")
    with pytest.raises(ConfigError, match="cannot store"):
        events.event_to_json(object())


def test_events_reduce_to_groups_of_steps():
    a = tang_event("gaussian", 0.7, 0.01, 30)
    b = SelfComposedDpEvent(ComposedDpEvent([a, NoOpDpEvent(), tang_event("rnm", 1.0, 0.01, 5)]), 2)
    assert composition.groups([a, b]) == (("gaussian", 0.7, 0.01, 90), ("rnm", 1.0, 0.01, 10))
    assert composition.groups([b, a]) == composition.groups([a, b])  # order does not matter
    # sampling at q = 1 is no sampling; q = 0 touches nobody
    assert composition.groups([PoissonSampledDpEvent(1.0, GaussianDpEvent(2.0)), GaussianDpEvent(2.0),
                               PoissonSampledDpEvent(0.0, GaussianDpEvent(0.1))]) == (("gaussian", 2.0, 1.0, 2),)
    assert composition.groups([NoOpDpEvent()]) == ()
    assert composition.groups([a, NonPrivateDpEvent()]) == ((composition.NONPRIVATE, 0.0, 1.0, 1),)
    assert composition.groups([GaussianDpEvent(0.0)]) == ((composition.NONPRIVATE, 0.0, 1.0, 1),)
    assert composition.groups([PoissonSampledDpEvent(0.1, LaplaceDpEvent(1.0))]) == (("laplace", 1.0, 0.1, 1),)
    with pytest.raises(ConfigError, match="cannot account"):
        composition.groups([RandomizedResponseDpEvent(0.5, 2)])
