"""A finished run's public files as a release's loader reads them, for every method: the run folder (refused,
saying what to do next, when the run stopped before it finished), the epsilon asked for, the task spec the run
kept, where its delta came from, and the files changed since its manifest."""

from __future__ import annotations

import json
import math
from pathlib import Path

from dpcore.data.artifacts import RUN_INPUTS_FILE, verify_manifest
from dpcore.data.taskspec import TaskSpec, load_task_spec
from dpcore.display import fmt_eps
from dpcore.errors import ConfigError
from dpcore.home import find_run_dir


def unfinished(run_id: str, path: Path) -> ConfigError:
    """The refusal of a run that stopped before it finished (no manifest.json), saying what to do next."""
    return ConfigError(f"run {run_id!r} stopped before it finished ({path} has no manifest.json): resume it with the "
                       f"command it was started with and --run-id {run_id} (`dpicl run ... --run-id {run_id}`: its "
                       "finished stages and steps are kept and nothing is charged again), then release it")


def run_folder(run_id: str, home: Path, needed: str | None, what: str) -> Path:
    """The public folder of run `run_id`; with `needed` (a file of it, else refused): a run that stopped
    before it finished is told to resume, another says it is `what` it is not ("not a run of ...")."""
    path = find_run_dir(run_id, home)
    if needed is not None and not (path / needed).exists():
        if not (path / "manifest.json").exists():
            raise unfinished(run_id, path)
        raise ConfigError(f"run {run_id!r}: {path / needed} is missing ({what})")
    return path


def pick_epsilon(epsilon: float, available: list[float], where: str) -> float:
    """The available epsilon asked for: exactly, or the one that reads the same rounded for people
    (`dpcore.display.fmt_eps`: a refusal lists them rounded, and a person types what was shown)."""
    if float(epsilon) in available:
        return float(epsilon)
    same = [e for e in available if fmt_eps(e) == fmt_eps(float(epsilon))]
    if len(same) == 1:
        return same[0]
    shown = ", ".join(fmt_eps(e) for e in available) or "none"
    raise ConfigError(f"--epsilon {fmt_eps(float(epsilon))}: {where} epsilon {shown}")


def eps_name(epsilon: float) -> str:
    """An epsilon as run files name it ("inf", "4", "0.5")."""
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def run_manifest(path: Path) -> dict:
    """The run folder's manifest; {} when it has none."""
    return read_json(path / "manifest.json") if (path / "manifest.json").exists() else {}


def changed_files(path: Path) -> tuple[str, ...]:
    """The run files changed since its manifest (a folder without one: the manifest, missing)."""
    return tuple(verify_manifest(path)) if (path / "manifest.json").exists() else ("manifest.json (missing)",)


def config_value(value) -> str | None:
    """A run manifest's config value, None when unset (older manifests wrote "None")."""
    return None if value in (None, "None", "") else str(value)


def run_inputs(path: Path) -> dict:
    """What a run kept of its inputs (`RUN_INPUTS_FILE`); {} for a run made before they were kept."""
    return read_json(path / RUN_INPUTS_FILE) if (path / RUN_INPUTS_FILE).exists() else {}


def run_task_spec(run_id: str, inputs: dict, named: str | None) -> dict:
    """The task spec a run was made with, as JSON: the content it kept; for a run made before it kept one, the
    shipped task or spec file it names, read now (a relative path reads from the working directory: refused
    in one line when it is not there, before anything is written)."""
    if inputs.get("task_spec") is not None:
        try:
            return TaskSpec.model_validate(inputs["task_spec"]).model_dump(mode="json")
        except ValueError:
            raise ConfigError(f"run {run_id}: {RUN_INPUTS_FILE}: the task spec it kept is not a task spec") from None
    if not named:
        raise ConfigError(f"run {run_id}: it names no task spec")
    try:
        return load_task_spec(named).model_dump(mode="json")
    except ConfigError as exc:
        raise ConfigError(f"run {run_id}: {exc} (the run, made by an earlier dpicl, kept only this name of its task "
                          "spec: release it from the folder it was started in)") from None


def run_delta_source(inputs: dict, config: dict | None) -> str | None:
    """Where a run's delta came from: as it recorded it; for an older run whose configuration gave no delta,
    1/|D|; else None (given, by --delta or its budget: the run did not say which)."""
    if inputs.get("delta_source"):
        return str(inputs["delta_source"])
    if config and "delta" in config and config_value(config.get("delta")) is None:
        return "1/|D|"
    return None
