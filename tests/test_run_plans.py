"""A run's plan, built once (`tasks.run_plans.RunPlan`): a `dpicl run` of every method reads its dataset once
and designs its audit once; the plan stays in its process (Prefect stores a placeholder, never its records);
its records are the ones ingested, and a plan made from other records is refused."""

from __future__ import annotations

import pytest
from pipeline_support import mini_agnews, prefect_harness, share_tiny_model, tiny_config  # noqa: F401
from test_compare import METHOD_FIELDS, _argv

from dpcore.errors import DpiclError

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _counting(monkeypatch, owners: list, name: str) -> list:
    """Replace `name` in every module of `owners` by one wrapper that counts its calls."""
    calls = []
    original = getattr(owners[0], name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    for owner in owners:
        monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_run_of_every_method_loads_its_dataset_once_and_designs_its_audit_once(tiny_lm, monkeypatch, capsys):
    import dpcore.data.datasets
    import tasks.audit
    import tasks.ingest
    import tasks.run_plans
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    share_tiny_model(tiny_lm)
    mini_agnews()  # the test's own sample is made before counting
    loads = _counting(monkeypatch, [dpcore.data.datasets, tasks.ingest], "load_dataset")
    designs = _counting(monkeypatch, [tasks.audit, tasks.run_plans], "run_audit_design")
    # the audit on, at sizes these few records cannot make conclusive: designed, said, skipped (no audit runs)
    argv = [a for a in _argv("plan-once", "--run-id", "plan-once") if a != "--no-audit"] + ["--audit"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert len(loads) == 1, loads
    assert len(designs) == 1, designs
    assert "audit skipped:" in err and "plan: epsilon" in err
    # every method of the run charged once, under its own purpose (tang's: "pipeline")
    assert {e.purpose for e in Ledger().entries("plan-once")} == {"pipeline", "pate", "dpsgd", "adadpsyn", "dp-opt"}


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
