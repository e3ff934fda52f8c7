"""Release stage: the audit gate over a finished run, the release manifest, and the MLflow registry.

Thin wrappers: the gate conditions live in `dpcore.release`; this module reads the ledger,
writes the release folder `$DPICL_HOME/releases/<dataset-id>/v<N>/` (demos + `release.json`)
and registers it as a new version of the registered model `dpicl-<dataset-id>` with the
alias `production` (earlier versions are kept; the alias moves).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from prefect import get_run_logger, task

from dpcore import release as gate
from dpcore.artifacts import file_sha256, write_json_atomic, write_table
from dpcore.errors import ConfigError
from dpcore.home import dpicl_home, subdir
from tasks.common import code_version, safe_name
from tasks.tracking import mlflow_client

DEFAULT_ALIAS = "production"


def registered_model_name(dataset_id: str) -> str:
    return f"dpicl-{safe_name(dataset_id)}"


def _mlflow_parent_run(client, run_id: str) -> str | None:
    runs = client.search_runs(
        experiment_ids=[e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.dpicl_run_id = '{run_id}'",
    )
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents[0].info.run_id if parents else None


@task(name="release-gate", retries=0)
def check_gate(run_id: str, epsilon: float | None = None) -> dict:
    """Evaluate every release condition: `refused` lists every one that fails (a refusal is an answer,
    not a task failure: the flow turns it into a Failed state with that message and no stored result)."""
    from dpcore.ledger import Ledger

    run = gate.load_run(run_id, dpicl_home())
    chosen = gate.choose_release_epsilon(run, epsilon)
    rows = run.calibration[run.calibration["epsilon"] == chosen]
    row = rows.iloc[0].to_dict() if len(rows) else {}
    covered = gate.ledger_covers(Ledger().entries_for_run(run_id), run_id, row)
    evidence = gate.evidence_from_tables(run_id, run.demos, run.calibration, run.audit,
                                         ledger_entry_present=covered, epsilon=chosen)
    failures = gate.release_failures(evidence)
    if run.changed_files:
        failures.append(f"run files changed since the run finished: {', '.join(run.changed_files)}")
    refused = (f"release of run {run_id} (epsilon {chosen:g}) refused:\n" + "\n".join(f"- {line}" for line in failures)
               if failures else None)
    if refused is None:
        get_run_logger().info("release gate passed for run %s at epsilon %g", run_id, chosen)
    return {"run_id": run_id, "epsilon": chosen, "run_dir": str(run.path), "refused": refused}


@task(name="release-register", retries=1)
def register(run_id: str, epsilon: float, alias: str = DEFAULT_ALIAS) -> dict:
    """Write the release folder and manifest, register it in MLflow, move the alias to it."""
    from dpcore.accounting import accountant_versions
    from dpcore.ledger import Ledger

    run = gate.load_run(run_id, dpicl_home())
    config = run.manifest.get("config", {})
    dataset = str(run.manifest.get("dataset", config.get("dataset", "")))
    dataset_id = config.get("dataset_id") if config.get("dataset_id") not in (None, "None", "") else dataset
    demos = run.demos[(run.demos["method"] == "dp") & (run.demos["epsilon"] == epsilon)].reset_index(drop=True)
    calibration = run.calibration[run.calibration["epsilon"] == epsilon]
    calibration_row = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in (calibration.iloc[0].to_dict() if len(calibration) else {}).items()}
    audit_summary = {}
    if run.audit is not None and len(run.audit):
        row = run.audit.iloc[0].to_dict()
        audit_summary = {k: row.get(k) for k in ("auc", "auc_ci_low", "auc_ci_high", "tpr_at_1pct_fpr",
                                                 "epsilon_lower_bound", "max_overlap_tokens", "passed")}

    client = mlflow_client()
    name = registered_model_name(dataset_id)
    try:
        client.get_registered_model(name)
    except Exception:
        client.create_registered_model(name, description=f"dpicl DP demonstrations of dataset {dataset_id}")
    version = 1 + max((int(v.version) for v in client.search_model_versions(f"name = '{name}'")), default=0)
    folder = subdir("releases") / safe_name(dataset_id) / f"v{version}"
    demos_path = write_table(demos, folder / "demos.parquet")
    from dpcore.taskspec import load_task_spec

    spec = load_task_spec(config.get("task_spec") if config.get("task_spec") not in (None, "None", "") else dataset)
    manifest = gate.release_manifest(
        run_id=run_id, dataset=dataset, dataset_id=dataset_id, demos_sha256=file_sha256(demos_path), demos=demos,
        calibration_row=calibration_row, audit_summary=audit_summary, model=str(run.manifest.get("model", "")),
        code_version=code_version(), accountant_versions=accountant_versions(), version=version,
        ledger_spend=_ledger_spend(Ledger(), dataset_id),
    )
    manifest["task_spec"] = spec.model_dump(mode="json")
    write_json_atomic(folder / "release.json", manifest)
    tags = {"dpicl_run_id": run_id, "epsilon": f"{epsilon:g}", "delta": str(calibration_row.get("delta")),
            "dataset_id": dataset_id, "demos_sha256": manifest["demos_sha256"], "model": manifest["model"],
            "code_version": manifest["code_version"]}
    model_version = client.create_model_version(
        name, source=folder.as_uri(), run_id=_mlflow_parent_run(client, run_id), tags=tags,
        description=f"run {run_id}, epsilon {epsilon:g}",
    )
    client.set_registered_model_alias(name, alias, model_version.version)
    get_run_logger().info("released run %s as %s version %s (alias %s)", run_id, name, model_version.version, alias)
    return {"registered_model": name, "version": int(model_version.version), "alias": alias,
            "release_dir": str(folder), "demos_sha256": manifest["demos_sha256"], "epsilon": epsilon,
            "delta": calibration_row.get("delta"), "run_id": run_id}


def _ledger_spend(book, dataset_id: str) -> dict:
    """The dataset's composed spend at release time (epsilon at delta over every entry), for the manifest."""
    spend = book.spend(dataset_id)
    return {"dataset_id": dataset_id, "epsilon": "inf" if math.isinf(spend.epsilon) else spend.epsilon,
            "delta": spend.delta, "entries": len(spend.entries),
            "budget": spend.budget.to_dict() if spend.budget else None}


