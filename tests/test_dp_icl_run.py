"""DP-ICL as a method of `dpicl run --methods` (the method registry, `tasks.dp_icl`, `flows.dp_icl`) on the tiny
model (the run of all six methods, one ledger charge, is tests/test_compare.py's): DP-ICL answers the run's test items, in the order every method is evaluated on them, at each
epsilon, a row each; its plan is sized to the test items and refused, before any charge, when it cannot be."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import mini_agnews, prefect_harness, share_tiny_model, tiny_config  # noqa: F401

from dpcore.privacy.ledger import Ledger

pytestmark = pytest.mark.usefixtures("prefect_harness")

DP_ICL = ["--dp-icl-subsets", "4", "--dp-icl-shots", "2"]  # q = 8 / |D|: a small ensemble for the tiny model


def _argv(dataset_id: str, methods: list[str], epsilons: str, *extra: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    return ["run", "--task-spec", spec_path, "--data-path", data_path, "--dataset", "agnews-mini", "--dataset-id",
            dataset_id, "--model", "tiny-random", "--methods", ",".join(methods), "--epsilons", epsilons,
            "--no-audit", "--no-audit-reference", "--baselines", "zero-shot", "--seeds", "1", "--test-size", "6",
            "--seed", "11", *DP_ICL, *extra]


def _main(argv: list[str]) -> tuple[int, str, str]:
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def dp_icl_alone(tiny_lm):
    """DP-ICL alone at epsilons 1 and 4 (and 0, inf: no row): (its --json, the texts each answer task was given)."""
    import tasks.dp_icl as stage

    share_tiny_model(tiny_lm)
    asked: list[list[str]] = []
    original = stage.answer_queries

    def spy(lm, spec, records, queries, *args, **kwargs):
        asked.append(list(queries))
        return original(lm, spec, records, queries, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stage, "answer_queries", spy)
        code, out, err = _main(_argv("dp-icl-alone", ["dp-icl"], "0,1,4,inf", "--run-id", "dp-icl-alone", "--json"))
    assert code == 0, err[-3000:]
    return json.loads(out), asked


def test_dp_icl_answers_the_run_test_items_in_order_at_each_epsilon(dp_icl_alone, tiny_lm):
    from dpcore.data.taskspec import load_task_spec
    from tasks.dp_icl import test_queries
    from tasks.ingest import load_data

    summary, asked = dp_icl_alone
    # a row per finite epsilon > 0 (epsilon 0 reads no record; at inf its answers would be no DP output)
    rows = [row for row in summary["results"] if row["method"] == "dp-icl"]
    assert sorted(row["epsilon"] for row in rows) == [1.0, 4.0]
    assert all(row["n"] == 6 and row["calibrated_accuracy_std"] == 0.0 and row["accuracy_mean"] is None
               for row in rows)
    data_path, spec_path, _, _ = mini_agnews()
    texts, gold = test_queries(load_data(tiny_config(data_path=data_path, task_spec=spec_path)))
    assert asked == [texts[:6], texts[:6]]  # the items (and order) every method is evaluated on
    run_dir = Path(summary["run_dir"])
    table = pd.read_parquet(run_dir / "dp_icl_results.parquet")
    for eps in (1, 4):
        answers = json.loads((run_dir / f"dp_icl_answers_eps{eps}.json").read_text())
        assert [a["test_item"] for a in answers["answers"]] == list(range(6))
        labels = [a["label"] for a in answers["answers"]]
        assert set(labels) <= set(load_task_spec(spec_path).label_names)
        correct = sum(a == g for a, g in zip(labels, gold[:6], strict=True))
        assert answers["correct"] == correct and answers["accuracy"] == pytest.approx(correct / 6)
        row = table[table["epsilon"] == eps].iloc[0]
        assert row["calibrated_accuracy_mean"] == pytest.approx(correct / 6)
        assert answers["parameters"]["queries"] == 6 and answers["parameters"]["subsets"] == 4
    # each epsilon its own plan, charged once before its answers
    entries = Ledger().entries("dp-icl-alone")
    assert len(entries) == 2 and {e.purpose for e in entries} == {"dp-icl"}


def test_its_plan_is_sized_to_the_test_items_and_refused_when_it_cannot_be(tiny_lm):
    from dpcore.errors import ConfigError
    from tasks.dp_icl import plans, work
    from tasks.ingest import load_data
    from tasks.run_plans import build_run_plan

    config = tiny_config(dataset_id="dp-icl-plans", methods=["dp-icl"], epsilons=[0.0, 2.0, math.inf], test_size=9,
                         dp_icl_subsets=4, dp_icl_shots=2)
    plan = build_run_plan(config)
    (only,) = plan.method_plans["dp-icl"]
    assert only.epsilon == 2.0 and only.parameters["queries"] == 9 and only.parameters["draws"] == 9
    assert plan.privacy_plans() == [only] and only.composed().epsilon <= 2.0 + 1e-6
    # unset, --test-size is the run's default: every item of this small split
    data = load_data(config)
    unset = build_run_plan(config.model_copy(update={"test_size": None}))
    assert unset.method_plans["dp-icl"][0].parameters["queries"] == len(data.test)
    # its model work (M prompts per draw), in the run's time estimate (`MethodEntry.work`)
    own = work(config, only, labels=4, record_tokens=40).evaluation
    assert own > 0 and plan.work().evaluation >= own
    with pytest.raises(ConfigError, match=r"dp-icl at epsilon 0.001: cannot answer the run's 9 test items .*"
                                          r"raise the epsilon or lower --test-size"):
        plans(config.model_copy(update={"epsilons": [0.001]}), data, 1e-3)
    with pytest.raises(ConfigError, match="--dp-icl-subsets x --dp-icl-shots"):
        plans(config.model_copy(update={"dp_icl_subsets": 200}), data, 1e-3)


def test_a_budget_too_small_for_the_run_refuses_it_before_any_charge(tiny_lm):
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    share_tiny_model(tiny_lm)
    config = tiny_config(dataset_id="dp-icl-budget", methods=["dp-icl"], epsilons=[4.0], test_size=6,
                         dp_icl_subsets=4, dp_icl_shots=2)
    cost = planned_cost(build_run_plan(config).spends(None))
    Ledger().set_budget("dp-icl-budget", cost["epsilon"] / 2, cost["delta"])
    code, _, err = _main(_argv("dp-icl-budget", ["dp-icl"], "4", "--yes"))
    assert code == 3 and "budget" in err.lower()
    assert not Ledger().entries("dp-icl-budget")


def test_run_help_and_methods_validation_name_dp_icl(capsys):
    from flows.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "dp-icl" in capsys.readouterr().out
    code, _, err = _main(_argv("dp-icl-bad", ["dp-icl", "nonesuch"], "4"))
    assert code == 2 and "dp-icl" in err


def test_a_stopped_runs_answers_are_given_once_and_kept(tiny_lm, tmp_path, monkeypatch):
    """`tasks.dp_icl.answer` in a run: stopped before its answers were kept (nothing released), a retry under the
    run answers once under the charge an earlier attempt made and marked; a retry after that rewrites the kept
    answers and draws nothing; without a mark or kept answers a retry is refused."""
    from dpcore.data.artifacts import write_table
    from dpcore.dp_icl.privacy import dp_icl_plan
    from dpcore.errors import DpiclError, RunStopped
    from dpcore.home import private_dir
    from tasks import dp_icl as stage

    share_tiny_model(tiny_lm)
    folder = private_dir() / "test-dp-icl-resume" / tmp_path.name
    rows = [(f"{y}-{i}", f"a {y.lower()} story number {i}", y, "test" if i < 3 else "train")
            for y in ("World", "Sports") for i in range(12)]
    records = write_table(pd.DataFrame(rows, columns=["id", "text", "label", "split"]), folder / "records.parquet")
    plan = dp_icl_plan(4.0, 1e-5, records=18, subsets=2, shots=2, queries=6)

    def call(run: str, charged: bool) -> dict:
        (folder / run / "public").mkdir(parents=True, exist_ok=True)
        return dict(records_path=str(records), task_spec="agnews", epsilon=4.0, delta=1e-5,
                    parameters={k: plan.parameters[k] for k in stage.PUBLIC_PARAMETERS}, vote_mode="calibrated",
                    test_size=6, model="tiny-random", seed=5, noise_charged=charged,
                    public_dir=str(folder / run / "public"), private_dir=str(folder / run))

    real = stage.answer_queries
    monkeypatch.setattr(stage, "answer_queries", lambda *a, **k: (_ for _ in ()).throw(RunStopped("stopped")))
    stage.keep_charged(call("run", True))
    with pytest.raises(RunStopped):
        stage.answer.fn(**call("run", True))
    assert not list((folder / "run" / "public").iterdir())  # nothing released
    monkeypatch.setattr(stage, "answer_queries", real)
    first = stage.answer.fn(**call("run", False))  # the earlier attempt's charge, marked: answered once
    written = json.loads(Path(first["path"]).read_text())
    assert [a["test_item"] for a in written["answers"]] == list(range(6))
    monkeypatch.setattr(stage, "answer_queries", lambda *a, **k: pytest.fail("answered twice"))
    again = stage.answer.fn(**call("run", False))
    assert again == first and json.loads(Path(again["path"]).read_text()) == written
    with pytest.raises(DpiclError, match="did not charge the spend"):
        stage.answer.fn(**call("never-charged", False))
