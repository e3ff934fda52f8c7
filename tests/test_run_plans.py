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


def test_a_run_that_did_not_pay_names_the_trained_prompt_and_what_it_takes():
    """The own-data path leads to the method that pays on a small local model, with its cost on these records
    from public sizes; said only when the run's prompts did not pay and it trained none."""
    import re

    from dpcore.config import RunConfig
    from dpcore.public_outputs import declared_lines
    from flows.cli.run import trained_prompt_line

    config = RunConfig(dataset="sst2", epsilons=[1.0, 4.0])
    within = {"epsilons": [{"epsilon": 1.0, "verdict": "within noise"}, {"epsilon": 4.0, "verdict": "paid"}]}
    line = trained_prompt_line(config, within)
    assert "`dpicl run --methods dpsgd --epsilons 1` on these records is about " in line
    assert re.search(r"is about \d+ minutes? here \(estimated from public sizes\)", line), line
    # its estimate (from the number of records) is declared for the neighbouring-dataset test
    assert any(re.search(pattern, line) for pattern in declared_lines())
    paid = {"epsilons": [{"epsilon": 1.0, "verdict": "paid"}]}
    assert trained_prompt_line(config, paid) is None
    assert trained_prompt_line(config.with_updates(methods=["tang", "dpsgd"]), within) is None
