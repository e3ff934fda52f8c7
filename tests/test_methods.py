"""The method registry (`tasks.methods`, `flows.methods`) and a tiny run of the registered prompt-producing
methods beside tang (`dpicl run --methods tang,adadpsyn,dp-opt`): one plan, one ledger charge whose composed
epsilon is the plan's, one row per method on the same test items."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import mini_agnews, prefect_harness, share_tiny_model, tiny_config  # noqa: F401

from dpcore.config import RunConfig
from dpcore.names import METHODS
from dpcore.privacy.ledger import Ledger


def test_the_registry_lists_every_method_and_each_entry_resolves():
    from flows.methods import MethodFlow, method_flow
    from tasks.methods import REGISTRY, MethodEntry, entry, register

    assert tuple(REGISTRY) == METHODS
    for name, method in REGISTRY.items():
        assert method.name == name and method.title
        if method.config_prefix:  # its RunConfig section is declared in dpcore/config.py
            assert any(field.startswith(method.config_prefix) for field in RunConfig.model_fields), name
        assert isinstance(method_flow(name), MethodFlow)  # every method runs through the protocol
        assert method.artifacts
    # the registered (non-built-in) methods plan themselves and name a results table of their own
    assert {n for n, m in REGISTRY.items() if m.plan is not None} >= {"adadpsyn", "dp-opt"}
    from dpcore.errors import ConfigError

    with pytest.raises(ConfigError, match="twice"):
        register(MethodEntry("tang", "again", "", None, None, ("x",), False))
    with pytest.raises(ConfigError, match="dpcore.names"):
        register(MethodEntry("no-such-method", "x", "", None, None, ("x",), False))
    with pytest.raises(ConfigError, match="none of"):
        entry("no-such-method")


def test_each_registered_method_plans_its_epsilons_and_the_run_plan_charges_them(tiny_lm):
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    config = tiny_config(dataset_id="methods-plan", **FIELDS)
    plan = build_run_plan(config)
    assert set(plan.method_plans) == {"adadpsyn", "dp-opt"}
    for name, plans in plan.method_plans.items():
        assert [p.epsilon for p in plans] == [4.0] and all(p.method == name for p in plans)
    in_run = {id(p) for p in plan.privacy_plans()}
    assert all(id(p) in in_run for plans in plan.method_plans.values() for p in plans)
    cost = planned_cost(plan.spends("methods-plan"))
    assert set(cost["methods"]) >= {"tang", "adadpsyn", "dp-opt"}
    assert all(eps <= 4.0 + 1e-6 for eps in cost["methods"].values())
    # a method the run does not name is not planned
    assert build_run_plan(tiny_config(dataset_id="methods-plan", **{**FIELDS, "methods": ["tang"]})).method_plans == {}


FIELDS = dict(
    methods=["tang", "adadpsyn", "dp-opt"], epsilons=[4.0], audit=False, audit_reference=False,
    baselines=["zero-shot"], seeds=1, test_size=6, seed=11, dp_opt_preset="cpu", dp_opt_max_tokens=3,
)


def _argv(dataset_id: str, *extra: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    argv = ["run", "--task-spec", spec_path, "--data-path", data_path, "--dataset", "agnews-mini",
            "--dataset-id", dataset_id, "--model", "tiny-random", "--methods", "tang,adadpsyn,dp-opt",
            "--epsilons", "4", "--no-audit", "--no-audit-reference", "--baselines", "zero-shot", "--seeds", "1",
            "--test-size", "6", "--seed", "11", "--dp-opt-preset", "cpu", "--dp-opt-max-tokens", "3",
            "--num-subsets", "2", "--subset-size", "1", "--top-k", "20", "--max-tokens", "4", "--shots", "4"]
    return argv + list(extra)


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_of_tang_adadpsyn_and_dp_opt_charges_once_and_reports_a_row_each(tiny_lm, capsys):
    from flows.cli import main
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    share_tiny_model(tiny_lm)
    config = tiny_config(dataset_id="methods-run", **FIELDS)
    spends = build_run_plan(config).spends("methods-run")
    cost = planned_cost(spends)

    assert main(_argv("methods-run", "--run-id", "methods-run", "--json")) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["methods"] == ["tang", "adadpsyn", "dp-opt"]
    assert math.isclose(summary["planned_cost"]["epsilon"], cost["epsilon"], rel_tol=1e-9)
    # ONE charge held every spend of every method; the ledger's total is the printed plan's epsilon
    assert summary["ledger"]["charged"] == len(spends)
    spent = Ledger().spend("methods-run", delta=cost["delta"])
    assert math.isclose(spent.epsilon, cost["epsilon"], rel_tol=1e-6)
    assert {e.purpose for e in spent.entries} == {"pipeline", "adadpsyn", "dp-opt"}
    assert len(Ledger().entries("methods-run")) == len(spends)
    # a row per method, each with method, epsilon, delta and accuracy, on the same test items
    rows = {row["method"]: row for row in summary["results"]}
    assert {"tang", "adadpsyn", "dp-opt", "zero-shot"} <= set(rows)
    for method in ("tang", "adadpsyn", "dp-opt"):
        assert rows[method]["epsilon"] == 4.0 and rows[method]["delta"] == pytest.approx(cost["delta"], rel=1e-3)
        assert rows[method]["accuracy_mean"] is not None and rows[method]["n"] == 6
    run_dir = Path(summary["run_dir"])
    table = pd.read_parquet(run_dir / "comparison.parquet")
    assert {"adadpsyn", "dp-opt"} <= set(table["method"])
    demos = pd.read_parquet(run_dir / "adadpsyn_demos_eps4.parquet")
    assert set(demos["method"]) == {"adadpsyn"} and len(demos)
    instruction = json.loads((run_dir / "dp_opt_instruction_eps4.json").read_text())
    assert instruction["method"] == "dp-opt" and isinstance(instruction["instruction"], str)
    assert {"adadpsyn_results.parquet", "dp_opt_results.parquet"} <= {p.name for p in run_dir.iterdir()}
    timings = json.loads((Path(summary["private_run_dir"]) / "timings.json").read_text())["method_wall_seconds"]
    assert set(timings) == {"tang", "adadpsyn", "dp-opt"}
    # a second attempt of the same run id charges nothing new and draws no fresh noise for them: refused
    assert main(_argv("methods-run", "--run-id", "methods-run", "--json")) != 0
    capsys.readouterr()
    assert len(Ledger().entries("methods-run")) == len(spends)
