"""Events known only by a Renyi-DP guarantee at one order (`RenyiDpEvent`, e.g. PromptPATE's smooth-sensitivity
release) composed with the accountants' events: against dp-accounting's RDP conversion, by hand, and in the ledger."""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpcore.errors import ConfigError
from dpcore.privacy.composition import compose, renyi_epsilon, split_renyi
from dpcore.privacy.events import RenyiDpEvent, event_from_json, event_to_json, sampled_steps_event
from dpcore.privacy.ledger import Ledger
from dpcore.privacy.spend import Spend

DELTA = 1e-5
GAUSSIAN = sampled_steps_event("gaussian", 1.0, 0.01, 1000)  # epsilon about 1.84 at DELTA


@pytest.mark.parametrize("order, rdp_value", [(2.0, 0.01), (15.0, 0.3), (40.0, 2.5)])
def test_a_renyi_guarantee_alone_converts_as_dp_accountings_rdp_accountant(order, rdp_value):
    expected, chosen = rdp.compute_epsilon([order], [rdp_value], DELTA)
    assert chosen == order
    assert renyi_epsilon(rdp_value, order, DELTA) == pytest.approx(expected, rel=1e-12)
    assert compose([RenyiDpEvent(order, rdp_value)], DELTA, cache=False).epsilon == pytest.approx(expected, rel=1e-12)


def test_guarantees_at_one_order_add_up_and_a_self_composition_multiplies():
    one = compose([RenyiDpEvent(15.0, 0.5)], DELTA, cache=False).epsilon
    assert compose([RenyiDpEvent(15.0, 0.2), RenyiDpEvent(15.0, 0.3)], DELTA, cache=False).epsilon == pytest.approx(one)
    nested = dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([RenyiDpEvent(15.0, 0.25)]), 2)
    assert compose([nested], DELTA, cache=False).epsilon == pytest.approx(one)
    others, renyi = split_renyi([dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([RenyiDpEvent(15.0, 0.1),
                                                                                          GAUSSIAN]), 3)])
    assert renyi == {15.0: pytest.approx(0.3)} and others == [dp_event.SelfComposedDpEvent(GAUSSIAN, 3)]


def test_guarantees_at_two_orders_share_delta():
    result = compose([RenyiDpEvent(10.0, 0.4), RenyiDpEvent(20.0, 0.6)], DELTA, cache=False)
    expected = rdp.compute_epsilon([10.0], [0.4], DELTA / 2)[0] + rdp.compute_epsilon([20.0], [0.6], DELTA / 2)[0]
    assert result.epsilon == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("sigma, q, steps, smaller", [(1.0, 0.01, 1000, "split"), (2.0, 1.0, 1, "together")])
def test_with_other_events_it_is_the_smaller_of_two_upper_bounds(sigma, q, steps, smaller):
    gaussian = sampled_steps_event("gaussian", sigma, q, steps)
    guarantee = RenyiDpEvent(15.0, 0.3)
    result = compose([gaussian, guarantee], DELTA, cache=False)
    # delta split between the accountants' composition and the Renyi conversion (basic composition)
    split = compose([gaussian], DELTA / 2, cache=False).epsilon + rdp.compute_epsilon([15.0], [0.3], DELTA / 2)[0]
    # everything in RDP at order 15, by dp-accounting's own accountant (the Gaussian's RDP there, plus 0.3)
    accountant = rdp.RdpAccountant([15.0])
    step = dp_event.GaussianDpEvent(sigma)
    accountant.compose(step if q == 1.0 else dp_event.PoissonSampledDpEvent(q, step), steps)
    rdp_gaussian = float(accountant._rdp[0])  # noqa: SLF001 - its one order's RDP, to add 0.3 by hand
    together = rdp.compute_epsilon([15.0], [rdp_gaussian + 0.3], DELTA)[0]
    assert result.epsilon == pytest.approx(min(split, together), rel=1e-9)
    assert result.epsilon > compose([gaussian], DELTA).epsilon  # never cheaper than the other events alone
    # each bound wins somewhere: many amplified steps (their PLD at half delta), one full-data step (RDP)
    assert result.epsilon == pytest.approx(split if smaller == "split" else together)
    assert split != pytest.approx(together, rel=0.02)


def test_a_renyi_guarantee_is_stored_charged_and_composed_by_the_ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.db")
    release = Spend(RenyiDpEvent(15.0, 0.27), "pate", "smooth-sensitivity release").bound("ds", "hash", "run-1",
                                                                                          DELTA)
    votes = Spend(GAUSSIAN, "pate", "votes").bound("ds", "hash", "run-1", DELTA)
    ledger.charge([votes, release], replay_recorded=False)
    entries = ledger.entries("ds")
    assert event_from_json(event_to_json(entries[1].event)) == RenyiDpEvent(15.0, 0.27)
    assert not entries[1].non_private
    assert ledger.spend("ds").epsilon == pytest.approx(compose([GAUSSIAN, RenyiDpEvent(15.0, 0.27)], DELTA).epsilon)
    ledger.set_budget("ds", ledger.spend("ds").epsilon + 0.01, DELTA)
    with pytest.raises(Exception, match="budget"):
        ledger.charge([Spend(RenyiDpEvent(15.0, 0.5), "pate", "another release").bound("ds", "hash", "run-2",
                                                                                       DELTA)],
                      replay_recorded=False)
    assert len(ledger.entries("ds")) == 2


@pytest.mark.parametrize("event, needle", [
    (RenyiDpEvent(1.0, 0.1), "order"),
    (RenyiDpEvent(math.inf, 0.1), "order"),
    (RenyiDpEvent(15.0, -0.1), "epsilon"),
    (RenyiDpEvent(15.0, math.nan), "epsilon"),
    (dp_event.PoissonSampledDpEvent(0.1, RenyiDpEvent(15.0, 0.1)), "inside PoissonSampledDpEvent"),
])
def test_a_bad_or_sampled_renyi_guarantee_is_refused(event, needle):
    with pytest.raises(ConfigError, match=needle):
        compose([event], DELTA, cache=False)
