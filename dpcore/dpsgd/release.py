"""PromptDPSGD's release (Duan et al. Section 4.1): a trained prompt (or adapter) of one epsilon and training,
its DP-SGD steps (Poisson-sampled, purpose `dpsgd`) the spend the ledger must hold; its audit's members are the
records some batch drew (the training's private record); its `ReleaseSpec`."""

from __future__ import annotations

from pathlib import Path

from dpcore.data.artifacts import read_table
from dpcore.display import fmt_eps
from dpcore.errors import ConfigError
from dpcore.home import find_run_dir
from dpcore.release.runs import (
    changed_files,
    config_value,
    pick_epsilon,
    read_json,
    run_delta_source,
    run_inputs,
    run_manifest,
    run_task_spec,
    unfinished,
)
from dpcore.release.spec import DELTA_ASSUMPTION, TRAINED_PROMPT, Artifact, ReleaseSpec

METHOD = "dpsgd"
ASSUMPTIONS = (
    "the trained prompt (or LoRA adapter, or fine-tuned weights) means something only on the model whose "
    "weight sha256 the manifest names; `dpicl predict` refuses any other model",
    "add/remove neighbours over the DP-SGD training records (every private record); the loss curve "
    "was computed on public examples only",
    DELTA_ASSUMPTION)
PARAMETERS = ("kind", "length", "rank", "clip", "batch_size", "lr", "init", "training", "noise_multiplier",
              "sampling_rate", "steps")


def load_dpsgd_artifact(spec: ReleaseSpec, run_id: str, home: Path, *, epsilon: float | None = None,
                        training: int = 0, repeat: int | None = None) -> Artifact:
    """A trained prompt of a PromptDPSGD run: `epsilon` (default the smallest of the run) and `training`; its
    DP-SGD steps (Poisson-sampled, purpose `dpsgd`) are the spend the ledger must hold."""
    path = find_run_dir(run_id, home)
    manifests = {p: read_json(p) for p in sorted((path / "prompts").glob("dpsgd-eps*.json"))}
    if not manifests:
        if not (path / "manifest.json").exists():
            raise unfinished(run_id, path)
        raise ConfigError(f"run {run_id!r}: no trained prompt under {path / 'prompts'} (not a PromptDPSGD run)")
    available = sorted({float(m["epsilon"]) for m in manifests.values()})
    chosen = available[0] if epsilon is None else pick_epsilon(epsilon, available,
                                                                f"run {run_id} has trained prompts at")
    found = [(p, m) for p, m in manifests.items() if float(m["epsilon"]) == chosen and int(m["training"]) == training]
    if not found:
        trainings = sorted(int(m["training"]) for m in manifests.values() if float(m["epsilon"]) == chosen)
        raise ConfigError(f"--epsilon {fmt_eps(chosen)} --training {training}: run {run_id} has trainings "
                          f"{', '.join(map(str, trainings))} at that epsilon")
    json_path, m = found[0]
    run = run_manifest(path)
    spend = {"mechanism": "gaussian", "noise_multiplier": m["noise_multiplier"], "sampling_rate": m["sampling_rate"],
             "steps": m["steps"], "purpose": m.get("method", METHOD)}
    audit_path = path / spec.audit_file
    return Artifact(
        method=METHOD, run_id=run_id, path=path, name=json_path.stem, epsilon=chosen, delta=float(m["delta"]),
        spends=(spend,), seeded_noise=bool(m["seeded_noise"]),
        info={"model": m["model"], "dataset": run.get("dataset"),
              "dataset_id": config_value(run.get("config", {}).get("dataset_id")) or run.get("dataset"),
              "data_hash": m.get("data_hash"), "task_spec": m.get("task_spec"),
              "model_weights_sha256": m["model_weights_sha256"],
              "parameters": {k: m.get(k) for k in PARAMETERS}},
        prompt_path=json_path.with_suffix(".safetensors"), changed_files=changed_files(path),
        audit=read_table(audit_path) if audit_path.exists() else None,
        samplers=("poisson",), selector={"epsilon": chosen, "training": training},
        task_spec=run_task_spec(run_id, run_inputs(path), m.get("task_spec") or run.get("dataset")),
        delta_source=run_delta_source(run_inputs(path), run.get("config")), assumptions=spec.assumptions,
        drawn_records=(float(m["sampling_rate"]), int(m["steps"])), spec=spec)


def trained_model(lm, artifact_file: Path, weights_sha256: str, trained_on: str) -> tuple:
    """(the model to answer with, the cache before every prompt) of a PromptDPSGD release
    (`adapters.trained_scoring`: a trained prompt's cache on `lm`, or `lm` with a LoRA adapter or fine-tuned
    weights applied), refused unless `lm` holds the weights it was trained on (`soft_prompt.weights_hash`):
    a trained prompt or adapter means nothing on another model (`ReleaseSpec.applied_to_model`)."""
    from dpcore.dpsgd.adapters import trained_scoring  # torch
    from dpcore.dpsgd.soft_prompt import weights_hash

    if weights_hash(lm.model) != weights_sha256:
        raise ConfigError(f"model {lm.name!r}: a PromptDPSGD prompt or adapter answers only on the model it was "
                          f"trained on ({trained_on}, weight sha256 {weights_sha256[:12]}...)")
    return trained_scoring(lm, artifact_file)


RELEASE = ReleaseSpec(
    method=METHOD, kind=TRAINED_PROMPT, load=load_dpsgd_artifact,
    nothing_releasable="the run produced no PromptDPSGD trained prompt", assumptions=ASSUMPTIONS,
    audit_file="audit_dpsgd.parquet", members="sampled", applied_to_model=trained_model)
