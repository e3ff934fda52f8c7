"""A privacy plan's composed epsilon is what the ledger charges for it: the same events, one composition."""

from __future__ import annotations

import math

import pytest

from dpcore.errors import BudgetExceededError, ConfigError
from dpcore.privacy import composition
from dpcore.privacy.ledger import Ledger
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend
from tasks.charge import charge_plans


def _pate_like_plan(delta: float = 1e-6) -> PrivacyPlan:
    # Two Gaussian spends on the whole data (q = 1): a threshold test and a vote, 50 queries each.
    return PrivacyPlan(method="pate", epsilon=8.0, delta=delta, spends=(
        Spend.sampled_steps("gaussian", 40.0, 1.0, 50, "pate", "threshold"),
        Spend.sampled_steps("gaussian", 40.0 / math.sqrt(2), 1.0, 50, "pate", "votes"),
    ), parameters={"queries": 50})


def test_plan_charge_equals_direct_composition(tmp_path, monkeypatch):
    monkeypatch.setenv("DPICL_HOME", str(tmp_path))
    plan = _pate_like_plan()
    summary = charge_plans("ds", "hash", "run-1", [plan])
    assert summary["charged"] == 2
    assert summary["noise_charged"] == [["pate", 8.0, 0], ["pate", 8.0, 1]]  # each spend by its position
    spend = Ledger().spend("ds", delta=plan.delta)
    direct = composition.compose(plan.events(), plan.delta)
    assert spend.epsilon == pytest.approx(direct.epsilon, rel=1e-9)
    assert plan.composed().epsilon == pytest.approx(direct.epsilon, rel=1e-9)
    # A replay of the same plan under the same run id is free; a second run is charged again.
    again = charge_plans("ds", "hash", "run-1", [plan])
    assert again["charged"] == 0 and again["replayed"] == 2 and again["noise_charged"] == []
    assert len(Ledger().entries("ds")) == 2


def test_plan_over_budget_is_refused_and_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DPICL_HOME", str(tmp_path))
    Ledger().set_budget("ds", 0.5, 1e-6)
    with pytest.raises(BudgetExceededError):
        charge_plans("ds", "hash", "run-1", [_pate_like_plan()])
    assert Ledger().entries("ds") == []


def test_plan_without_spends_reads_nothing():
    plan = PrivacyPlan(method="tang", epsilon=0.0, delta=1e-5)
    assert not plan.reads_private_data and plan.requests("ds", "h", "r") == []


@pytest.mark.parametrize("kwargs", [dict(method="nope"), dict(epsilon=-1.0), dict(delta=0.0)])
def test_plan_rejects_bad_parameters(kwargs):
    values = dict(method="tang", epsilon=1.0, delta=1e-5) | kwargs
    with pytest.raises(ConfigError):
        PrivacyPlan(**values)


def test_plan_is_frozen():
    plan = _pate_like_plan()
    with pytest.raises(AttributeError):
        plan.epsilon = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.parameters["queries"] = 1  # type: ignore[index]
