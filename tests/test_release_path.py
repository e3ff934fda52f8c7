"""One release path for every method, and one name per method.

- tang, pate and dpsgd releases go through the same gate (`tasks.release.check_gate` -> `gate.evidence` ->
  `gate.release_failures`) and the same manifest; the flow calls that one gate for each;
- a run folder, table or flag written with DP few-shot generation's old name `dp` reads as `tang`, without
  a warning; everything written says `tang`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

from dpcore.data.artifacts import RUN_INPUTS_FILE, read_table, write_manifest, write_table
from dpcore.errors import ConfigError
from dpcore.home import dpicl_home
from dpcore.pate.release import PATE_PLAN_FILE
from dpcore.release import gate
from tasks.methods import release_spec

DELTA = 1e-3


def _run_folder(run_id: str) -> Path:
    folder = dpicl_home() / "runs" / "release-path" / ("0" * 12) / run_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _tang_run(run_id: str, method_column: str = "dp", config: dict | None = None, inputs: dict | None = None) -> Path:
    """A finished pipeline run's public tables; `method_column` as an older dpicl wrote it; `config` its manifest's
    configuration; `inputs` its `run_inputs.json` (none: a run made before runs kept their inputs)."""
    folder = _run_folder(run_id)
    if inputs is not None:
        (folder / RUN_INPUTS_FILE).write_text(json.dumps(inputs))
    write_table(pd.DataFrame({"method": [method_column, method_column, "zero-shot"], "epsilon": [4.0, 4.0, 0.0],
                              "label": ["World", "Sports", "World"], "text": ["a", "b", "c"],
                              "seeded_noise": [False, False, False], "sampler": ["poisson"] * 3}),
                folder / "demos.parquet")
    write_table(pd.DataFrame([{"epsilon": 4.0, "method": method_column, "mechanism": "gaussian",
                               "noise_multiplier": 1.2, "sampling_rate": 0.01, "steps": 20, "delta": DELTA,
                               "crosscheck_agreed": True}]), folder / "calibration.parquet")
    write_manifest(folder, extra={"run_id": run_id, "dataset": "agnews", "model": "tiny", "config": config or {}})
    return folder


def _pate_run(run_id: str) -> Path:
    from dpcore.pate.privacy import pate_plan

    folder = _run_folder(run_id)
    plan = pate_plan(epsilon_target=None, delta=DELTA, queries=24, threshold_sigma=1.0, vote_sigma=2.0, teachers=16,
                     threshold=10).to_dict()
    write_table(pd.DataFrame({"repeat": [0, 0], "position": [0, 1], "text": ["q1", "q2"], "label": ["World", "Sports"]}),
                folder / "pate_students.parquet")
    (folder / PATE_PLAN_FILE).write_text(json.dumps({
        "method": "pate", "run_id": run_id, "dataset": "agnews", "dataset_id": "agnews", "data_hash": "0" * 64,
        "model": "tiny", "task_spec": "agnews", "seeded_noise": False, "best_repeat": 0, "plan": plan}))
    write_manifest(folder, extra={"run_id": run_id, "dataset": "agnews"})
    return folder


def _dpsgd_run(run_id: str) -> Path:
    folder = _run_folder(run_id)
    (folder / "prompts").mkdir(exist_ok=True)
    (folder / "prompts" / "dpsgd-eps8-0.safetensors").write_bytes(b"tensors")
    (folder / "prompts" / "dpsgd-eps8-0.json").write_text(json.dumps({
        "epsilon": 8.0, "training": 0, "noise_multiplier": 0.9, "sampling_rate": 0.05, "steps": 30, "delta": DELTA,
        "seeded_noise": False, "model": "tiny", "model_weights_sha256": "0" * 64, "method": "dpsgd"}))
    write_manifest(folder, extra={"run_id": run_id, "dataset": "agnews"})
    return folder


RUNS = {"tang": _tang_run, "pate": _pate_run, "dpsgd": _dpsgd_run}


# --------------------------------------------------------------------------- one path


def test_every_method_is_judged_by_the_one_gate(monkeypatch):
    from tasks.release import check_gate

    judged = []
    evidence = gate.evidence

    def spy(artifact, entries):
        judged.append(artifact.method)
        return evidence(artifact, entries)

    monkeypatch.setattr(gate, "evidence", spy)
    for method, make in RUNS.items():
        make(f"one-gate-{method}")
        checked = check_gate.fn(f"one-gate-{method}", method)
        # nothing audited, nothing charged: the same conditions refuse every method
        assert "no membership-inference audit" in checked["refused"], checked["refused"]
        assert "no privacy-ledger entry" in checked["refused"], checked["refused"]
        assert checked["method"] == method and checked["selector"]
    assert judged == ["tang", "pate", "dpsgd"]


def test_the_release_flow_calls_one_gate_and_one_register_for_every_method(monkeypatch):
    from flows.release import audited_release
    from tasks import release as release_stage

    calls = []
    monkeypatch.setattr(release_stage, "audit_artifact", lambda *a, **k: calls.append(("audit", a[1])) or {})
    monkeypatch.setattr(release_stage, "check_gate", lambda run_id, method, before_audit=False, **selector: calls.append(
        ("gate before the audit" if before_audit else "gate", method)) or {"refused": None, "selector": {"epsilon": 1.0}})
    monkeypatch.setattr(release_stage, "register", lambda run_id, method, alias, **selector: calls.append(
        ("register", method)) or {"method": method})
    for method in ("tang", "pate", "dpsgd"):
        assert audited_release.fn(run_id="r", method=method) == {"method": method}
    # tang's demos were audited by their run; the prompts audited at release meet the gate's other conditions first
    assert calls == [("gate", "tang"), ("register", "tang")] + [
        (step, m) for m in ("pate", "dpsgd") for step in ("gate before the audit", "audit", "gate", "register")]


def test_passing_evidence_and_the_manifest_are_the_same_for_every_method():
    from dpcore.privacy.ledger import Ledger, Spend

    book = Ledger()
    passing = pd.DataFrame([{"passed": True, "reasons": ""}])
    for method, make in RUNS.items():
        run_id = f"passing-{method}"
        make(run_id)
        artifact = gate.load_artifact(release_spec(method), run_id, dpicl_home())
        audit = passing.assign(artifact=artifact.name) if method != "tang" else passing
        artifact = gate.Artifact(**{**artifact.__dict__, "audit": audit})
        for spend in artifact.spends:
            request = Spend.sampled_steps(spend["mechanism"], float(spend["noise_multiplier"]),
                                          float(spend["sampling_rate"]), int(spend["steps"]),
                                          spend["purpose"], dataset_id="release-path", content_hash="h",
                                          run_id=run_id, delta=artifact.delta)
            book.charge([request], replay_recorded=False)
        assert gate.release_failures(gate.evidence(artifact, book.entries_for_run(run_id))) == [], method
        manifest = gate.release_manifest(
            artifact, artifact_file="prompt.safetensors" if method == "dpsgd" else gate.DEMOS_FILE,
            artifact_sha256="f" * 64, audit_summary={"passed": True}, code_version="test", accountant_versions={},
            version=1, ledger_spend=None, task_spec={},
            ledger_entries=gate.covering_entries(book.entries_for_run(run_id), artifact))
        assert manifest["method"] == method and len(manifest["ledger_entries"]) == len(artifact.spends)
        for key in ("release_version", "run_id", "dataset_id", "artifact", "epsilon", "delta", "spends", "audit",
                    "ledger", "assumptions", "model", "code_version", "accountant_versions", "demos"):
            assert key in manifest, (method, key)
        if method != "dpsgd":
            assert manifest["demos_sha256"] == "f" * 64 and manifest["demos"]
        if method != "pate":  # one spend: its mechanism, sigma, q, T at the top level, as tang's manifest had
            assert manifest["noise_multiplier"] == artifact.spends[0]["noise_multiplier"]
            assert {"mechanism", "sampling_rate", "steps"} <= set(manifest)


# --------------------------------------------------------------------------- what a release states of its run


@pytest.mark.parametrize("source, config, expected", [
    ("budget", {}, "delta = 0.001 is the delta of the ledger budget of dataset id 'agnews', which the run took"),
    ("flag", {}, "delta = 0.001 was given to the run (--delta)"),
    (None, {"delta": "None"}, "delta = 0.001 is 1/|D|, the default when a run is given no delta"),  # an older run
])
def test_the_manifest_states_the_delta_the_run_used_and_where_it_came_from(source, config, expected):
    run_id = f"delta-from-{source}"
    _tang_run(run_id, "tang", config=config, inputs={"delta": DELTA, "delta_source": source} if source else None)
    artifact = gate.load_artifact(release_spec("tang"), run_id, dpicl_home())
    manifest = gate.release_manifest(artifact, artifact_file=gate.DEMOS_FILE, artifact_sha256="f" * 64,
                                     audit_summary={}, code_version="test", accountant_versions={}, version=1,
                                     ledger_spend=None, task_spec=artifact.task_spec)
    delta_lines = [line for line in manifest["assumptions"] if "delta" in line]
    assert len(delta_lines) == 1 and delta_lines[0].startswith(expected) and manifest["delta"] == DELTA
    assert manifest["delta_source"] == (source or "1/|D|")
    if source is not None:  # 1/|D| is said only of a run that used it
        assert "1/|D|" not in " ".join(manifest["assumptions"])


def test_a_run_keeps_its_task_spec_and_is_released_from_any_folder(tmp_path, monkeypatch):
    import yaml

    from dpcore.config import RunConfig
    from dpcore.data.taskspec import TASKS_DIR, load_task_spec

    started_in = tmp_path / "project"
    started_in.mkdir()
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text()) | {"name": "hatespeech"}
    (started_in / "hatespeech.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(started_in)
    config = RunConfig(task_spec="hatespeech.yaml")  # a run keeps the path resolved
    assert config.task_spec == str(started_in / "hatespeech.yaml") and config.dataset == "hatespeech"
    kept = load_task_spec(config.task_spec).model_dump(mode="json")
    _tang_run("spec-kept", "tang", config={"task_spec": "hatespeech.yaml"},
              inputs={"task_spec": kept, "task_spec_path": config.task_spec, "delta": DELTA, "delta_source": "flag"})
    _tang_run("spec-not-kept", "tang", config={"task_spec": "hatespeech.yaml"})  # a run made by an earlier dpicl

    monkeypatch.chdir(tmp_path)  # elsewhere: the relative name no longer reads
    assert gate.load_artifact(release_spec("tang"), "spec-kept", dpicl_home()).task_spec == kept
    with pytest.raises(ConfigError) as refused:  # refused when the release is read, before anything is written
        gate.load_artifact(release_spec("tang"), "spec-not-kept", dpicl_home())
    assert str(refused.value).startswith("run spec-not-kept: task spec hatespeech.yaml: file not found")
    assert "release it from the folder it was started in" in str(refused.value)


@pytest.mark.parametrize("method", ["tang", "pate", "dpsgd"])
def test_a_stopped_run_is_refused_with_what_to_do_next(method):
    """A run stopped before it finished has no manifest: its release says to resume it under its id."""
    folder = dpicl_home() / "runs" / "agnews" / "0123456789ab" / "stopped-run"
    folder.mkdir(parents=True, exist_ok=True)
    write_table(pd.DataFrame({"epsilon": [4.0]}), folder / "calibration.parquet")
    with pytest.raises(ConfigError) as refused:
        gate.load_artifact(release_spec(method), "stopped-run", dpicl_home())
    assert str(refused.value).startswith("run 'stopped-run' stopped before it finished")
    assert "`dpicl run ... --run-id stopped-run`" in str(refused.value) and "\n" not in str(refused.value)


# --------------------------------------------------------------------------- one name


def test_an_old_run_folder_with_method_dp_reads_as_tang_without_a_warning():
    folder = _tang_run("old-name-run", method_column="dp")
    assert set(pd.read_parquet(folder / "demos.parquet")["method"]) == {"dp", "zero-shot"}  # as written then
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(read_table(folder / "demos.parquet")["method"]) == {"tang", "zero-shot"}
        artifact = gate.load_artifact(release_spec("tang"), "old-name-run", dpicl_home())
    assert artifact.method == "tang" and artifact.epsilon == 4.0 and [t for t, _ in artifact.demos] == ["a", "b"]
    assert list(artifact.table["method"]) == ["tang", "tang"]  # a release of it writes tang


def test_old_metrics_and_the_dp_flag_read_as_tang():
    from dpcore.config import RunConfig
    from dpcore.names import method_name
    from dpcore.report.summary import results_table
    from flows.cli import build_parser

    metrics = pd.DataFrame([{"method": "dp", "epsilon": 1.0, "seed": 0, "n": 10, "accuracy": 0.7,
                             "calibrated_accuracy": 0.8, "seconds": 1.0}])
    calibration = pd.DataFrame([{"epsilon": 1.0, "noise_multiplier": 1.5}])
    table = results_table(metrics, calibration, None)
    assert table["method"].tolist() == ["tang"] and table["noise_multiplier"].tolist() == [1.5]
    assert RunConfig(methods="dp,pate").methods == ["tang", "pate"]
    assert method_name("dp") == "tang" and method_name("pate") == "pate" and method_name("zero-shot") == "zero-shot"
    args = build_parser().parse_args(["release", "--run", "r", "--method", "dp"])
    assert args.method == "tang"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["release", "--run", "r", "--method", "fewshot"])


def test_a_trained_prompt_s_audit_pools_are_public_bounds_on_the_records_its_batches_drew():
    """The design reads bounds on Binomial(N, 1 - (1 - q)^T), never the realised draw (it tells the batches'
    sizes): the realised pools fall below them in about POOL_BOUND_FAILURE of draws."""
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd
    from scipy.stats import binom

    from tasks.release.audit import POOL_BOUND_FAILURE, _public_pool_sizes

    n, held, q, steps = 400, 50, 0.02, 48
    p = 1 - (1 - q) ** steps
    artifact = SimpleNamespace(drawn_records=(q, steps))
    train = pd.DataFrame({"id": range(n)})
    sizes = set()
    for drawn in (180, 250, 300):  # whatever the realised draw, the same public pools
        members, held_out = train.iloc[:drawn], pd.DataFrame({"id": range(held + n - drawn)})
        sizes.add(_public_pool_sizes(artifact, train, members, held_out))
    ((members_low, non_members_low),) = sizes
    assert members_low == binom.ppf(POOL_BOUND_FAILURE, n, p)
    assert non_members_low == held + n - binom.isf(POOL_BOUND_FAILURE, n, p)
    draws = np.random.default_rng(5).binomial(n, p, size=200_000)
    assert np.mean(draws < members_low) <= 1e-5 and np.mean(held + n - draws < non_members_low) <= 1e-5
