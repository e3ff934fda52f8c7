"""PromptPATE's release (Duan et al. Section 4.2): the student prompt of one repeat (public queries with noisy
labels) with the run's plan (`pate_plan.json`): every spend of the plan under purpose `pate`; its audit's
members are the teachers' records (the private teacher assignment); its `ReleaseSpec`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpcore.data.artifacts import read_table
from dpcore.errors import ConfigError
from dpcore.pate.teachers import Teachers
from dpcore.release.runs import (
    changed_files,
    read_json,
    run_delta_source,
    run_folder,
    run_inputs,
    run_manifest,
    run_task_spec,
)
from dpcore.release.spec import DELTA_ASSUMPTION, DEMONSTRATIONS, Artifact, ReleaseSpec

METHOD = "pate"
PATE_PLAN_FILE = "pate_plan.json"  # public: the PromptPATE run's plan, ledger id and seeded flag (flows.pate)
TEACHER_AUDIT_FILE = "audit_pate_teacher.parquet"  # public: the non-private single-teacher contrast
PUBLIC_QUERIES = ("the public queries are public data: a shipped source's public split, a shipped out-of-distribution "
                  "set, or a file the user declared public (never compared with the private records)")
ASSUMPTIONS = (
    PUBLIC_QUERIES,
    "the epsilon is the data-independent bound the ledger charged (threshold test and GNMax on every "
    "query of every repeat); the data-dependent bound is a non-DP statistic kept in the private store",
    DELTA_ASSUMPTION)
# under `--pate-accounting data-dependent` (`dpcore.pate.released_cost`)
DATA_DEPENDENT_ASSUMPTIONS = (
    PUBLIC_QUERIES,
    "the epsilon composes the smooth-sensitivity release (Papernot et al. 2018, Theorem 23) with the labelling "
    "charged at the released upper bound on its data-dependent Renyi cost (parameters.released_rdp, a DP "
    "statistic); that bound falls below the true data-dependent cost with probability parameters.gnss_delta0, "
    "which is part of delta; the data-dependent cost is Papernot et al.'s analysis of the votes",
    DELTA_ASSUMPTION)


def load_pate_artifact(spec: ReleaseSpec, run_id: str, home: Path, *, epsilon: float | None = None,
                       training: int = 0, repeat: int | None = None) -> Artifact:
    """The student prompt of a PromptPATE run (`repeat`, default the repeat the run chose: best public
    validation accuracy) with the run's plan (`pate_plan.json`): every spend of the plan under purpose `pate`."""
    if epsilon is not None:
        raise ConfigError("--epsilon: a PromptPATE run has one student prompt per repeat (its epsilon is the "
                          "plan's); use --repeat")
    path = run_folder(run_id, home, spec.plan_file, "not a PromptPATE run")
    plan = read_json(path / spec.plan_file)
    students = read_table(path / "pate_students.parquet")
    chosen = plan.get("best_repeat") if repeat is None else int(repeat)
    available = sorted({int(r) for r in students["repeat"]}) if len(students) else []
    if repeat is not None and chosen not in available:
        raise ConfigError(f"--repeat {repeat}: run {run_id} has student prompts of repeats {available or 'none'}")
    rows = students[students["repeat"] == chosen].sort_values("position") if chosen is not None else students[:0]
    demos = tuple((str(t), str(y)) for t, y in zip(rows["text"], rows["label"], strict=True))
    audit_path = path / spec.audit_file
    inputs = run_inputs(path)
    data_dependent = plan["plan"]["parameters"].get("accounting") == "data-dependent"
    return Artifact(
        method=METHOD, run_id=run_id, path=path, name=f"student-r{chosen}", epsilon=float(plan["plan"]["epsilon"]),
        delta=float(plan["plan"]["delta"]), spends=tuple(plan["plan"]["spends"]),
        seeded_noise=bool(plan["seeded_noise"]),
        info={k: plan.get(k) for k in ("model", "dataset", "dataset_id", "data_hash", "task_spec")}
        | {"parameters": plan["plan"]["parameters"], "repeat": chosen},
        demos=demos, changed_files=changed_files(path), audit=read_table(audit_path) if audit_path.exists() else None,
        table=pd.DataFrame([{"text": t, "label": y} for t, y in demos], columns=["text", "label"]),
        selector={"repeat": chosen},
        task_spec=run_task_spec(run_id, inputs, plan.get("task_spec") or plan.get("dataset")),
        delta_source=run_delta_source(inputs, run_manifest(path).get("config")),
        assumptions=DATA_DEPENDENT_ASSUMPTIONS if data_dependent else spec.assumptions, spec=spec)


def teacher_prompts(train: pd.DataFrame, assignment: pd.DataFrame) -> list[pd.DataFrame]:
    """Each PromptPATE teacher's records (id, text, label), in prompt order, from the private assignment."""
    by_id = train.assign(id=train["id"].astype(str)).set_index("id")
    teachers = Teachers.from_table(assignment, int(assignment["teacher"].max()) + 1 if len(assignment) else 0)
    return [by_id.loc[list(ids), ["text", "label"]].reset_index() for ids in teachers.demos if ids]


RELEASE = ReleaseSpec(
    method=METHOD, kind=DEMONSTRATIONS, load=load_pate_artifact,
    nothing_releasable="the run produced no PromptPATE student prompt (no repeat labelled enough queries)",
    assumptions=ASSUMPTIONS, plan_file=PATE_PLAN_FILE, artifact_file="pate_students.parquet",
    audit_file="audit_pate.parquet", members="teachers")
