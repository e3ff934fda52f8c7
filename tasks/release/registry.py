"""The MLflow registry side of a release: the release folder `$DPICL_HOME/releases/<dataset-id>/v<N>/` (`release.json`
and the artifact: `demos.parquet` for demonstrations, `instruction.json` for an instruction, `prompt.safetensors`
for a trained prompt), written whole or not at all and registered as a new version of the registered model
`dpicl-<dataset-id>` with the alias `production` (earlier versions are kept; the alias moves); the sealed record
read back (`load_release`).

A release folder is assembled under a temporary name and renamed into place, and removed again when the registry
refuses it. Its record `release.json` is sealed: its sha256 is the registry version's tag `release_sha256`, and
`load_release` refuses a record that no longer matches it (or has none), as it refuses an artifact that no longer
matches the record.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

from prefect import get_run_logger

from dpcore.data.artifacts import file_sha256, write_json_atomic, write_table
from dpcore.errors import ConfigError
from dpcore.home import subdir
from dpcore.public_outputs import Kind, declare
from dpcore.release import gate
from dpcore.release.spec import INSTRUCTION, TRAINED_PROMPT, Artifact
from tasks.common import code_version, safe_name, stoppable_task
from tasks.release.check import load_artifact
from tasks.tracking import mlflow_client

DEFAULT_ALIAS = "production"


RELEASE_FILE = "release.json"


SEAL_TAG = "release_sha256"  # the registry version's tag holding the sha256 of its release.json
# A release's public outputs: the artifact and its digest (a DP output), the epsilon its run was charged (public
# counts, or PromptPATE's DP-released bound), the audit's verdict and its design (configuration and counts).
declare("json:release", Kind.DP, "/artifact_sha256", "/demos_sha256", "/epsilon")
declare("json:release", Kind.VERDICT, "/audit/verdict", "/audit/passed", "/audit/reasons")
declare("json:release", Kind.COUNT, "/audit/noise_multiplier", "/audit/epsilon", "/audit/power")


def registered_model_name(dataset_id: str) -> str:
    return f"dpicl-{safe_name(dataset_id)}"


def _mlflow_parent_run(client, run_id: str) -> str | None:
    runs = client.search_runs(
        experiment_ids=[e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.dpicl_run_id = '{run_id}'",
    )
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents[0].info.run_id if parents else None


def _registry_version(client, dataset_id: str) -> tuple[str, int]:
    """(registered model name, the next version number); the registered model is created on first use."""
    name = registered_model_name(dataset_id)
    try:
        client.get_registered_model(name)
    except Exception:
        client.create_registered_model(name, description=f"dpicl DP prompts of dataset {dataset_id}")
    return name, 1 + max((int(v.version) for v in client.search_model_versions(f"name = '{name}'")), default=0)


def _publish(client, name: str, folder: Path, run_id: str, tags: dict, description: str, alias: str) -> int:
    """A registry version pointing at the release folder, the alias moved to it; the version is deleted again
    when the alias cannot be moved (no version is left half-published)."""
    model_version = client.create_model_version(name, source=folder.as_uri(), run_id=_mlflow_parent_run(client, run_id),
                                                tags=tags, description=description)
    try:
        client.set_registered_model_alias(name, alias, model_version.version)
    except BaseException:
        client.delete_model_version(name, model_version.version)
        raise
    get_run_logger().info("released run %s as %s version %s (alias %s)", run_id, name, model_version.version, alias)
    return int(model_version.version)


@stoppable_task(name="release-register", retries=1)
def register(run_id: str, method: str = "tang", epsilon: float | None = None, training: int = 0,
             repeat: int | None = None, alias: str = DEFAULT_ALIAS) -> dict:
    """Write the release folder (a text prompt as `demos.parquet`: tang's demos, PromptPATE's student prompt;
    a trained prompt as `prompt.safetensors` + `prompt.json`) and `release.json`, whole or not at all, register
    it in MLflow with `release.json`'s seal, move the alias to it."""
    from dpcore.privacy.ledger import Ledger
    from dpcore.privacy.memo import accountant_versions

    artifact = load_artifact(run_id, method, epsilon, training, repeat)  # its task spec included: refused here
    client = mlflow_client()
    name, version = _registry_version(client, artifact.dataset_id)
    folder = subdir("releases") / safe_name(artifact.dataset_id) / f"v{version}"
    book = Ledger()
    audit = gate.audit_rows(artifact)

    def manifest_of(path: Path) -> dict:
        return gate.release_manifest(
            artifact, artifact_file=path.name, artifact_sha256=file_sha256(path),
            audit_summary=_audit_summary(audit.iloc[0].to_dict()) if audit is not None and len(audit) else {},
            code_version=code_version(), accountant_versions=accountant_versions(), version=version,
            ledger_spend=_ledger_spend(book, artifact.dataset_id), task_spec=artifact.task_spec,
            ledger_entries=gate.covering_entries(book.entries_for_run(run_id), artifact))

    manifest = _write_release_folder(folder, artifact, manifest_of)
    hashes = {k: manifest[k] for k in ("demos_sha256",) if k in manifest} | {"artifact_sha256": manifest["artifact"]["sha256"]}
    tags = {"dpicl_run_id": run_id, "method": method, "artifact": artifact.name, "epsilon": f"{artifact.epsilon:g}",
            "delta": str(artifact.delta), "dataset_id": artifact.dataset_id, **hashes, "model": str(manifest["model"]),
            "code_version": manifest["code_version"], SEAL_TAG: file_sha256(folder / RELEASE_FILE)}
    try:
        number = _publish(client, name, folder, run_id, tags, f"run {run_id}, {method} {artifact.name}, epsilon "
                          f"{artifact.epsilon:g}", alias)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # no release folder without its registry version
        raise
    return {"registered_model": name, "version": number, "alias": alias, "method": method, "artifact": artifact.name,
            "release_dir": str(folder), **hashes, SEAL_TAG: tags[SEAL_TAG], "epsilon": artifact.epsilon,
            "delta": artifact.delta, "run_id": run_id, "audit": manifest["audit"]}


