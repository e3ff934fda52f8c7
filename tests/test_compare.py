"""Every private-prompting method in one run (`dpicl run --methods tang,pate,dpsgd,dp-icl,adadpsyn,dp-opt`) on the
tiny model: one plan over every method, charged in one transaction, whose composed epsilon (the line printed
before anything ran) is what the ledger charges; the results name each method on the same test split; a plan over
budget is refused before anything runs (exit 3), although each method alone would fit."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import mini_agnews, prefect_harness, share_tiny_model, tiny_config  # noqa: F401

from dpcore.privacy.ledger import Ledger

pytestmark = pytest.mark.usefixtures("prefect_harness")

SIX = ["tang", "pate", "dpsgd", "dp-icl", "adadpsyn", "dp-opt"]
METHOD_FIELDS = dict(
    methods=SIX, epsilons=[4.0], audit=False, audit_reference=False,
    baselines=["zero-shot"], dp_opt_preset="cpu", dp_opt_max_tokens=3,
    seeds=1, test_size=6, seed=11,
    pate_teachers=6, pate_queries=10, pate_sigma1=5.0, pate_sigma2=5.0, pate_repeats=1, pate_public="ood",
    pate_student_candidates=3,
    dpsgd_length=2, dpsgd_steps=2, dpsgd_batch_size=8, dpsgd_validation_size=10,
    dp_icl_subsets=4, dp_icl_shots=2,  # q = 8 / |D|: a small ensemble for the tiny model
)


def _argv(dataset_id: str, *extra: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    argv = ["run", "--task-spec", spec_path, "--data-path", data_path, "--dataset", "agnews-mini",
            "--dataset-id", dataset_id, "--model", "tiny-random", "--methods", ",".join(SIX), "--epsilons", "4",
            "--no-audit", "--no-audit-reference", "--baselines", "zero-shot", "--seeds", "1", "--test-size", "6",
            "--seed", "11", "--pate-teachers", "6", "--pate-queries", "10", "--pate-sigma1", "5",
            "--pate-sigma2", "5", "--pate-repeats", "1", "--pate-public", "ood", "--pate-student-candidates", "3",
            "--dpsgd-length", "2", "--dpsgd-steps", "2", "--dpsgd-batch-size", "8", "--dpsgd-validation-size", "10",
            "--num-subsets", "2", "--subset-size", "1", "--top-k", "20", "--max-tokens", "4", "--shots", "4",
            "--dp-opt-preset", "cpu", "--dp-opt-max-tokens", "3", "--dp-icl-subsets", "4", "--dp-icl-shots", "2"]
    return argv + list(extra)


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


def test_the_plan_of_every_method_is_what_the_ledger_charges(tiny_lm, capsys, monkeypatch):
    import dpcore.data.datasets
    import tasks.audit
    import tasks.ingest
    import tasks.run_plans
    from flows.cli import main
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    share_tiny_model(tiny_lm)
    config = tiny_config(dataset_id="compare-json", **METHOD_FIELDS)
    spends = build_run_plan(config).spends("compare-run")
    cost = planned_cost(spends)
    assert set(cost["methods"]) == set(SIX)
    # composition is subadditive here, never larger than the sum of the parts
    assert max(cost["methods"].values()) < cost["epsilon"] <= sum(cost["methods"].values()) + 1e-6

    # The run is planned once: its dataset loaded once and its audit designed once, for every method. The audit is
    # on, at sizes these few records cannot make conclusive: designed, said, skipped (nothing of it charged).
    loads = _counting(monkeypatch, [dpcore.data.datasets, tasks.ingest], "load_dataset")
    designs = _counting(monkeypatch, [tasks.audit, tasks.run_plans], "run_audit_design")
    argv = [a for a in _argv("compare-json", "--run-id", "compare-run", "--json") if a != "--no-audit"] + ["--audit"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert len(loads) == 1, loads
    assert len(designs) == 1, designs
    assert "audit skipped:" in captured.err
    summary = json.loads(captured.out)
    assert summary["methods"] == SIX
    assert math.isclose(summary["planned_cost"]["epsilon"], cost["epsilon"], rel_tol=1e-9)
    # one transaction charged every method's spends; the ledger's composed spend is the plan's, and the line said
    # before anything ran
    assert summary["ledger"]["charged"] == len(spends)
    spent = Ledger().spend("compare-json", delta=cost["delta"])
    assert math.isclose(spent.epsilon, cost["epsilon"], rel_tol=1e-6)
    printed = re.search(r"^plan: epsilon (\S+) at delta", captured.err, re.MULTILINE).group(1)
    assert f"{spent.epsilon:.4g}" == printed
    assert {e.purpose for e in spent.entries} == {"pipeline", "pate", "dpsgd", "dp-icl", "adadpsyn", "dp-opt"}
    assert {e.run_id for e in spent.entries} == {"compare-run"}

    methods = {row["method"] for row in summary["results"]}
    assert set(SIX) | {"zero-shot"} <= methods
    rows = {row["method"]: row for row in summary["results"]}
    assert all(rows[m]["epsilon"] == 4.0 for m in ("tang", "dpsgd", "dp-icl", "adadpsyn", "dp-opt"))
    assert all(rows[m]["delta"] == pytest.approx(cost["delta"], rel=1e-3) for m in ("dp-icl", "adadpsyn", "dp-opt"))
    assert rows["pate"]["epsilon"] > 0 and "epsilon_reported" not in rows["pate"]
    assert all(rows[m]["n"] == 6 for m in rows)  # the same items
    # DP-ICL's answers (calibrated votes) are one accuracy per epsilon; its subset key stays in the private store
    assert 0.0 <= rows["dp-icl"]["calibrated_accuracy_mean"] <= 1.0
    assert summary["method_summaries"]["dp-icl"]["results"][0]["noise_multiplier"] > 0
    # each method's wall time depends on its private records: kept in the private run folder only
    assert not any("wall_seconds" in row for row in summary["results"]) and "method_wall_seconds" not in summary
    timings = json.loads((Path(summary["private_run_dir"]) / "timings.json").read_text())["method_wall_seconds"]
    assert set(timings) == set(SIX) and all(w >= 0 for w in timings.values())
    # did the private data pay: the best of the three at epsilon 4 as each is used, against calibrated zero-shot
    (verdict,) = summary["private_data_verdict"]["epsilons"]
    used = {"tang": rows["tang"]["calibrated_accuracy_mean"], "pate": rows["pate"]["calibrated_accuracy_mean"],
            "dpsgd": rows["dpsgd"]["accuracy_mean"], "adadpsyn": rows["adadpsyn"]["calibrated_accuracy_mean"],
            "dp-opt": rows["dp-opt"]["calibrated_accuracy_mean"], "dp-icl": rows["dp-icl"]["calibrated_accuracy_mean"]}
    used = {method: accuracy for method, accuracy in used.items() if accuracy is not None}  # a row may have none
    assert verdict["epsilon"] == 4.0 and verdict["accuracy"] == max(used.values()) == used[verdict["method"]]
    assert verdict["zero_shot_calibrated"] == rows["zero-shot"]["calibrated_accuracy_mean"] and verdict["n"] == 6
    run_dir = Path(summary["run_dir"])
    table = pd.read_parquet(run_dir / "comparison.parquet")
    assert list(table["method"]).count("zero-shot") == 1
    # DP few-shot generation evaluated zero-shot on these test items: PromptPATE did not evaluate it again
    assert "zero-shot" not in summary["method_summaries"]["pate"].get("baselines", {})
    assert (run_dir / "comparison.png").stat().st_size > 0
    assert {"pate_results.parquet", "dpsgd_results.parquet", "demos.parquet", "adadpsyn_results.parquet",
            "dp_opt_results.parquet", "adadpsyn_demos_eps4.parquet", "dp_opt_instruction_eps4.json",
            "adadpsyn_plan.json", "dp_opt_plan.json", "dp_icl_results.parquet",
            "dp_icl_answers_eps4.json"} <= {p.name for p in run_dir.iterdir()}
    assert {"adadpsyn", "dp-opt", "dp-icl"} <= set(table["method"])
    assert not list(run_dir.glob("*.bin")) and (Path(summary["private_run_dir"]) / "dp_icl_key_eps4.bin").exists()
    assert set(pd.read_parquet(run_dir / "adadpsyn_demos_eps4.parquet")["method"]) == {"adadpsyn"}
    from dpcore.data.artifacts import verify_manifest

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert {"comparison.parquet", "comparison.png", "pate_results.parquet", "demos.parquet"} <= set(manifest["files"])
    assert manifest["run_id"] == "compare-run" and not verify_manifest(run_dir)
    # MLflow: a parent comparison run with a nested run per (method, epsilon) row
    from tasks.tracking import mlflow_client

    client = mlflow_client()
    parent = client.get_run(summary["mlflow_comparison_run_id"])
    assert parent.data.metrics["planned_epsilon"] == pytest.approx(cost["epsilon"])
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {c.info.run_name for c in children} >= {"tang-eps4", "dpsgd-eps4", "zero-shot-eps0", "adadpsyn-eps4",
                                                   "dp-opt-eps4"}


def test_a_plan_over_budget_is_refused_before_anything_runs(tiny_lm, capsys):
    from flows.cli import main
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    share_tiny_model(tiny_lm)
    config = tiny_config(dataset_id="compare-budget", **METHOD_FIELDS)
    cost = planned_cost(build_run_plan(config).spends(None))
    # every method alone fits the budget; all three together do not
    budget = (max(cost["methods"].values()) + cost["epsilon"]) / 2
    Ledger().set_budget("compare-budget", budget, cost["delta"])
    assert main(_argv("compare-budget", "--yes")) == 3
    assert "budget" in capsys.readouterr().err.lower()
    assert not Ledger().entries("compare-budget")


def test_only_the_named_methods_run(tiny_lm, capsys):
    from flows.pipeline import run_pipeline

    share_tiny_model(tiny_lm)
    # the audit on, the method audits off (`dpicl demo`'s choice): nothing is audited
    fields = {**METHOD_FIELDS, "methods": ["pate"], "audit": True, "audit_methods": False}
    summary = run_pipeline(tiny_config(dataset_id="compare-pate-only", **fields), run_id="compare-pate-only")
    # without DP few-shot generation, PromptPATE evaluates the zero-shot row itself
    assert {row["method"] for row in summary["results"]} == {"pate", "zero-shot"}
    assert summary["method_audits"] == []
    assert not (Path(summary["run_dir"]) / "audit_pate.parquet").exists()
    assert {e.purpose for e in Ledger().entries("compare-pate-only")} == {"pate"}
    run_dir = Path(summary["run_dir"])
    assert not (run_dir / "demos.parquet").exists()
    assert summary["audit"] == {"ran": False}


def test_pate_reports_every_smaller_epsilon_from_one_labelling_charged_once(tiny_lm):
    """A comparison at epsilons 1, 2, 3, 8: PromptPATE labels its queries once (charged for all of them) and
    reports each smaller epsilon from the first Q_i answers of every repeat, Q_i the most that epsilon
    affords; a checkpoint's students use only those queries. Epsilons at or above the run's own, or that
    afford no query per repeat, get no row."""
    from dpcore.pate.privacy import data_independent_epsilon
    from dpcore.privacy.composition import compose
    from flows.pipeline import run_pipeline

    share_tiny_model(tiny_lm)
    fields = {**METHOD_FIELDS, "methods": ["pate"], "epsilons": [1.0, 2.0, 3.0, 8.0], "pate_sigma1": 5.0,
              "pate_sigma2": 5.0, "pate_threshold": 0.0, "pate_repeats": 2}
    summary = run_pipeline(tiny_config(dataset_id="compare-pate-checkpoints", **fields),
                           run_id="compare-pate-checkpoints")
    pate = summary["method_summaries"]["pate"]
    delta = pate["delta"]
    assert pate["queries"] == 10 and pate["epsilon"] == pytest.approx(data_independent_epsilon(5, 5, 20, delta))
    assert 3.0 < pate["epsilon"] < 8.0
    checkpoints = {c["epsilon"]: c for c in pate["checkpoints"]}
    assert set(checkpoints) == {2.0, 3.0}  # 1 affords no query per repeat; 8 is above the run's own epsilon
    for eps, c in checkpoints.items():
        assert c["epsilon_data_independent"] == pytest.approx(data_independent_epsilon(5, 5, 2 * c["queries"], delta))
        assert c["epsilon_data_independent"] <= eps < data_independent_epsilon(5, 5, 2 * (c["queries"] + 1), delta)
        assert len(c["answered"]) == 2 and all(a <= c["queries"] for a in c["answered"])
    rows = [r for r in summary["results"] if r["method"] == "pate"]
    assert sorted(r["epsilon"] for r in rows) == pytest.approx([2.0, 3.0, pate["epsilon"]], rel=1e-6)

    # charged once, for the whole labelling: the two Gaussian spends of 2 x 10 queries
    entries = Ledger().entries("compare-pate-checkpoints")
    assert len(entries) == 2 and {e.steps for e in entries} == {20}
    assert compose([e.event for e in entries], delta).epsilon == pytest.approx(pate["epsilon"])

    run_dir = Path(summary["run_dir"])
    queries = pd.read_parquet(run_dir / "pate_queries.parquet").reset_index(drop=True)
    students = pd.read_parquet(run_dir / "pate_students_checkpoints.parquet")
    assert set(students["epsilon"]) <= {2.0, 3.0} and len(students)
    for (eps, _repeat), prompt in students.groupby(["epsilon", "repeat"]):
        first = set(queries["text"].iloc[:checkpoints[eps]["queries"]])
        assert set(prompt["text"]) <= first


def test_an_audited_comparison_gives_every_method_its_audit_verdict(tiny_lm):
    """With the audit on, PromptPATE's student and PromptDPSGD's prompts are audited like the DP demos (the
    release audit: nothing generated, nothing charged) and their verdict fills the comparison's audit column
    (the AUCs are statistics of private records: private store only)."""
    from flows.pipeline import run_pipeline

    share_tiny_model(tiny_lm)
    # 8 members per trial, more than PromptPATE's 6 one-shot teachers read: its audit draws the 6 it read
    fields = {**METHOD_FIELDS, "methods": ["pate", "dpsgd"], "pate_threshold": 0.0, "audit": True,
              "audit_trials": 4, "audit_members": 8, "audit_reference": False}
    summary = run_pipeline(tiny_config(dataset_id="compare-audited", **fields), run_id="compare-audited")
    audits = {(a["method"], a["epsilon"]): a for a in summary["method_audits"]}
    assert set(audits) == {("pate", summary["method_summaries"]["pate"]["epsilon"]), ("dpsgd", 4.0)}
    assert all(a["verdict"] in ("passed", "inconclusive", "failed") and "auc" not in a for a in audits.values())
    rows = {(r["method"], r["epsilon"]): r for r in summary["results"] if r["method"] in ("pate", "dpsgd")}
    assert rows[("dpsgd", 4.0)]["audit"] == audits[("dpsgd", 4.0)]["verdict"]
    pate_row = next(r for (m, _), r in rows.items() if m == "pate")
    assert pate_row["audit"] == audits[next(k for k in audits if k[0] == "pate")]["verdict"]
    # the audit spent nothing: the ledger holds the methods' own spends only
    assert {e.purpose for e in Ledger().entries("compare-audited")} == {"pate", "dpsgd"}
    run_dir = Path(summary["run_dir"])
    assert {"audit_pate.parquet", "audit_dpsgd.parquet"} <= {p.name for p in run_dir.iterdir()}
    members = {m: json.loads(pd.read_parquet(run_dir / f"audit_{m}.parquet")["audit_config"].iloc[-1])["members"]
               for m in ("pate", "dpsgd")}
    # PromptPATE's 6 teachers' records (a public count); PromptDPSGD's at most the 8 asked, capped to a public
    # lower bound on the records its Poisson batches drew (never the realised count)
    assert members["pate"] == 6 and 1 <= members["dpsgd"] <= 8
    assert {"audit_pate.parquet", "audit_dpsgd.parquet"} <= set(json.loads((run_dir / "manifest.json").read_text())
                                                                ["files"])
