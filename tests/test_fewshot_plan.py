"""DP few-shot generation's privacy plan (`dpcore.fewshot.plan`): what each epsilon means (sigma at the
largest per-label q, T = max_tokens x demos per label, the epsilon = 0 / inf special cases), what is
charged (the plan's spends are the ledger's requests; their composition stays within the target), the
opted-in non-private rows as infinite spends, and the epsilon of demos generated at a known sigma."""

from __future__ import annotations

import math

import pytest

from dpcore.errors import ConfigError
from dpcore.fewshot import accounting
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import CALIBRATION_COLUMNS, demos_epsilon, fewshot_plan
from dpcore.privacy import composition

COUNTS = {"a": 400, "b": 100, "c": 0}   # label c has no private record
GEN = GenerationConfig(num_subsets=2, subset_size=2, max_tokens=5, demos_per_label=2)
DELTA = 1e-3


@pytest.fixture(scope="module")
def plan():
    return fewshot_plan([0, 2.0, math.inf], COUNTS, GEN, DELTA)


def test_sigma_is_calibrated_at_the_largest_q_and_stays_within_the_target(plan):
    dp = plan.calibration(2.0)
    assert dp.method == "tang" and dp.limiting_label == "b"
    assert dp.sampling_rate == pytest.approx(4 / 100) == plan.sampling_rate
    assert dp.steps == plan.steps == 10  # T = max_tokens x demos per label
    direct = accounting.calibrate_for_labels(2.0, COUNTS, 2, 2, 10, DELTA)
    assert dp.noise_multiplier == direct["noise_multiplier"] > 0
    assert dp.epsilon_upper <= 2.0 + 1e-9
    # the label with the smaller q spends less (parallel composition: the run's epsilon is the max)
    assert dp.per_label_epsilon["a"] < dp.per_label_epsilon["b"] == pytest.approx(dp.epsilon_upper)


def test_the_special_epsilons(plan):
    zero, inf = plan.calibration(0), plan.calibration(math.inf)
    assert zero.method == "instruction-only" and not zero.reads_private_data
    assert zero.noise_multiplier == 0.0 and zero.sampling_rate == 0.0 and zero.epsilon_upper == 0.0
    assert inf.method == "sigma-zero" and inf.noise_multiplier == 0.0 and math.isinf(inf.epsilon_upper)
    assert inf.sampling_rate == plan.sampling_rate and inf.steps == plan.steps
    assert list(plan.calibration(2.0).row()) == CALIBRATION_COLUMNS


def test_what_is_charged_is_the_plan_and_composes_within_the_target(plan):
    plans = {p.method: p for p in plan.privacy_plans()}
    assert set(plans) == {"tang", "sigma-zero"}  # instruction-only reads no private record
    dp = plans["tang"]
    (spend,) = dp.spends
    assert (spend.noise_multiplier, spend.sampling_rate, spend.steps, spend.purpose) == (
        plan.calibration(2.0).noise_multiplier, plan.sampling_rate, plan.steps, "pipeline")
    # the ledger's request is the plan's spend; its composition is the accountant's upper bound
    (request,) = dp.requests("ds", "h", "r")
    assert request.event == spend.event
    assert composition.compose(dp.events(), DELTA).epsilon == pytest.approx(plan.calibration(2.0).epsilon_upper,
                                                                           rel=1e-6)
    assert plans["sigma-zero"].spends[0].non_private and plans["sigma-zero"].spends[0].purpose == "baseline"
    assert math.isinf(plans["sigma-zero"].composed().epsilon)


def test_non_private_rows_are_charged_only_when_opted_in():
    default = fewshot_plan([2.0], COUNTS, GEN, DELTA, baselines=["zero-shot", "instruction-only"])
    assert [p.method for p in default.privacy_plans()] == ["tang"]
    assert [g[0] for g in default.generations()] == ["tang", "instruction-only"]
    opted = fewshot_plan([2.0], COUNTS, GEN, DELTA, baselines=["sigma-zero", "random-real"], audit_reference=True)
    plans = {p.method: p for p in opted.privacy_plans()}
    assert list(plans) == ["tang", "sigma-zero", "random-real", "audit-reference"]
    for name in ("sigma-zero", "random-real", "audit-reference"):
        (spend,) = plans[name].spends
        assert spend.noise_multiplier == 0.0 and spend.purpose == "baseline" and math.isinf(plans[name].epsilon)
    assert (plans["random-real"].spends[0].sampling_rate, plans["random-real"].spends[0].steps) == (1.0, 1)


def test_a_standalone_command_names_its_purpose_and_repeats_its_spend():
    audit = fewshot_plan([2.0], COUNTS, GEN, DELTA, purpose="audit", repeats=3)
    (dp,) = audit.privacy_plans()
    assert len(dp.spends) == 3 and {s.purpose for s in dp.spends} == {"audit"}
    assert composition.compose(dp.events(), DELTA).epsilon > audit.calibration(2.0).epsilon_upper


@pytest.mark.parametrize("epsilons, counts, match", [
    ([], COUNTS, "at least one"), ([-1.0], COUNTS, ">= 0"), ([2.0], {"a": 3}, r"sampling rate q > 1"),
    ([2.0], {"a": 0}, "no label"), ([1e-4], COUNTS, "unreachable")])
def test_bad_plans_are_refused(epsilons, counts, match):
    with pytest.raises(ConfigError, match=match):
        fewshot_plan(epsilons, counts, GEN, DELTA)


def test_the_epsilon_of_demos_at_a_known_sigma_is_the_plans(plan):
    dp = plan.calibration(2.0)
    shots = {"a": GEN.demos_per_label, "b": GEN.demos_per_label}
    eps = demos_epsilon(dp.noise_multiplier, COUNTS, shots, 2, 2, GEN.max_tokens, DELTA)
    assert eps == pytest.approx(dp.epsilon_upper, rel=1e-9)
    assert math.isnan(demos_epsilon(dp.noise_multiplier, COUNTS, {"c": 1}, 2, 2, GEN.max_tokens, DELTA))


def test_the_plan_is_frozen_and_round_trips_as_json(plan):
    from dpcore.fewshot.plan import FewShotPlan

    with pytest.raises(Exception):  # noqa: B017  (pydantic's frozen-instance error)
        plan.delta = 0.5
    again = FewShotPlan.model_validate_json(plan.model_dump_json())
    assert again.calibration(2.0).noise_multiplier == plan.calibration(2.0).noise_multiplier
