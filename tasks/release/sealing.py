"""A run folder's public record sealed: PromptPATE's plan file and manifest when its run ends, and the manifest
re-sealed over the audit tables a release audit writes (a folder with a file changed since its run never is)."""

from __future__ import annotations

import json
from pathlib import Path

from dpcore.data.artifacts import write_json_atomic, write_manifest
from dpcore.pate.release import PATE_PLAN_FILE
from dpcore.release.spec import Artifact
from tasks.common import code_version


def seal_pate_run(public_dir, *, plan: dict, run_id: str, dataset: str, dataset_id: str, data_hash: str, model: str,
                  task_spec: str, seeded_noise: bool, best_repeat: int | None) -> None:
    """A finished PromptPATE run's public `pate_plan.json` (its plan as charged, ledger id, seeded flag and the
    chosen student repeat: what `dpicl release --method pate` reads) and the folder's `manifest.json`."""
    public = Path(public_dir)
    write_json_atomic(public / PATE_PLAN_FILE, {
        "method": "pate", "run_id": run_id, "dataset": dataset, "dataset_id": dataset_id, "data_hash": data_hash,
        "model": model, "task_spec": task_spec, "seeded_noise": bool(seeded_noise), "best_repeat": best_repeat,
        "plan": plan})
    write_manifest(public, extra={"run_id": run_id, "dataset": dataset, "data_hash": data_hash, "model": model,
                                  "method": "pate", "seeded_noise": bool(seeded_noise), "code_version": code_version()})


def reseal(artifact: Artifact) -> None:
    """The run folder's manifest extended to the audit tables just written, so an edited audit is caught by
    the gate's tamper check; a folder with a file changed since its run is never re-sealed."""
    if artifact.changed_files:
        return
    kept = json.loads((artifact.path / "manifest.json").read_text())
    kept.pop("files", None)
    write_manifest(artifact.path, extra=kept)
