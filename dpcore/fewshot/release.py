"""DP few-shot generation's release (Tang et al. Algorithm 1): the DP demonstrations of a finished pipeline run
at one epsilon, with that epsilon's calibration row as the spend the ledger must hold, audited by the run
itself (`audit.parquet`); its `ReleaseSpec`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dpcore.data.artifacts import read_table, verify_manifest
from dpcore.errors import ConfigError
from dpcore.fewshot.plan import TANG
from dpcore.fewshot.sampling import ACCOUNTED_SAMPLERS
from dpcore.home import find_run_dir
from dpcore.names import ledger_purposes, method_name
from dpcore.release.runs import (
    config_value,
    pick_epsilon,
    run_delta_source,
    run_inputs,
    run_task_spec,
    unfinished,
)
from dpcore.release.spec import DELTA_ASSUMPTION, DEMONSTRATIONS, Artifact, ReleaseSpec

# What a release of Algorithm 1's demonstrations assumes (AdaDPSyn's, the same algorithm's, too).
ASSUMPTIONS = (
    "per-label record counts |D_y| are treated as public (they set q = MN/|D_y|), as in Tang et al.",
    DELTA_ASSUMPTION,
)
# The ledger purposes that charge DP few-shot generation (the flow, the `generate` command).
TANG_PURPOSES = ledger_purposes("tang")
# The parameters its export states at the top level: its one spend's, as its release manifest does.
EXPORT_PARAMETERS = ("mechanism", "noise_multiplier", "sampling_rate", "steps")


@dataclass(frozen=True)
class RunFolder:
    """The public tables of a finished pipeline run (`$DPICL_HOME/runs/<dataset>/<hash12>/<run-id>/`)."""

    path: Path
    manifest: dict
    demos: pd.DataFrame
    calibration: pd.DataFrame
    audit: pd.DataFrame | None
    changed_files: tuple[str, ...]

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", self.path.name))


def load_run(run_id: str, home: Path) -> RunFolder:
    """Read the tables the release gate needs; files changed since the manifest are reported, not trusted."""
    path = find_run_dir(run_id, home)
    if not (path / "manifest.json").exists():
        raise unfinished(run_id, path)
    for name in ("demos", "calibration"):
        if not (path / f"{name}.parquet").exists():
            raise ConfigError(f"run {run_id!r}: {path / (name + '.parquet')} is missing")
    audit_path = path / "audit.parquet"
    return RunFolder(
        path=path,
        manifest=json.loads((path / "manifest.json").read_text()),
        demos=read_table(path / "demos.parquet"),
        calibration=read_table(path / "calibration.parquet"),
        audit=read_table(audit_path) if audit_path.exists() else None,
        changed_files=tuple(verify_manifest(path)),
    )


def tang_demos(demos: pd.DataFrame) -> pd.DataFrame:
    """The DP demonstrations among a run's demos (a table written before the method was named tang says dp)."""
    return demos[demos["method"].map(method_name) == TANG]


def choose_release_epsilon(run: RunFolder, epsilon: float | None) -> float:
    """The epsilon to release: the one asked for, else the smallest DP epsilon of the run (the strongest guarantee)."""
    dp = tang_demos(run.demos)
    available = sorted(set(float(e) for e in dp["epsilon"])) if "epsilon" in dp.columns else []
    if epsilon is None:
        if not available:
            raise ConfigError(f"run {run.run_id}: no DP demonstrations to release")
        return available[0]
    return pick_epsilon(epsilon, available, f"run {run.run_id} has DP demos at")


def tang_artifact(run_id: str, run: RunFolder, epsilon: float | None = None) -> Artifact:
    """DP few-shot generation's demos at `epsilon` (default the smallest of the run: the strongest guarantee),
    with the calibration row of that epsilon as the spend the ledger must hold (Tang et al. Algorithm 1)."""
    chosen = choose_release_epsilon(run, epsilon)
    rows = tang_demos(run.demos)
    rows = rows[rows["epsilon"] == chosen].reset_index(drop=True)
    calib = run.calibration[run.calibration["epsilon"] == chosen] if "epsilon" in run.calibration.columns \
        else run.calibration
    row = {k: (None if isinstance(v, float) and math.isnan(v) else v)
           for k, v in (calib.iloc[0].to_dict() if len(calib) else {}).items()}
    config = run.manifest.get("config", {})
    dataset = str(run.manifest.get("dataset", config.get("dataset", "")))
    spend = {k: row.get(k) for k in ("mechanism", "noise_multiplier", "sampling_rate", "steps")}
    inputs = run_inputs(run.path)
    return Artifact(
        method=TANG, run_id=run_id, path=run.path, name="demos", epsilon=chosen,
        delta=math.nan if row.get("delta") is None else float(row["delta"]), spends=({**spend, "purpose": "pipeline"},),
        seeded_noise=bool(rows["seeded_noise"].astype(bool).any()) if len(rows) else False,
        info={"model": str(run.manifest.get("model", "")), "dataset": dataset,
              "dataset_id": config_value(config.get("dataset_id")) or dataset,
              "task_spec": config_value(config.get("task_spec")) or dataset, "parameters": spend},
        demos=tuple((str(t), str(y)) for t, y in zip(rows["text"], rows["label"], strict=True)) if len(rows) else (),
        changed_files=run.changed_files, audit=run.audit,
        samplers=((tuple(sorted(set(rows["sampler"].astype(str)))) if "sampler" in rows.columns else ("unrecorded",))
                  if len(rows) else ()),
        ledger_purposes=TANG_PURPOSES,
        crosscheck_agreed=bool(len(calib) == 0 or calib["crosscheck_agreed"].astype(bool).all()),
        table=rows, selector={"epsilon": chosen},
        task_spec=run_task_spec(run_id, inputs, config_value(config.get("task_spec")) or dataset),
        delta_source=run_delta_source(inputs, config), assumptions=RELEASE.assumptions, spec=RELEASE)


def load_tang_artifact(spec: ReleaseSpec, run_id: str, home: Path, *, epsilon: float | None = None,
                       training: int = 0, repeat: int | None = None) -> Artifact:
    """The DP demos of a finished pipeline run at `epsilon` (`tang_artifact` on its public tables)."""
    return tang_artifact(run_id, load_run(run_id, home), epsilon)


RELEASE = ReleaseSpec(
    method=TANG, kind=DEMONSTRATIONS, load=load_tang_artifact,
    nothing_releasable="the run produced no DP demonstrations (only baselines)", assumptions=ASSUMPTIONS,
    artifact_file="demos.parquet", released_what="demos'", export_parameters=EXPORT_PARAMETERS,
    accounted_samplers=ACCOUNTED_SAMPLERS)