def _write_release_folder(folder: Path, artifact: Artifact, manifest_of) -> dict:
    """The release folder, whole or not at all: the artifact and `release.json` (`manifest_of(artifact path)`)
    written into a temporary folder beside it, renamed into place last. A folder already at that version's
    place was left by a release the registry never recorded (the version number is the registry's next), and
    is replaced."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    kind = artifact.spec.kind
    try:
        if kind == INSTRUCTION:  # the instruction (text; the manifest's task spec holds it in front)
            path = write_json_atomic(staging / gate.INSTRUCTION_FILE, {"instruction": artifact.instruction})
        elif kind == TRAINED_PROMPT:
            path = staging / gate.TRAINED_PROMPT_FILE
            shutil.copyfile(artifact.prompt_path, path)
            write_json_atomic(staging / "prompt.json",
                              json.loads(artifact.prompt_path.with_suffix(".json").read_text()))
        else:
            path = write_table(artifact.table, staging / gate.DEMOS_FILE)
        manifest = manifest_of(path)
        write_json_atomic(staging / RELEASE_FILE, manifest)
        if folder.exists():
            shutil.rmtree(folder)
        staging.replace(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


AUDIT_SUMMARY_KEYS = ("verdict", "passed", "trials", "members_per_trial", "non_members_per_trial", "confidence")


def _audit_summary(row: dict) -> dict:
    return {k: row.get(k) for k in AUDIT_SUMMARY_KEYS}


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
    version = found[0]
    folder = Path(version.source.removeprefix("file://"))
    named = f"release {version.name} v{version.version}"
    record = folder / RELEASE_FILE
    if not record.is_file():
        raise ConfigError(f"{named}: {record} is missing")
    seal = (version.tags or {}).get(SEAL_TAG)
    if seal is None:
        raise ConfigError(f"{named}: its record {RELEASE_FILE} has no seal (released by an earlier dpicl), so a "
                          "change to it could not be told; release the run again")
    if file_sha256(record) != seal:
        raise ConfigError(f"{named}: {record} changed since it was released (it no longer matches its seal); "
                          "refused: release the run again")
    manifest = json.loads(record.read_text())
    artifact = manifest.get("artifact") or {"file": "demos.parquet", "sha256": manifest["demos_sha256"]}
    if not (folder / artifact["file"]).is_file() or file_sha256(folder / artifact["file"]) != artifact["sha256"]:
        raise ConfigError(f"{named}: {artifact['file']} does not match its manifest")
    return {**manifest, "release_dir": str(folder)}
