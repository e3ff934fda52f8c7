"""Release stage: the audit gate over a finished run, the release manifest, and the MLflow registry.

Thin wrappers: the gate conditions live in `dpcore.release.gate`, the audits in `dpcore.audit.procedures`; this
module reads the ledger, writes the release folder `$DPICL_HOME/releases/<dataset-id>/v<N>/`
(`release.json` and the artifact: `demos.parquet` for DP few-shot demos and PromptPATE's student
prompt, `prompt.safetensors` for a PromptDPSGD prompt) and registers it as a new version of the
registered model `dpicl-<dataset-id>` with the alias `production` (earlier versions are kept; the
alias moves). A release is written whole or not at all: its folder is assembled under a temporary name and
renamed into place, and removed again when the registry refuses it. Its record `release.json` is sealed: its
sha256 is the registry version's tag `release_sha256`, and `load_release` refuses a record that no longer
matches it (or has none), as it refuses an artifact that no longer matches the record. One path for every method: `load_artifact` (what the release publishes,
`dpcore.release.gate.load_artifact`), `check_gate`, `register`.

`audit_artifact` is the membership-inference audit of a PromptPATE student prompt or a PromptDPSGD
trained prompt (`dpcore.audit.procedures.prompt_audit`): members are the private records the mechanism read,
non-members the held-out test records; nothing is generated and nothing is charged (like the
run-demos audit). The opt-in single-teacher contrast (`dpcore.audit.procedures.teacher_audit`) puts real
records in prompts: it is charged first as an infinite spend (`tasks.charge.real_records_spend`,
like the non-private audit reference). Public: `audit_<method>.parquet` (one row per audited
artifact) and `audit_pate_teacher.parquet`; private: `mia_scores_<method>.parquet`.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd
from prefect import get_run_logger

from dpcore.data.artifacts import file_sha256, read_table, write_json_atomic, write_manifest, write_table
from dpcore.display import fmt_eps
from dpcore.errors import ConfigError, ReleaseRefusedError
from dpcore.home import dpicl_home, subdir
from dpcore.pate.release import PATE_PLAN_FILE, TEACHER_AUDIT_FILE, teacher_prompts
from dpcore.public_outputs import Kind, declare, declare_log
from dpcore.release import gate
from dpcore.release.spec import INSTRUCTION, TRAINED_PROMPT, UNNAMED_METHOD
from tasks.charge import AUDIT_REFERENCE, charge_spends, real_records_spend
from tasks.common import (
    code_version,
    derive_seed,
    language_model,
    report_progress,
    safe_name,
    stop_requested,
    stoppable_task,
)
from tasks.methods import release_spec
from tasks.tracking import mlflow_client

DEFAULT_ALIAS = "production"
RELEASE_FILE = "release.json"
SEAL_TAG = "release_sha256"  # the registry version's tag holding the sha256 of its release.json
# A release's public outputs: the artifact and its digest (a DP output), the epsilon its run was charged (public
# counts, or PromptPATE's DP-released bound), the audit's verdict and its design (configuration and counts).
declare("json:release", Kind.DP, "/artifact_sha256", "/demos_sha256", "/epsilon")
declare("json:release", Kind.VERDICT, "/audit/verdict", "/audit/passed", "/audit/reasons")
declare("json:release", Kind.COUNT, "/audit/noise_multiplier", "/audit/epsilon", "/audit/power")
for _output in ("file:*audit_*.parquet",):
    declare(_output, Kind.VERDICT, "/*/verdict", "/*/passed", "/*/reasons")
    declare(_output, Kind.VERDICT, "/*/summary/verdict", "/*/summary/passed", "/*/summary/reasons")
    declare(_output, Kind.COUNT, "/*/noise_multiplier", "/*/summary/noise_multiplier")
    declare(_output, Kind.DP, "/*/epsilon", "/*/summary/epsilon")
ARTIFACT_AUDIT_LOG = declare_log("audit of %s %s: %s", verdict=(2,))


def registered_model_name(dataset_id: str) -> str:
    return f"dpicl-{safe_name(dataset_id)}"


def _mlflow_parent_run(client, run_id: str) -> str | None:
    runs = client.search_runs(
        experiment_ids=[e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.dpicl_run_id = '{run_id}'",
    )
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents[0].info.run_id if parents else None


def audited_at_release(method: str) -> bool:
    """Whether `dpicl release --method <method>` audits the artifact first (its spec's audit table; a method
    audited by its own run has none)."""
    return release_spec(method).audited_at_release


def load_artifact(run_id: str, method: str, epsilon: float | None = None, training: int = 0,
                  repeat: int | None = None) -> gate.Artifact:
    """What releasing `method` of a finished run would publish (its registered `ReleaseSpec`'s loader,
    `dpcore.release.gate.load_artifact`)."""
    return gate.load_artifact(release_spec(method), run_id, dpicl_home(), epsilon, training, repeat)


@stoppable_task(name="release-gate", retries=0)
def check_gate(run_id: str, method: str = "tang", epsilon: float | None = None, training: int = 0,
               repeat: int | None = None, before_audit: bool = False) -> dict:
    """Evaluate every release condition of what releasing `method` of the run would publish: `refused` lists
    every one that fails (a refusal is an answer, not a task failure: the flow turns it into a Failed state
    with that message and no stored result); `selector` picks the same artifact for `register`.

    `before_audit`: every condition but the audit's verdict (seeded noise, ledger entries, the accountants'
    cross-check, changed files): what refuses the release whatever the audit would find."""
    from dpcore.privacy.ledger import Ledger

    artifact = load_artifact(run_id, method, epsilon, training, repeat)
    evidence = gate.evidence(artifact, Ledger().entries_for_run(run_id))
    if before_audit:
        evidence = replace(evidence, audit_ran=True, audit_passed=True)
    failures = gate.release_failures(evidence)
    if artifact.changed_files:
        failures.append(f"run files changed since the run finished: {', '.join(artifact.changed_files)}")
    when = " before its membership audit, which was not run" if before_audit else ""
    refused = (f"release of run {run_id} ({method} {artifact.name}, epsilon {fmt_eps(artifact.epsilon)}) "
               f"refused{when}:\n" + "\n".join(f"- {line}" for line in failures) if failures else None)
    if refused is None and not before_audit:
        get_run_logger().info("release gate passed for run %s (%s %s, epsilon %s)", run_id, method, artifact.name,
                              fmt_eps(artifact.epsilon))
    return {"run_id": run_id, "method": method, "artifact": artifact.name, "epsilon": artifact.epsilon,
            "run_dir": str(artifact.path), "selector": artifact.selector, "refused": refused}


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


def _write_release_folder(folder: Path, artifact: gate.Artifact, manifest_of) -> dict:
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


# --------------------------------------------------------------------------- using a release; the release audit


def answer_queries(release: str, dataset_id: str | None, texts: list[str], *, model: str | None = None,
                   device: str = "auto", calibrate: bool | None = None, endpoint=None) -> tuple[dict, str, list[dict]]:
    """`dpicl predict`: ICL answers to `texts` with a release's demos (or its trained prompt) only, post-processing
    of a DP release (no privacy cost): (the release manifest, the model's name, one answer per text).

    `calibrate` None: the method's scoring (`dpcore.release.predict.default_calibration`).

    `endpoint` (a `dpcore.release.endpoint.EndpointConfig`): answer through that OpenAI-compatible server instead of a
    local model (`model` is then the served model's name); a PromptDPSGD release is refused (local only)."""
    from dpcore.data.taskspec import TaskSpec
    from dpcore.release import predict

    manifest = load_release(release, dataset_id)
    released = release_spec(manifest.get("method", UNNAMED_METHOD))
    spec = TaskSpec.model_validate(manifest["task_spec"])
    demos = [(d["text"], d["label"]) for d in manifest["demos"]]
    if calibrate is None:
        calibrate = predict.default_calibration(manifest.get("method"))
    if endpoint is not None:
        from dpcore.release import endpoint as remote
        from dpcore.release.export import local_only_reason

        reason = local_only_reason(manifest, "it cannot be sent to an endpoint", released)
        if reason:
            raise ConfigError(reason)
        config = endpoint if model is None else replace(endpoint, model=model)
        connection = remote.connect(config, known_model=manifest.get("model"))
        return manifest, connection.model, remote.answer(connection, spec, demos, texts, calibrate=calibrate)
    lm = language_model(model or manifest["model"], device=device)
    name, past = lm.name, None
    if released.kind == TRAINED_PROMPT:
        lm, past = predict.trained_model(lm, Path(manifest["release_dir"]) / manifest["artifact"]["file"],
                                         manifest["model_weights_sha256"], manifest["model"])
    return manifest, name, predict.answer(lm, spec, demos, texts, calibrate=calibrate, past=past)


def export_release(release: str, dataset_id: str | None, placeholder: str | None = None) -> tuple[dict, dict]:
    """`dpicl export`: (the release manifest, its prompt template and guarantee, `dpcore.release.export.export`);
    a PromptDPSGD release is refused (no text form)."""
    from dpcore.release import export

    manifest = load_release(release, dataset_id)
    released = release_spec(manifest.get("method", UNNAMED_METHOD))
    return manifest, export.export(manifest, released, placeholder or export.DEFAULT_PLACEHOLDER)


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


def _private_folder(artifact: gate.Artifact) -> Path:
    """The run's private folder (`$DPICL_HOME/private/runs/<same path as the public one>`)."""
    from dpcore.home import private_dir

    return private_dir() / artifact.path.relative_to(dpicl_home())


def _sampled_ids(private: Path, artifact: gate.Artifact) -> list[str] | None:
    """The ids of the records a DP-SGD training's Poisson batches drew (its private training record)."""
    path = private / "training" / f"{artifact.name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("sampled_ids")


def _merge_rows(path: Path, frame, name: str):
    """`frame` (rows of artifact `name`) in the table at `path`, replacing that artifact's earlier rows."""
    if path.exists():
        kept = read_table(path)
        kept = kept[kept["artifact"] != name] if "artifact" in kept.columns else kept[:0]
        frame = pd.concat([kept, frame], ignore_index=True)
    return write_table(frame, path)


def planned_audit(audit_config, member_pool: int, non_member_pool: int, size_to_pools: bool,
                  cap_to_pools: bool = False):
    """The audit to run on these pools (`dpcore.audit.design`). `size_to_pools`: the cheapest design that
    concludes, refused (`ReleaseRefusedError`) when none would; otherwise `audit_config`'s sizes (capped to
    the pools when `cap_to_pools`: a pipeline's settings, sized for another method), said in one line when
    they would not conclude, and run as asked."""
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run

    reserve = audit_config.reference_prompts if audit_config.reference_prompts >= 2 else 0
    pools = (member_pool, max(0, non_member_pool - reserve))
    sizes = audit_design.settings(audit_config, len(attacks_run(audit_config.reference_prompts)))
    if size_to_pools:
        chosen = audit_design.cheapest_conclusive(*pools, **sizes)
    else:
        if cap_to_pools:
            audit_config = audit_config.model_copy(update={
                "members": max(1, min(audit_config.members, pools[0])),
                "non_members": max(1, min(audit_config.non_members, pools[1]))})
        chosen = audit_design.plan(*pools, members=audit_config.members, non_members=audit_config.non_members,
                                   trials=audit_config.trials, **sizes)
    refusal = audit_design.cannot_conclude(chosen, *pools, members_are="the records the mechanism read",
                                           non_members_are="the held-out and unread records")
    if refusal is not None and size_to_pools:
        raise ReleaseRefusedError(refusal)
    if refusal is not None:
        get_run_logger().warning("%s (running it with the sizes asked)", refusal)
    elif audit_design.shortfall_note(chosen):
        get_run_logger().warning("%s", audit_design.shortfall_note(chosen))
    if size_to_pools:
        audit_config = audit_config.model_copy(update={"members": chosen.members, "non_members": chosen.non_members,
                                                       "trials": chosen.trials})
    return audit_config


@stoppable_task(name="release-audit", tags=["gpu"], retries=0, persist_result=False)
def audit_artifact(run_id: str, method: str, audit_config, epsilon: float | None = None, training: int = 0,
                   repeat: int | None = None, teacher_reference: bool = False, device: str = "auto",
                   dtype: str = "auto", seed: int | None = None, size_to_pools: bool = False,
                   cap_to_pools: bool = False) -> dict:
    """The membership-inference audit of an artifact audited at its release (`ReleaseSpec.audit_file`: a
    PromptPATE student prompt, a PromptDPSGD trained prompt, a registered method's demonstrations or instruction;
    and, when asked, of single PromptPATE teachers: non-private, charged as an infinite spend first). An audit
    row of the same artifact under the same audit configuration is reused. Returns public summaries.

    Members: the private records the mechanism read (`ReleaseSpec.members`); non-members: the held-out records
    and the private records it never read (a teacher never held them; no Poisson batch drew them). The design is planned
    before the model loads (`planned_audit`): `size_to_pools` takes the cheapest design that concludes on
    these pools instead of `audit_config`'s sizes and refuses (`ReleaseRefusedError`), naming the pool that
    falls short, when none would, before minutes are spent; `cap_to_pools` caps the sizes asked."""
    from dpcore.audit import procedures as mia
    from dpcore.audit.gate import GateThresholds
    from dpcore.data.taskspec import TaskSpec
    from tasks.audit import public_summary

    released = release_spec(method)
    if not released.audited_at_release:
        raise ConfigError(f"--method {method}: its artifact was audited by its own run, not at its release")
    artifact = load_artifact(run_id, method, epsilon, training, repeat)
    if not gate.released_count(artifact):
        raise ConfigError(f"run {run_id}: {released.nothing_releasable}")
    train, members, held_out, assignment = _audit_pools(artifact)
    audit_config = planned_audit(audit_config, *_public_pool_sizes(artifact, train, members, held_out),
                                 size_to_pools, cap_to_pools)
    if artifact.drawn_records is not None and (len(members) < audit_config.members
                                               or len(held_out) < audit_config.non_members):
        # only below the pools' public lower bounds (`_public_pool_sizes`: a one-in-a-million draw): refused
        # without the realised counts, which would reveal the batches' sizes
        raise ReleaseRefusedError(
            f"run {artifact.run_id}: the audit's design needs more of the records the mechanism read (or left "
            "unread) than its sampling drew, a rare draw of the sampling; audit it with fewer --audit-members")
    # an audit asked for with another seed draws other trials: not the stored one
    key = audit_config.model_dump_json()
    if seed is not None:
        key = json.dumps({**json.loads(key), "seed": int(seed)})
    done = _reused_audit(artifact, key, teacher_reference)
    if done is not None:
        return done
    lm = language_model(artifact.info["model"], device, dtype)
    past = None
    if released.kind == TRAINED_PROMPT:
        from dpcore.release.predict import trained_model

        lm, past = trained_model(lm, artifact.prompt_path, artifact.info["model_weights_sha256"],
                                 artifact.info["model"])
    spec = TaskSpec.model_validate(artifact.task_spec)
    split_seed = derive_seed(seed if seed is not None else int(str(artifact.info["data_hash"])[:15], 16),
                             "release-audit")
    thresholds = GateThresholds.from_config(audit_config)
    # a trained prompt's one DP-SGD spend; the other methods' several spends have no one noise multiplier
    noise = artifact.spends[0]["noise_multiplier"] if released.kind == TRAINED_PROMPT else None
    result = mia.prompt_audit(
        lm, spec, list(artifact.demos), members, held_out, audit_config, seed=split_seed, setting="dp",
        epsilon=artifact.epsilon, noise_multiplier=None if noise is None else float(noise), delta=artifact.delta,
        crosscheck_agreed=gate.plan_crosscheck(artifact.spends, artifact.delta), past=past, thresholds=thresholds,
        progress=lambda done, total: report_progress(f"audit {artifact.name}", done, total),
        should_stop=stop_requested)
    out = {"artifact": artifact.name, "reused": False, "audit": public_summary(result)}
    get_run_logger().info(ARTIFACT_AUDIT_LOG, method, artifact.name, out["audit"]["verdict"])
    _write_audit_rows(artifact, key, result, artifact.name, out["audit"])
    results = [result]
    if teacher_reference and assignment is not None:
        reference = _teacher_contrast(lm, spec, artifact, train, assignment, held_out, audit_config,
                                      seed=derive_seed(split_seed, "teachers"), thresholds=thresholds)
        out["teacher_reference"] = public_summary(reference)
        _write_audit_rows(artifact, key, reference, "teacher", out["teacher_reference"])
        results.append(reference)
    scores = [r.mia_scores.assign(artifact=artifact.name if r is result else "teacher") for r in results]
    _merge_rows(_private_folder(artifact) / f"mia_scores_{method}.parquet", pd.concat(scores, ignore_index=True),
                artifact.name)
    _reseal(artifact)
    return out


def _audit_pools(artifact: gate.Artifact):
    """(the private split, the members: the records the mechanism read (`ReleaseSpec.members`), the non-members:
    held-out records and the private records it never read, the teacher assignment or None), from the run's
    private store."""
    private = _private_folder(artifact)
    records_path = private / "records.parquet"
    assignment_path = private / "teacher_assignments.parquet"
    read = artifact.spec.members
    for needed in [records_path] + ([assignment_path] if read == "teachers" else []):
        if not needed.exists():
            raise ConfigError(f"run {artifact.run_id}: {needed} is missing (the audit needs the run's private "
                              "records)")
    records = read_table(records_path)
    train = records[records["split"] == "train"][["id", "text", "label"]].reset_index(drop=True)
    assignment = read_table(assignment_path) if read == "teachers" else None
    if assignment is not None:
        read_ids = assignment["id"].astype(str).tolist()
    elif read == "every-record":  # every training record could be sampled (q > 0)
        read_ids = train["id"].astype(str).tolist()
    else:
        read_ids = _sampled_ids(private, artifact)
    members = gate.audit_members(artifact, train, read_ids)
    unread = train[~train["id"].astype(str).isin(set(members["id"].astype(str)))]
    held_out = pd.concat([records[records["split"] == "test"][["id", "text", "label"]], unread], ignore_index=True)
    return train, members, held_out, assignment


POOL_BOUND_FAILURE = 1e-6  # the probability that the sampling drew fewer records than a pool's lower bound


def _public_pool_sizes(artifact: gate.Artifact, train, members, held_out) -> tuple[int, int]:
    """The pool sizes the audit is designed from, said and published: functions of public counts. When the
    members are a Poisson draw (`Artifact.drawn_records`: PromptDPSGD's batches), how many it drew is a non-DP
    statistic of the sampling (it reveals the batch sizes). Each of the N records is drawn at least once with probability p = 1 - (1 - q)^T,
    independently, so the number drawn is Binomial(N, p): the design reads its lower POOL_BOUND_FAILURE
    quantile for the members and N minus its upper one for the unread records, public numbers the realised
    pools fall below only in a one-in-a-million draw (then the audit is refused, `audit_artifact`)."""
    if artifact.drawn_records is None:
        return len(members), len(held_out)
    from scipy.stats import binom

    q, steps = artifact.drawn_records
    n = len(train)
    p = 1.0 - (1.0 - q) ** steps
    drawn_low = int(binom.ppf(POOL_BOUND_FAILURE, n, p))
    drawn_high = int(binom.isf(POOL_BOUND_FAILURE, n, p))
    return drawn_low, len(held_out) + len(members) - drawn_high


def _reused_audit(artifact: gate.Artifact, key: str, teacher_reference: bool) -> dict | None:
    """The public summaries of an audit of this artifact under the same configuration (`key`), or None."""
    audit_path = artifact.path / artifact.spec.audit_file
    teacher_path = artifact.path / TEACHER_AUDIT_FILE
    done = read_table(audit_path) if audit_path.exists() else None
    if done is None or not ((done["artifact"] == artifact.name) & (done["audit_config"] == key)).any():
        return None
    if teacher_reference and not teacher_path.exists():
        return None
    row = done[(done["artifact"] == artifact.name) & (done["audit_config"] == key)].iloc[-1]
    out = {"artifact": artifact.name, "reused": True, "audit": json.loads(row["summary"])}
    if teacher_reference:
        out["teacher_reference"] = json.loads(read_table(teacher_path).iloc[-1]["summary"])
    return out


def _write_audit_rows(artifact: gate.Artifact, key: str, result, name: str, summary: dict) -> None:
    """An audit's rows: its figures (AUCs, intervals, overlap) to the private store, its verdict to the public
    table. `name`: the artifact's name, or "teacher" for the single-teacher contrast (its own files)."""
    tags = dict(artifact=name, method=artifact.method, audit_config=key, summary=json.dumps(summary))
    private = _private_folder(artifact)
    if name == "teacher":
        write_table(result.audit_frame().assign(**tags), private / TEACHER_AUDIT_FILE)
        write_table(result.public_frame().assign(**tags), artifact.path / TEACHER_AUDIT_FILE)
        return
    audit_file = artifact.spec.audit_file
    _merge_rows(private / audit_file, result.audit_frame().assign(**tags), artifact.name)
    _merge_rows(artifact.path / audit_file, result.public_frame().assign(**tags), artifact.name)


def _teacher_contrast(lm, spec, artifact: gate.Artifact, train, assignment, held_out, audit_config, *, seed: int,
                      thresholds):
    """The non-private contrast: single PromptPATE teachers' prompts (real records), charged as an infinite
    spend before any teacher prompt is built."""
    from dpcore.audit import procedures as mia

    _charge_real_records(artifact)
    reference = mia.teacher_audit(lm, spec, teacher_prompts(train, assignment), held_out, audit_config,
                                  seed=seed, delta=artifact.delta, thresholds=thresholds,
                                  progress=lambda done, total: report_progress("audit single teachers", done, total),
                                  should_stop=stop_requested)
    get_run_logger().info("non-private contrast (single teachers' prompts): %s", mia.verdict_word(
        reference.passed, reference.reasons))
    return reference


def _reseal(artifact: gate.Artifact) -> None:
    """The run folder's manifest extended to the audit tables just written, so an edited audit is caught by
    the gate's tamper check; a folder with a file changed since its run is never re-sealed."""
    if artifact.changed_files:
        return
    kept = json.loads((artifact.path / "manifest.json").read_text())
    kept.pop("files", None)
    write_manifest(artifact.path, extra=kept)


def _charge_real_records(artifact: gate.Artifact) -> dict:
    """The single-teacher contrast's infinite spend (real records in prompts), one transaction, under the run id."""
    from dpcore.config import RunConfig

    config = RunConfig(dataset=str(artifact.info.get("dataset") or artifact.dataset_id), dataset_id=artifact.dataset_id)
    request = real_records_spend(config, str(artifact.info["data_hash"]), artifact.run_id, artifact.delta)
    return charge_spends(artifact.dataset_id, [(AUDIT_REFERENCE, math.inf, request)])
