"""The loader of a method the registry plans (`tasks.methods.MethodEntry.plan`): its release read from its run's
plan file (`ReleaseSpec.plan_file`: its plans as charged, the run's model, data identity, task spec and seeded
flag, written by `flows.methods.evaluated_rows`) and its artifact per epsilon (`ReleaseSpec.artifact_file`):
demonstrations (a table of text and label) or an instruction (JSON, {"instruction": ...}), by the spec's kind."""

from __future__ import annotations

from pathlib import Path

from dpcore.data.artifacts import read_table
from dpcore.errors import ConfigError
from dpcore.release.runs import (
    changed_files,
    eps_name,
    pick_epsilon,
    read_json,
    run_delta_source,
    run_folder,
    run_inputs,
    run_manifest,
    run_task_spec,
)
from dpcore.release.spec import INSTRUCTION, Artifact, ReleaseSpec


def read_instruction(path: Path) -> str:
    """The instruction an instruction release's file holds ({"instruction": ...})."""
    return str(read_json(path)["instruction"])


def load_planned_artifact(spec: ReleaseSpec, run_id: str, home: Path, *, epsilon: float | None = None,
                          training: int = 0, repeat: int | None = None) -> Artifact:
    """The method's artifact at `epsilon` (default the smallest of the run), with its plan's spends (purpose the
    method's) as what the ledger must hold; the cross-check is recomputed on them."""
    method = spec.method
    path = run_folder(run_id, home, spec.plan_file, f"not a run of {method}")
    sealed = read_json(path / spec.plan_file)
    plans = {float(p["epsilon"]): p for p in sealed["plans"]}
    available = sorted(plans)
    if not available:
        raise ConfigError(f"run {run_id}: {spec.nothing_releasable}")
    chosen = available[0] if epsilon is None else pick_epsilon(epsilon, available, f"run {run_id} has {method} at")
    plan = plans[chosen]
    artifact_path = path / spec.artifact_file.format(eps_name(chosen))
    inputs = run_inputs(path)
    task_spec = run_task_spec(run_id, inputs, sealed.get("task_spec") or sealed.get("dataset"))
    demos, table, instruction = (), None, None
    if spec.kind == INSTRUCTION:
        if artifact_path.exists():
            instruction = read_instruction(artifact_path)
            # it leads every prompt
            task_spec = {**task_spec, "icl": {**task_spec["icl"], "instruction": instruction.strip()}}
    elif artifact_path.exists():
        table = read_table(artifact_path)
        demos = tuple((str(t), str(y)) for t, y in zip(table["text"], table["label"], strict=True))
    audit_path = path / spec.audit_file
    return Artifact(
        method=method, run_id=run_id, path=path, name=f"{method}-eps{eps_name(chosen)}", epsilon=chosen,
        delta=float(plan["delta"]), spends=tuple(plan["spends"]), seeded_noise=bool(sealed.get("seeded_noise")),
        info={k: sealed.get(k) for k in ("model", "dataset", "dataset_id", "data_hash", "task_spec")}
        | {"parameters": plan["parameters"]},
        demos=demos, changed_files=changed_files(path),
        audit=read_table(audit_path) if audit_path.exists() else None,
        samplers=("poisson",), table=table, selector={"epsilon": chosen}, task_spec=task_spec,
        delta_source=run_delta_source(inputs, run_manifest(path).get("config")), assumptions=spec.assumptions,
        instruction=instruction, spec=spec)
