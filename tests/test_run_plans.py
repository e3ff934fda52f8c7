"""A run's plan, built once (`tasks.run_plans.RunPlan`; that a `dpicl run` of every method reads its dataset once
and designs its audit once is checked on test_compare.py's run): the plan stays in its process (Prefect stores a placeholder, never its records);
its records are the ones ingested, and a plan made from other records is refused."""

from __future__ import annotations

import pytest
from pipeline_support import mini_agnews, prefect_harness, share_tiny_model, tiny_config  # noqa: F401
from test_compare import METHOD_FIELDS

from dpcore.errors import DpiclError

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_plan_never_reaches_prefects_parameter_store():
    from flows.pate import pate_flow
    from flows.pipeline import private_prompting_pipeline
    from flows.tune import dpsgd_flow
    from tasks.run_plans import build_run_plan

    config = tiny_config(**{**METHOD_FIELDS, "dataset_id": "plan-store"})
    plan = build_run_plan(config)
    assert plan.data.content_hash == plan.data_hash and plan.delta_source == "1/|D|"
    assert plan.delta == pytest.approx(1 / plan.num_private_records)
    for flow in (private_prompting_pipeline, pate_flow, dpsgd_flow):
        assert flow.serialize_parameters({"plan": plan})["plan"] == "<RunPlan>"
        assert flow.validate_parameters({"config": config, "plan": plan})["plan"] is plan  # never rebuilt
    assert not any(text in repr(plan) for text in plan.data.train["text"].head(20))  # no record in its repr


def test_a_plan_is_ingested_only_for_the_records_it_was_made_from(tmp_path):
    from tasks.ingest import ingest
    from tasks.run_plans import build_run_plan

    config = tiny_config(methods=["tang"], dataset_id="plan-other", audit=False, audit_reference=False)
    plan = build_run_plan(config)
    other = tmp_path / "other.csv"
    other.write_text(open(config.data_path).read())
    with pytest.raises(DpiclError, match="plan the run again"):
        ingest.fn(config.dataset, "plan-other", str(other), config.task_spec, None, plan=plan)


def test_a_delta_from_the_flag_is_said_as_such():
    from tasks.run_plans import build_run_plan

    plan = build_run_plan(tiny_config(methods=["tang"], dataset_id="plan-delta", delta=1e-6, audit=False,
                                      audit_reference=False))
    assert (plan.delta, plan.delta_source) == (1e-6, "flag")
