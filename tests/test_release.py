"""Audited release, `dpicl predict` and scheduled regeneration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import (  # noqa: F401  (the shared harness fixture)
    home,
    mini_agnews,
    prefect_harness,
    share_tiny_model,
    standard_run,
    tiny_config,
)

from dpcore.data.artifacts import read_table, write_manifest, write_table
from dpcore.errors import ReleaseRefusedError
from dpcore.release import gate

pytestmark = pytest.mark.usefixtures("prefect_harness")

GOOD = gate.ReleaseEvidence(run_id="r1", audit_ran=True, audit_passed=True, audit_reasons=(), seeded_noise=False,
                            ledger_entry_present=True, crosscheck_agreed=True, dp_demos=4, epsilons=(2.0,))


# --------------------------------------------------------------------------- the gate, condition by condition


def test_good_evidence_passes():
    assert gate.release_failures(GOOD) == []


@pytest.mark.parametrize("change, expected", [
    ({"audit_ran": False}, "no membership-inference audit"),
    ({"audit_passed": False, "audit_reasons": ("AUC 0.71 outside 0.5 +/- 0.05",)}, "audit failed: AUC 0.71"),
    ({"seeded_noise": True}, "fixed seed"),
    ({"ledger_entry_present": False}, "no privacy-ledger entry"),
    ({"crosscheck_agreed": False}, "cross-check"),
    ({"dp_demos": 0}, "no DP demonstrations"),
    ({"epsilons": (float("inf"),)}, "epsilon = inf"),
])
def test_each_failing_condition_is_refused(change, expected):
    failures = gate.release_failures(gate.ReleaseEvidence(**{**GOOD.__dict__, **change}))
    assert len(failures) == 1 and expected in failures[0]


def test_every_failed_condition_is_listed():
    bad = gate.ReleaseEvidence(**{**GOOD.__dict__, "seeded_noise": True, "ledger_entry_present": False,
                                  "crosscheck_agreed": False, "audit_passed": False})
    assert len(gate.release_failures(bad)) == 4


def test_the_samplers_covered_are_the_methods_own():
    """The gate refuses an artifact drawn with a sampler its method's accountant does not cover (`ReleaseSpec.
    accounted_samplers`): DP few-shot generation's cover Poisson and the fixed-size sampler, PromptDPSGD's Poisson
    only; a run that did not record its sampler is refused too."""
    from dpcore.dpsgd.release import RELEASE as DPSGD
    from dpcore.fewshot.release import RELEASE as TANG

    def failures(spec, samplers):
        return gate.release_failures(gate.ReleaseEvidence(**{**GOOD.__dict__, "samplers": samplers, "spec": spec,
                                                              "method": spec.method}))

    assert failures(TANG, ("poisson", "fixed")) == [] and failures(DPSGD, ("poisson",)) == []
    for spec, samplers, named in ((TANG, ("unrecorded",), "unrecorded"), (DPSGD, ("fixed",), "fixed")):
        (line,) = failures(spec, samplers)
        assert f"sampler {named}, which the privacy accountant does not cover (covered: " in line
        assert line.endswith(f"{', '.join(spec.accounted_samplers)})")


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def finished_run(tiny_lm):
    share_tiny_model(tiny_lm)
    return standard_run()


def _releasable_copy(run: dict, new_id: str, charged_sigma_factor: float = 1.0, config: dict | None = None) -> str:
    """A copy of a finished run made releasable: fresh-noise flag, passing audit, a ledger entry
    (of its calibration row; `charged_sigma_factor` != 1 charges another sigma instead); `config` changes its
    manifest's configuration."""
    from dpcore.privacy.ledger import Ledger, Spend

    source = Path(run["run_dir"])
    target = source.parent / new_id
    shutil.copytree(source, target)
    demos = read_table(target / "demos.parquet")
    demos["seeded_noise"] = False
    write_table(demos, target / "demos.parquet")
    audit = read_table(target / "audit.parquet")
    audit["passed"] = True
    audit["reasons"] = ""
    write_table(audit, target / "audit.parquet")
    manifest = json.loads((target / "manifest.json").read_text())
    manifest.update(run_id=new_id, seeded_noise=False)
    manifest["config"] = {**manifest.get("config", {}), **(config or {})}
    (target / "manifest.json").unlink()
    write_manifest(target, extra={k: v for k, v in manifest.items() if k != "files"})
    calibration = read_table(target / "calibration.parquet").iloc[0]
    request = Spend.sampled_steps("gaussian", float(calibration["noise_multiplier"]) * charged_sigma_factor,
                                  float(calibration["sampling_rate"]), int(calibration["steps"]), "pipeline",
                                  dataset_id=run["dataset"], content_hash=run["data_hash"], run_id=new_id,
                                  delta=float(calibration["delta"]))
    Ledger().charge([request], replay_recorded=False)
    return new_id


def test_seeded_run_is_refused_with_every_reason(finished_run):
    from flows.release import release

    with pytest.raises(ReleaseRefusedError) as info:
        release(run_id=finished_run["run_id"])
    message = str(info.value)
    assert "fixed seed" in message
    # the standard run is charged by the pipeline: no ledger complaint
    assert "no privacy-ledger entry" not in message
    # the refusal is the flow run's final state ("Refused", its message the reasons), with no stored
    # result (no unnamed artifact in the UI)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["audited-release"])))
        refused = [r for r in runs if r.state and r.state.name == "Refused" and r.state.is_failed()
                   and "fixed seed" in (r.state.message or "")]
        assert refused
        run_ids = {r.id for r in refused}
        assert not [a for a in client.read_artifacts() if a.flow_run_id in run_ids]


def test_a_ledger_entry_of_another_spend_does_not_cover_the_release(finished_run):
    from flows.release import release

    run_id = _releasable_copy(finished_run, "other-spend-run", charged_sigma_factor=2.0)
    with pytest.raises(ReleaseRefusedError) as info:
        release(run_id=run_id)
    message = str(info.value)
    assert "no privacy-ledger entry of run other-spend-run records the released demos' spend" in message
    assert "fixed seed" not in message and "audit" not in message


def test_tampered_run_is_refused(finished_run):
    from flows.release import release

    run_id = _releasable_copy(finished_run, "tampered-run")
    folder = Path(finished_run["run_dir"]).parent / run_id
    demos = read_table(folder / "demos.parquet")
    demos.loc[0, "text"] = "an edited demonstration"
    write_table(demos, folder / "demos.parquet")
    with pytest.raises(ReleaseRefusedError, match="changed since the run finished: demos.parquet"):
        release(run_id=run_id)


def test_release_registers_and_moves_the_production_alias(finished_run, capsys, tmp_path):
    from flows.cli import main
    from flows.release import release
    from tasks.release import registered_model_name
    from tasks.tracking import mlflow_client

    first = release(run_id=_releasable_copy(finished_run, "release-one"))
    second = release(run_id=_releasable_copy(finished_run, "release-two"))
    assert second["version"] == first["version"] + 1
    client = mlflow_client()
    name = registered_model_name(finished_run["dataset"])
    assert int(client.get_model_version_by_alias(name, "production").version) == second["version"]
    assert client.get_model_version(name, str(first["version"])).tags["dpicl_run_id"] == "release-one"
    manifest = json.loads((Path(second["release_dir"]) / "release.json").read_text())
    for key in ("demos_sha256", "epsilon", "delta", "noise_multiplier", "sampling_rate", "steps",
                "accountant_versions", "model", "code_version", "audit"):
        assert manifest[key] is not None, key
    assert manifest["accountant_versions"]["prv-accountant"] == "0.2.0"
    from dpcore.privacy.ledger import Ledger

    spend = Ledger().spend(finished_run["dataset"])
    assert manifest["ledger"]["dataset_id"] == finished_run["dataset"]
    assert manifest["ledger"]["entries"] == len(spend.entries) >= 2 and manifest["ledger"]["delta"] == spend.delta
    assert any("treated as public" in a for a in manifest["assumptions"])
    assert any("1/|D|" in a for a in manifest["assumptions"])

    # predict with the released demos only, through the CLI
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"id": "q1", "text": "Stocks rallied after the bank raised its outlook."}\n'
                       '{"id": "q2", "text": "The striker scored twice in the final."}\n')
    out = tmp_path / "answers.jsonl"
    assert main(["predict", "--release", "production", "--input", str(queries), "--out", str(out),
                 "--dataset-id", finished_run["dataset"]]) == 0
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    labels = {"World", "Sports", "Business", "Technology"}
    assert [a["id"] for a in answers] == ["q1", "q2"]
    assert all(a["prediction"] in labels and abs(sum(a["probabilities"].values()) - 1) < 1e-6 for a in answers)
    assert "no further privacy cost" in capsys.readouterr().err
    # a version that does not exist: the error lists the versions and aliases that do
    assert main(["predict", "--release", "99", "--input", str(queries), "--dataset-id", finished_run["dataset"]]) == 2
    err = capsys.readouterr().err
    assert "release '99': no such version or alias" in err and f"v{first['version']}" in err
    assert f"production -> v{second['version']}" in err


def test_a_release_is_whole_or_nothing_sealed_and_reads_its_run_from_any_folder(finished_run, monkeypatch,
                                                                                   tmp_path):
    from dpcore.data.artifacts import RUN_INPUTS_FILE, file_sha256
    from flows.release import release
    from tasks.release import SEAL_TAG, registered_model_name
    from tasks.tracking import mlflow_client

    # the run kept its task spec (content and resolved path) and where its delta came from
    kept = json.loads((Path(finished_run["run_dir"]) / RUN_INPUTS_FILE).read_text())
    assert kept["task_spec"]["name"] == "agnews-mini" and Path(kept["task_spec_path"]).is_absolute()
    assert (kept["delta"], kept["delta_source"]) == (finished_run["delta"], "1/|D|")
    # a copy whose configuration names its spec relatively, released from another folder
    run_id = _releasable_copy(finished_run, "release-elsewhere", config={"task_spec": "agnews-mini.yaml"})
    monkeypatch.chdir(tmp_path)
    releases = home() / "releases" / finished_run["dataset"]

    def folders() -> list[str]:
        return sorted(p.name for p in releases.iterdir()) if releases.exists() else []

    before = folders()
    with monkeypatch.context() as failing:  # the disk fills up while the record is written: nothing is left
        failing.setattr(gate, "release_manifest", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
        with pytest.raises(OSError, match="disk full"):
            release(run_id=run_id)
    assert folders() == before
    released = release(run_id=run_id)
    folder = Path(released["release_dir"])
    assert folders() == sorted([*before, folder.name])
    record = json.loads((folder / "release.json").read_text())
    assert record["task_spec"] == kept["task_spec"] and record["delta_source"] == "1/|D|"
    version = mlflow_client().get_model_version(registered_model_name(finished_run["dataset"]),
                                                str(released["version"]))
    assert version.tags[SEAL_TAG] == released[SEAL_TAG] == file_sha256(folder / "release.json")


def test_a_release_whose_final_state_comes_back_from_the_server_keeps_its_result(finished_run, monkeypatch):
    """A busy SQLite Prefect server can reject a retried state proposal it had already recorded, and the
    engine then holds the server's copy of the Completed state, without the flow's unpersisted result: the
    release still returns what the flow returned."""
    import prefect.flow_engine

    from flows.release import release

    real = prefect.flow_engine.propose_state_sync

    def rejected_with_the_servers_copy(client, state, **kwargs):
        proposed = real(client, state, **kwargs)
        return proposed.model_copy(update={"data": None}) if proposed.is_completed() else proposed

    monkeypatch.setattr(prefect.flow_engine, "propose_state_sync", rejected_with_the_servers_copy)
    released = release(run_id=_releasable_copy(finished_run, "release-server-copy"))
    assert released["run_id"] == "release-server-copy" and released["version"] >= 1


def test_predict_bad_input_names_the_line(finished_run, tmp_path):
    from flows.cli import main

    queries = tmp_path / "bad.jsonl"
    queries.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    assert main(["predict", "--input", str(queries)]) == 2


# --------------------------------------------------------------------------- scheduled regeneration


def test_regeneration_skips_unchanged_and_runs_on_changed(tmp_path, tiny_lm):
    from dpcore.privacy.ledger import Ledger
    from flows.regenerate import regenerate

    share_tiny_model(tiny_lm)
    data_path, spec_path, _, _ = mini_agnews()
    csv = tmp_path / "refreshing.csv"
    shutil.copy(data_path, csv)
    config = tiny_config(data_path=str(csv), dataset_id="regeneration-test", audit=False,
                         baselines=["zero-shot"], seeds=1, test_size=4)
    ledger = Ledger()

    first = regenerate(config=config)
    assert first["changed"] is True and first["run_id"]
    spent = len(ledger.entries("regeneration-test"))
    assert spent >= 1

    state = regenerate(config=config, return_state=True)
    assert state.message == "no change"
    assert len(ledger.entries("regeneration-test")) == spent  # no new spend

    frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    frame.loc[0, "text"] = frame.loc[0, "text"] + " (updated)"
    frame.to_csv(csv, index=False)
    third = regenerate(config=config)
    assert third["changed"] is True and third["content_hash"] != first["content_hash"]
    assert len(ledger.entries("regeneration-test")) > spent  # composition continues under the same id


def test_home_is_the_test_home():
    assert str(home()).startswith("/tmp") or "dpicl-test-home" in str(home())
