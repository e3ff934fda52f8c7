"""The run's first line: what it will spend (a regenerate-mode audit's generation among its spends) and how many
minutes it will take, estimated from public sizes only (`dpcore.lm.runtime`, `RunPlan.work`); and the
defaults that size a user's loop (`RunConfig.for_test_split`)."""

from __future__ import annotations

import re

import pytest
from pipeline_support import mini_agnews, tiny_config  # noqa: F401

from dpcore.config import DEFAULT_TEST_ITEMS, RunConfig
from dpcore.lm import runtime


def _plan(**overrides):
    from tasks.run_plans import build_run_plan

    values = dict(methods=["tang"], audit=False, audit_reference=False, baselines=["zero-shot"])
    return build_run_plan(tiny_config(**{**values, **overrides}))


def test_the_estimate_grows_with_the_public_sizes_and_never_reads_a_record():
    small = _plan(dataset_id="estimate-a")
    work = small.work()
    assert work.generation > 0 and work.evaluation > 0 and work.audit == 0
    assert _plan(dataset_id="estimate-b", max_tokens=8).work().generation > 2 * work.generation
    assert _plan(dataset_id="estimate-c", epsilons=[1.0, 2.0]).work().generation == pytest.approx(2 * work.generation)
    assert _plan(dataset_id="estimate-d", seeds=4).work().evaluation > work.evaluation
    # every record counted at the public cap, whatever the records hold
    capped = _plan(dataset_id="estimate-e", max_record_tokens=400).work()
    assert capped.generation > work.generation
    assert small.estimated_seconds() > runtime.START_SECONDS
    assert runtime.minutes_text(30) == "about 1 minute" and runtime.minutes_text(361) == "about 7 minutes"


def test_a_regenerated_audit_costs_its_generation_and_is_in_the_plan_line(capsys):
    from flows.cli.run import _before_run

    config = tiny_config(methods=["tang"], dataset_id="estimate-audit", audit_mode="regenerate",
                         audit_reference=False, baselines=["zero-shot"])
    plan = _before_run(config, "estimate-run", None)
    err = capsys.readouterr().err.splitlines()
    first = next(line for line in err if not line.startswith("note:"))
    assert first.startswith("plan: epsilon ") and "(estimated from public sizes)" in first
    assert re.search(r"\(tang [\d.]+, audit [\d.]+\)", first)  # the audit's DP demo set, composed with the run's
    assert "minute" in first
    assert plan.audit is not None and plan.audit.plans
    run_demos = _plan(dataset_id="estimate-audit-b", audit=True, audit_mode="run-demos").work()
    assert plan.work().audit > run_demos.audit  # the regenerated demo set is generated too


def test_an_unset_test_size_is_the_default_or_the_whole_split():
    assert RunConfig().test_size is None
    assert RunConfig().for_test_split(5000).test_size == DEFAULT_TEST_ITEMS
    assert RunConfig().for_test_split(12).test_size == 12
    assert RunConfig(test_size=300).for_test_split(12).test_size == 300  # asked: checked, never capped
    plan = _plan(dataset_id="estimate-split", test_size=None)
    assert plan.config.test_size == min(DEFAULT_TEST_ITEMS, plan.num_test)
