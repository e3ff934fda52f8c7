"""The method registry (`tasks.methods`, `flows.methods`): every method listed and resolved, the registered
methods' plans in the run plan, their artifacts through the release gate (the tiny run of every method in one
plan and one charge, a row each: tests/test_compare.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import mini_agnews, prefect_harness, share_tiny_model, tiny_config  # noqa: F401

from dpcore.config import RunConfig
from dpcore.names import METHODS, PREDICTION_METHODS
from dpcore.privacy.ledger import Ledger


def test_the_registry_lists_every_method_and_each_entry_resolves():
    from flows.methods import MethodFlow, method_flow
    from tasks.methods import REGISTRY, MethodEntry, entry, register

    assert tuple(REGISTRY)[:len(METHODS)] == METHODS  # every method --methods names, in the registry's order
    assert set(REGISTRY) <= set(METHODS) | set(PREDICTION_METHODS)
    for name, method in REGISTRY.items():
        assert method.name == name and method.title
        if method.config_section:  # its RunConfig section, declared in its subsystem (dpcore/<method>/config.py)
            section = type(getattr(RunConfig(), method.config_section))
            assert section.__module__ == f"dpcore.{method.config_section}.config", name
            assert all(section.flat_name(field) in RunConfig.flat_names() for field in section.model_fields), name
        if name in METHODS or method.subflow is not None:  # every --methods name runs through the protocol
            assert isinstance(method_flow(name), MethodFlow)
        assert method.artifacts
    # the registered (non-built-in) methods plan themselves and name a results table of their own
    assert {n for n, m in REGISTRY.items() if m.plan is not None} >= {"adadpsyn", "dp-opt"}
    from dpcore.errors import ConfigError

    with pytest.raises(ConfigError, match="twice"):
        register(MethodEntry("tang", "again", None, None, None, ("x",), False))
    with pytest.raises(ConfigError, match="dpcore.names"):
        register(MethodEntry("no-such-method", "x", None, None, None, ("x",), False))
    with pytest.raises(ConfigError, match="none of"):
        entry("no-such-method")


def test_each_registered_method_plans_its_epsilons_and_the_run_plan_charges_them(tiny_lm):
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    config = tiny_config(dataset_id="methods-plan", **FIELDS)
    plan = build_run_plan(config)
    assert list(plan.method_plans) == ["tang", "adadpsyn", "dp-opt"]  # every named method, in the registry's order
    registered = {name: plan.method_plan(name) for name in ("adadpsyn", "dp-opt")}
    for name, plans in registered.items():
        assert [p.epsilon for p in plans] == [4.0] and all(p.method == name for p in plans)
    in_run = {id(p) for p in plan.privacy_plans()}
    assert all(id(p) in in_run for plans in registered.values() for p in plans)
    cost = planned_cost(plan.spends("methods-plan"))
    assert set(cost["methods"]) >= {"tang", "adadpsyn", "dp-opt"}
    assert all(eps <= 4.0 + 1e-6 for eps in cost["methods"].values())
    # epsilon 0 and inf give them no plan: their artifacts are public, so only DP ones are made
    both = build_run_plan(tiny_config(dataset_id="methods-plan", **{**FIELDS, "epsilons": [0.0, 4.0, math.inf]}))
    assert {name: [p.epsilon for p in both.method_plan(name)] for name in ("adadpsyn", "dp-opt")} == {
        "adadpsyn": [4.0], "dp-opt": [4.0]}
    # a method the run does not name is not planned
    alone = build_run_plan(tiny_config(dataset_id="methods-plan", **{**FIELDS, "methods": ["tang"]}))
    assert list(alone.method_plans) == ["tang"] and alone.method_plan("adadpsyn") is None
    # the run's time estimate counts their model work (generation and evaluation), from public sizes
    assert plan.work().generation > alone.work().generation and plan.work().evaluation > alone.work().evaluation


FIELDS = dict(
    methods=["tang", "adadpsyn", "dp-opt"], epsilons=[4.0], audit=False, audit_reference=False,
    baselines=["zero-shot"], seeds=1, test_size=6, seed=11, dp_opt_preset="cpu", dp_opt_max_tokens=3,
)


# The release path's audit (its mechanics are under test, not its power; tests/test_release_methods.py sizes its
# own alike): 12 independent trials of 4 members against 3 of the 40 held-out test records, whose 36 draws never
# re-score a record, the band nearly [0, 1]: a prompt that leaks nothing concludes (passes) all but about 4 times
# in 10^5 (`test_the_release_audit_concludes_when_nothing_leaks`). Each record's first 8 tokens only.
TINY_AUDIT_FIELDS = dict(trials=12, members=4, non_members=3, reference_prompts=0, auc_tolerance=0.49,
                         max_record_tokens=8, test="equivalence")


def test_the_release_audit_concludes_when_nothing_leaks():
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run

    f = TINY_AUDIT_FIELDS
    design = audit_design.plan(400, 40, members=f["members"], non_members=f["non_members"], trials=f["trials"],
                               attacks=len(attacks_run(f["reference_prompts"])), confidence=0.95,
                               tolerance=f["auc_tolerance"], test=f["test"])
    assert design.independent_trials == f["trials"] and 1 - design.conclusive_probability < 1e-4


@pytest.mark.usefixtures("prefect_harness")
def test_adadpsyn_and_dp_opt_artifacts_go_through_the_release_gate(tiny_lm, capsys, tmp_path):
    """A run of the two methods with cryptographic noise: each artifact is audited, passes the gate on its plan's
    ledger entries and is released; DP-OPT's release is its instruction (text), which `dpicl export` and
    `dpicl predict` use; a seeded run is refused."""
    from dpcore.audit.config import AuditConfig
    from dpcore.errors import ReleaseRefusedError
    from dpcore.release import gate
    from flows.cli import main
    from flows.pipeline import run_pipeline
    from flows.release import release

    share_tiny_model(tiny_lm)
    fields = {**FIELDS, "methods": ["adadpsyn", "dp-opt"], "seed": None}
    # With fresh noise, DP-OPT's vote may end the instruction at its first token on the tiny model: such a run
    # has nothing to release (the gate refuses it: `dpcore.release.gate.release_failures`); another run follows.
    for attempt in range(1, 6):
        run_id = "methods-release" if attempt == 1 else f"methods-release-{attempt}"
        summary = run_pipeline(tiny_config(dataset_id="methods-release", **fields), run_id=run_id)
        written = json.loads((Path(summary["run_dir"]) / "dp_opt_instruction_eps4.json").read_text())["instruction"]
        if written.strip():
            break
    assert {row["method"] for row in summary["results"]} == {"adadpsyn", "dp-opt"}
    audit = AuditConfig(**TINY_AUDIT_FIELDS)
    # the run's one charge covered one draw of each: another attempt under the run id continues from the steps
    # each kept (all of them), so it draws no fresh noise and writes the same artifacts, charging nothing
    entries = len(Ledger().entries("methods-release"))
    demos = pd.read_parquet(Path(summary["run_dir"]) / "adadpsyn_demos_eps4.parquet")["text"].tolist()
    again = run_pipeline(tiny_config(dataset_id="methods-release", **fields), run_id=run_id)
    assert json.loads((Path(again["run_dir"]) / "dp_opt_instruction_eps4.json").read_text())["instruction"] == written
    assert pd.read_parquet(Path(again["run_dir"]) / "adadpsyn_demos_eps4.parquet")["text"].tolist() == demos
    assert len(Ledger().entries("methods-release")) == entries

    released = release(run_id=run_id, method="dp-opt", audit_config=audit, seed=11)
    assert released["method"] == "dp-opt" and released["artifact"] == "dp-opt-eps4" and released["epsilon"] == 4.0
    folder = Path(released["release_dir"])
    manifest = json.loads((folder / "release.json").read_text())
    instruction = json.loads((Path(summary["run_dir"]) / "dp_opt_instruction_eps4.json").read_text())["instruction"]
    assert manifest["instruction"] == instruction and manifest["demos"] == []
    assert manifest["task_spec"]["icl"]["instruction"] == instruction.strip()
    assert manifest["audit"]["passed"] is True and {s["purpose"] for s in manifest["spends"]} == {"dp-opt"}
    assert len(manifest["ledger_entries"]) == len(manifest["spends"])
    assert json.loads((folder / gate.INSTRUCTION_FILE).read_text()) == {"instruction": instruction}
    capsys.readouterr()
    assert main(["export", "--release", "production", "--dataset-id", "methods-release"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["method"] == "dp-opt" and exported["instruction"] == instruction and exported["shots"] == 0
    assert exported["prompt_prefix"].startswith(instruction.strip())
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "The striker scored twice in the final."}\n')
    out = tmp_path / "answers.jsonl"
    assert main(["predict", "--release", "production", "--input", str(queries), "--out", str(out),
                 "--dataset-id", "methods-release"]) == 0
    assert json.loads(out.read_text())["prediction"] in {"World", "Sports", "Business", "Technology"}

    released = release(run_id=run_id, method="adadpsyn", audit_config=audit, seed=11)
    manifest = json.loads((Path(released["release_dir"]) / "release.json").read_text())
    demos = pd.read_parquet(Path(summary["run_dir"]) / "adadpsyn_demos_eps4.parquet")
    assert manifest["method"] == "adadpsyn" and [d["text"] for d in manifest["demos"]] == list(demos["text"])
    assert manifest["audit"]["passed"] is True and manifest["spends"][0]["purpose"] == "adadpsyn"
    assert manifest["noise_multiplier"] == pytest.approx(demos["noise_multiplier"].iloc[0])

    # a fixed-seed run of the same methods is an experiment: refused
    run_pipeline(tiny_config(dataset_id="methods-release", **{**fields, "seed": 5}), run_id="methods-seeded")
    with pytest.raises(ReleaseRefusedError, match="fixed seed"):
        release(run_id="methods-seeded", method="dp-opt", audit_config=audit, seed=11)


def test_where_to_look_next_names_every_method_of_the_run():
    from flows.cli.run import format_next

    summary = {"run_id": "R", "run_dir": "D", "dataset": "x", "method_audits": []}
    several = format_next({**summary, "methods": ["tang", "adadpsyn", "dp-opt"]})
    assert "dpicl release --run R [--method tang|adadpsyn|dp-opt]" in several
    assert "--method adadpsyn|dp-opt --audit-only" in several  # audited at their release, not by the run
    alone = format_next({**summary, "methods": ["dp-opt"]})
    assert "dpicl release --run R --method dp-opt   #" in alone
    assert "[--method" not in format_next({**summary, "methods": ["tang"]})