def _what_exists(client, names: list[str], dataset_id: str | None) -> str:
    """The releases that do exist, for an error message: versions and aliases per registered model."""
    held = []
    for name in names:
        try:
            model = client.get_registered_model(name)
            versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
        except Exception:  # a registry without this model
            continue
        aliases = ", ".join(f"{alias} -> v{version}" for alias, version in sorted((model.aliases or {}).items()))
        held.append(f"{name}: versions {', '.join(f'v{v}' for v in versions) or 'none'}"
                    + (f" (aliases {aliases})" if aliases else ""))
    if not held:
        return ("no registered dpicl release" + (f" for dataset {dataset_id!r}" if dataset_id else "")
                + " (run `dpicl release` first)")
    return "no such version or alias; the registry holds " + "; ".join(held)


def load_release(alias_or_version: str = DEFAULT_ALIAS, dataset_id: str | None = None) -> dict:
    """The release manifest behind an alias (or a version number) of a dataset's registered model."""
    client = mlflow_client()
    if dataset_id:
        names = [registered_model_name(dataset_id)]
    else:
        names = [m.name for m in client.search_registered_models() if m.name.startswith("dpicl-")]
    found = []
    for name in names:
        try:
            version = (client.get_model_version(name, alias_or_version) if alias_or_version.isdigit()
                       else client.get_model_version_by_alias(name, alias_or_version))
        except Exception:
            continue
        found.append(version)
    if not found:
        raise ConfigError(f"release {alias_or_version!r}: " + _what_exists(client, names, dataset_id))
    if len(found) > 1:
        raise ConfigError(f"release {alias_or_version!r}: several datasets have one "
                          f"({', '.join(v.name for v in found)}); pass --dataset-id")
    folder = Path(found[0].source.removeprefix("file://"))
    manifest = json.loads((folder / "release.json").read_text())
    if file_sha256(folder / "demos.parquet") != manifest["demos_sha256"]:
        raise ConfigError(f"release {found[0].name} v{found[0].version}: demos.parquet does not match its manifest")
    return manifest
