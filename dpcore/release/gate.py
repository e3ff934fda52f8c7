"""The audited-release gate and the release manifest, for every private-prompting method.

Three kinds of artifact are releasable (`METHODS`): DP few-shot generation's synthetic
demonstrations (`tang`, Tang et al.), PromptPATE's student prompt (`pate`, Duan et al.
Section 4.2: k public queries with noisy labels) and a PromptDPSGD trained prompt (`dpsgd`,
Duan et al. Section 4.1: a soft prompt or prefix, safetensors, meaningful on its model only).
An artifact may be released to production only when every condition holds:
  1. its membership-inference audit ran and passed,
  2. its noise was cryptographically seeded (a fixed-seed experiment is never released),
  3. its privacy spend is recorded in the ledger: an entry of that run holds the released
     demos' calibration row (mechanism, sigma, q, T, delta), not merely any entry of the run id,
  4. the accountant cross-check agreed for every epsilon it released,
  5. its demos were drawn with a sampler the accountant's bound covers
     (`dpcore.fewshot.sampling.ACCOUNTED_SAMPLERS`: Poisson, and the fixed-size sampler under
     add/remove neighbours, proof in `dpcore.fewshot.sampling`).
A refusal lists every failed condition, not only the first. One path for every method: a loader
(`load_artifact`: `load_tang_artifact`, `load_pate_artifact`, `load_dpsgd_artifact`, and
`load_registered_artifact` for AdaDPSyn's demonstrations and DP-OPT's instruction) reads what the
release publishes into an `Artifact` carrying the method's facts (the spends the ledger must hold, under
which purposes; the samplers to cover; a recorded cross-check or none, then recomputed on the spends;
the audit table), and `evidence`, `release_failures` and `release_manifest` read only that. For
PromptPATE and PromptDPSGD the ledger condition is every spend of the plan under the method's purpose.
Artifacts released here are DP outputs: answering queries with them later is post-processing
(no privacy cost).

The release manifest states the guarantee of the demos themselves (their epsilon at their
delta) and the ledger's composed spend of the dataset when they were released (every entry
of the dataset id: other runs, audits, baselines), with what the guarantee assumes:
per-label record counts are treated as public, and the delta the run used, with where it came from
(`delta_assumption`: the run's --delta, its ledger budget's delta, or 1/|D|, the default: the paper's
choice, weak for a real deployment). The task spec it states is the one the run kept
(`dpcore.data.artifacts.RUN_INPUTS_FILE`), so a release reads the same from any working directory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dpcore.data.artifacts import RUN_INPUTS_FILE, read_table, verify_manifest
from dpcore.data.taskspec import TaskSpec, load_task_spec
from dpcore.display import fmt_delta, fmt_eps
from dpcore.errors import ConfigError
from dpcore.fewshot.sampling import ACCOUNTED_SAMPLERS
from dpcore.home import find_run_dir
from dpcore.names import METHODS, method_name
from dpcore.pate.teachers import Teachers
from dpcore.privacy import composition
from dpcore.privacy.events import event_from_dict, sampled_steps_event


@dataclass(frozen=True)
class ReleaseEvidence:
    """What the gate looks at, read from a finished run's public tables and the ledger."""

    run_id: str
    audit_ran: bool
    audit_passed: bool
    audit_reasons: tuple[str, ...]
    seeded_noise: bool
    ledger_entry_present: bool
    crosscheck_agreed: bool
    dp_demos: int
    epsilons: tuple[float, ...] = field(default_factory=tuple)
    samplers: tuple[str, ...] = field(default_factory=tuple)  # of the DP demos; "unrecorded" when absent
    method: str = "tang"


NOTHING_RELEASABLE = {"tang": "the run produced no DP demonstrations (only baselines)",
                      "pate": "the run produced no PromptPATE student prompt (no repeat labelled enough queries)",
                      "dpsgd": "the run produced no PromptDPSGD trained prompt",
                      "adadpsyn": "the run produced no AdaDPSyn demonstrations",
                      "dp-opt": "the run produced no DP-OPT instruction"}


def release_failures(evidence: ReleaseEvidence) -> list[str]:
    """Every failed release condition, one human-readable line each (empty: releasable)."""
    failures = []
    if evidence.dp_demos == 0:
        failures.append(NOTHING_RELEASABLE[evidence.method])
    if any(math.isinf(eps) for eps in evidence.epsilons):
        failures.append("the run includes epsilon = inf (sigma = 0) demonstrations, which are not private")
    if not evidence.audit_ran:
        failures.append("the run has no membership-inference audit (run with --audit)")
    elif not evidence.audit_passed:
        reasons = "; ".join(evidence.audit_reasons) or "no reason recorded"
        failures.append(f"the membership-inference audit failed: {reasons}")
    if evidence.seeded_noise:
        failures.append("the noise was drawn from a fixed seed (an experiment); rerun without --seed")
    if not evidence.ledger_entry_present:
        what = "demos'" if evidence.method == "tang" else f"{evidence.method} prompt's"
        failures.append(f"no privacy-ledger entry of run {evidence.run_id} records the released {what} spend "
                        "(their mechanism, sigma, q, T and delta)")
    if not evidence.crosscheck_agreed:
        failures.append("the accountant cross-check (prv-accountant vs dp-accounting PLD) did not agree")
    uncovered = sorted(set(evidence.samplers) - set(ACCOUNTED_SAMPLERS))
    if uncovered:
        failures.append(f"the demos were drawn with sampler {', '.join(uncovered)}, which the privacy accountant "
                        f"does not cover (covered: {', '.join(ACCOUNTED_SAMPLERS)})")
    return failures


# Where a release's assumptions state its delta: replaced in every manifest by `delta_assumption`, the delta the
# run used and where it came from.
DELTA_ASSUMPTION = "delta: the run's, and where it came from"
ASSUMPTIONS = (
    "per-label record counts |D_y| are treated as public (they set q = MN/|D_y|), as in Tang et al.",
    DELTA_ASSUMPTION,
)


def delta_assumption(delta: float, source: str | None, dataset_id: str) -> str:
    """What a release's guarantee assumes of its delta, by where the run took it from (`source`: one of
    `tasks.run_plans.DELTA_SOURCES`; None for a run that did not record it)."""
    shown = f"delta = {fmt_delta(delta)}"
    if source == "1/|D|":
        return (f"{shown} is 1/|D|, the default when a run is given no delta: the paper's choice for comparability, "
                "and weak (a mechanism at that delta may expose about one record); a deployment should set a "
                "smaller delta (dpicl run --delta, or a ledger budget's delta)")
    if source == "budget":
        return f"{shown} is the delta of the ledger budget of dataset id '{dataset_id}', which the run took"
    if source == "flag":
        return f"{shown} was given to the run (--delta)"
    return f"{shown} was given to the run (--delta, or its ledger budget's delta)"


def audit_verdict(audit: pd.DataFrame | None) -> tuple[bool, bool, tuple[str, ...]]:
    """(ran, passed, every failing reason) of an audit table (one row per audited prompt or epsilon)."""
    ran = audit is not None and len(audit) > 0
    passed = bool(ran and audit["passed"].astype(bool).all())
    reasons: tuple[str, ...] = ()
    if ran and "reasons" in audit.columns:
        reasons = tuple(line for value in audit.loc[~audit["passed"].astype(bool), "reasons"]
                        for line in str(value).splitlines() if line)
    return ran, passed, reasons


# --------------------------------------------------------------------------- finished runs on disk


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


def unfinished(run_id: str, path: Path) -> ConfigError:
    """The refusal of a run that stopped before it finished (no manifest.json), saying what to do next."""
    return ConfigError(f"run {run_id!r} stopped before it finished ({path} has no manifest.json): resume it with the "
                       f"command it was started with and --run-id {run_id} (`dpicl run ... --run-id {run_id}`: its "
                       "finished stages and steps are kept and nothing is charged again), then release it")


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
    return demos[demos["method"].map(method_name) == "tang"]


def choose_release_epsilon(run: RunFolder, epsilon: float | None) -> float:
    """The epsilon to release: the one asked for, else the smallest DP epsilon of the run (the strongest guarantee)."""
    dp = tang_demos(run.demos)
    available = sorted(set(float(e) for e in dp["epsilon"])) if "epsilon" in dp.columns else []
    if epsilon is None:
        if not available:
            raise ConfigError(f"run {run.run_id}: no DP demonstrations to release")
        return available[0]
    return _pick_epsilon(epsilon, available, f"run {run.run_id} has DP demos at")


def _pick_epsilon(epsilon: float, available: list[float], where: str) -> float:
    """The available epsilon asked for: exactly, or the one that reads the same rounded for people
    (`dpcore.display.fmt_eps`: a refusal lists them rounded, and a person types what was shown)."""
    if float(epsilon) in available:
        return float(epsilon)
    same = [e for e in available if fmt_eps(e) == fmt_eps(float(epsilon))]
    if len(same) == 1:
        return same[0]
    shown = ", ".join(fmt_eps(e) for e in available) or "none"
    raise ConfigError(f"--epsilon {fmt_eps(float(epsilon))}: {where} epsilon {shown}")




# --------------------------------------------------------------------------- what a release publishes, per method

PATE_PLAN_FILE = "pate_plan.json"  # public: the PromptPATE run's plan, ledger id and seeded flag (flows.pate)
AUDIT_FILES = {"pate": "audit_pate.parquet", "dpsgd": "audit_dpsgd.parquet",  # public, one row per artifact
               "adadpsyn": "audit_adadpsyn.parquet", "dp-opt": "audit_dp_opt.parquet"}
# public: a registered method's plans as charged, its run's model, data identity, task spec and seeded flag
# (`flows.methods.evaluated_rows`); its artifacts per epsilon (`tasks.adadpsyn`, `tasks.dp_opt`)
METHOD_PLAN_FILES = {"adadpsyn": "adadpsyn_plan.json", "dp-opt": "dp_opt_plan.json"}
METHOD_ARTIFACT_FILES = {"adadpsyn": "adadpsyn_demos_eps{}.parquet", "dp-opt": "dp_opt_instruction_eps{}.json"}
INSTRUCTION_FILE = "instruction.json"  # a released instruction (DP-OPT)
INSTRUCTION_METHODS = ("dp-opt",)  # methods whose release is an instruction (text), not demonstrations
TEACHER_AUDIT_FILE = "audit_pate_teacher.parquet"  # public: the non-private single-teacher contrast
DEMOS_FILE = "demos.parquet"  # a released text prompt (tang's demos, PromptPATE's student prompt)
# The ledger purposes that charge DP few-shot generation (the flow, the `generate` command).
TANG_PURPOSES = ("pipeline", "generate")
METHOD_ASSUMPTIONS = {
    "tang": ASSUMPTIONS,
    "pate": ("the public queries are public data: a shipped source's public split, a shipped out-of-distribution "
             "set, or a file the user declared public (never compared with the private records)",
             "the epsilon is the data-independent bound the ledger charged (threshold test and GNMax on every "
             "query of every repeat); the data-dependent bound is a non-DP statistic kept in the private store",
             ASSUMPTIONS[1]),
    # PromptPATE under `--pate-accounting data-dependent` (`dpcore.pate.released_cost`)
    "pate-data-dependent": (
        "the public queries are public data: a shipped source's public split, a shipped out-of-distribution "
        "set, or a file the user declared public (never compared with the private records)",
        "the epsilon composes the smooth-sensitivity release (Papernot et al. 2018, Theorem 23) with the labelling "
        "charged at the released upper bound on its data-dependent Renyi cost (parameters.released_rdp, a DP "
        "statistic); that bound falls below the true data-dependent cost with probability parameters.gnss_delta0, "
        "which is part of delta; the data-dependent cost is Papernot et al.'s analysis of the votes",
        ASSUMPTIONS[1]),
    "adadpsyn": ASSUMPTIONS,
    "dp-opt": ("the number of records that write the instruction (n: the keyed-hash holdout excluded) is treated as "
               "public (it sets q = M k / n), as |D_y| is for DP few-shot generation",
               "the instruction is text with no record in it; its candidates' verbatim overlap with the private "
               "records is not checked by the audit (no demonstration to compare)",
               ASSUMPTIONS[1]),
    "dpsgd": ("the trained prompt (or LoRA adapter, or fine-tuned weights) means something only on the model whose "
              "weight sha256 the manifest names; "
              "`dpicl predict` refuses any other model",
              "add/remove neighbours over the DP-SGD training records (every private record); the loss curve "
              "was computed on public examples only",
              ASSUMPTIONS[1]),
}


@dataclass(frozen=True)
class Artifact:
    """What one release publishes, for every method, read from a finished run's public files by `load_artifact`:
    tang's DP demos at one epsilon, PromptPATE's student prompt, a PromptDPSGD trained prompt. The gate, the
    manifest and the registry read only this; what differs between methods is in its fields."""

    method: str  # one of METHODS
    run_id: str
    path: Path  # the public run folder
    name: str  # "demos" (tang) | "student-r<repeat>" | the trained prompt's file stem ("dpsgd-eps8-0")
    epsilon: float
    delta: float
    spends: tuple[dict, ...]  # what the ledger must hold: mechanism, noise_multiplier, sampling_rate, steps, purpose
    seeded_noise: bool
    info: dict  # model, dataset, dataset_id, data_hash, task_spec, parameters (+ dpsgd: weights hash, kind...)
    demos: tuple[tuple[str, str], ...] = ()  # the released text prompt: (text, label) (tang, pate)
    prompt_path: Path | None = None  # PromptDPSGD: the safetensors file
    changed_files: tuple[str, ...] = ()
    # the public audit table; rows are matched by `artifact` when the table has that column (pate, dpsgd)
    audit: pd.DataFrame | None = field(default=None, compare=False)
    samplers: tuple[str, ...] = ()  # the samplers the accountant must cover ("unrecorded": the run did not say)
    ledger_purposes: tuple[str, ...] | None = None  # a covering entry's purposes; None: each spend's own
    crosscheck_agreed: bool | None = None  # as recorded when calibrated (tang); None: recomputed on the spends
    table: pd.DataFrame | None = field(default=None, compare=False)  # the rows of the released demos file
    selector: dict = field(default_factory=dict, compare=False)  # the flags that pick this artifact again
    task_spec: dict | None = None  # the task spec the run was made with (`run_task_spec`), as JSON
    delta_source: str | None = None  # where the run's delta came from (`run_delta_source`); None: not recorded
    assumptions: tuple[str, ...] = ()  # what its guarantee assumes (`METHOD_ASSUMPTIONS`), as its loader states it
    # (q, T) when the records the mechanism read are a Poisson draw whose realised count is private (DP-SGD's
    # batches): the release audit then designs from public bounds on it; None when that count is public
    drawn_records: tuple[float, int] | None = None
    instruction: str | None = None  # DP-OPT: the released instruction (its task spec holds it in front)

    @property
    def dataset_id(self) -> str:
        return str(self.info.get("dataset_id") or self.info.get("dataset") or "")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _changed(path: Path) -> tuple[str, ...]:
    return tuple(verify_manifest(path)) if (path / "manifest.json").exists() else ("manifest.json (missing)",)


def _set(value) -> str | None:
    """A run manifest's config value, None when unset (older manifests wrote "None")."""
    return None if value in (None, "None", "") else str(value)


def run_inputs(path: Path) -> dict:
    """What a run kept of its inputs (`RUN_INPUTS_FILE`); {} for a run made before they were kept."""
    return _json(path / RUN_INPUTS_FILE) if (path / RUN_INPUTS_FILE).exists() else {}


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
    if config and "delta" in config and _set(config.get("delta")) is None:
        return "1/|D|"
    return None


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
        method="tang", run_id=run_id, path=run.path, name="demos", epsilon=chosen,
        delta=math.nan if row.get("delta") is None else float(row["delta"]), spends=({**spend, "purpose": "pipeline"},),
        seeded_noise=bool(rows["seeded_noise"].astype(bool).any()) if len(rows) else False,
        info={"model": str(run.manifest.get("model", "")), "dataset": dataset,
              "dataset_id": _set(config.get("dataset_id")) or dataset,
              "task_spec": _set(config.get("task_spec")) or dataset, "parameters": spend},
        demos=tuple((str(t), str(y)) for t, y in zip(rows["text"], rows["label"], strict=True)) if len(rows) else (),
        changed_files=run.changed_files, audit=run.audit,
        samplers=((tuple(sorted(set(rows["sampler"].astype(str)))) if "sampler" in rows.columns else ("unrecorded",))
                  if len(rows) else ()),
        ledger_purposes=TANG_PURPOSES,
        crosscheck_agreed=bool(len(calib) == 0 or calib["crosscheck_agreed"].astype(bool).all()),
        table=rows, selector={"epsilon": chosen},
        task_spec=run_task_spec(run_id, inputs, _set(config.get("task_spec")) or dataset),
        delta_source=run_delta_source(inputs, config), assumptions=METHOD_ASSUMPTIONS["tang"])


def load_tang_artifact(run_id: str, home: Path, epsilon: float | None = None) -> Artifact:
    """The DP demos of a finished pipeline run at `epsilon` (`tang_artifact` on its public tables)."""
    return tang_artifact(run_id, load_run(run_id, home), epsilon)


def load_pate_artifact(run_id: str, home: Path, repeat: int | None = None) -> Artifact:
    """The student prompt of a PromptPATE run (`repeat`, default the repeat the run chose: best public
    validation accuracy) with the run's plan (`pate_plan.json`): every spend of the plan under purpose `pate`."""
    path = find_run_dir(run_id, home)
    if not (path / PATE_PLAN_FILE).exists():
        if not (path / "manifest.json").exists():
            raise unfinished(run_id, path)
        raise ConfigError(f"run {run_id!r}: {path / PATE_PLAN_FILE} is missing (not a PromptPATE run)")
    plan = _json(path / PATE_PLAN_FILE)
    students = read_table(path / "pate_students.parquet")
    chosen = plan.get("best_repeat") if repeat is None else int(repeat)
    available = sorted({int(r) for r in students["repeat"]}) if len(students) else []
    if repeat is not None and chosen not in available:
        raise ConfigError(f"--repeat {repeat}: run {run_id} has student prompts of repeats {available or 'none'}")
    rows = students[students["repeat"] == chosen].sort_values("position") if chosen is not None else students[:0]
    demos = tuple((str(t), str(y)) for t, y in zip(rows["text"], rows["label"], strict=True))
    audit_path = path / AUDIT_FILES["pate"]
    inputs = run_inputs(path)
    config = (_json(path / "manifest.json") if (path / "manifest.json").exists() else {}).get("config")
    return Artifact(
        method="pate", run_id=run_id, path=path, name=f"student-r{chosen}", epsilon=float(plan["plan"]["epsilon"]),
        delta=float(plan["plan"]["delta"]), spends=tuple(plan["plan"]["spends"]),
        seeded_noise=bool(plan["seeded_noise"]),
        info={k: plan.get(k) for k in ("model", "dataset", "dataset_id", "data_hash", "task_spec")}
        | {"parameters": plan["plan"]["parameters"], "repeat": chosen},
        demos=demos, changed_files=_changed(path), audit=read_table(audit_path) if audit_path.exists() else None,
        table=pd.DataFrame([{"text": t, "label": y} for t, y in demos], columns=["text", "label"]),
        selector={"repeat": chosen},
        task_spec=run_task_spec(run_id, inputs, plan.get("task_spec") or plan.get("dataset")),
        delta_source=run_delta_source(inputs, config),
        assumptions=METHOD_ASSUMPTIONS["pate-data-dependent" if plan["plan"]["parameters"].get("accounting")
                                       == "data-dependent" else "pate"])


def load_dpsgd_artifact(run_id: str, home: Path, epsilon: float | None = None, training: int = 0) -> Artifact:
    """A trained prompt of a PromptDPSGD run: `epsilon` (default the smallest of the run) and `training`; its
    DP-SGD steps (Poisson-sampled, purpose `dpsgd`) are the spend the ledger must hold."""
    path = find_run_dir(run_id, home)
    manifests = {p: _json(p) for p in sorted((path / "prompts").glob("dpsgd-eps*.json"))}
    if not manifests:
        if not (path / "manifest.json").exists():
            raise unfinished(run_id, path)
        raise ConfigError(f"run {run_id!r}: no trained prompt under {path / 'prompts'} (not a PromptDPSGD run)")
    available = sorted({float(m["epsilon"]) for m in manifests.values()})
    chosen = available[0] if epsilon is None else _pick_epsilon(epsilon, available,
                                                                 f"run {run_id} has trained prompts at")
    found = [(p, m) for p, m in manifests.items() if float(m["epsilon"]) == chosen and int(m["training"]) == training]
    if not found:
        trainings = sorted(int(m["training"]) for m in manifests.values() if float(m["epsilon"]) == chosen)
        raise ConfigError(f"--epsilon {fmt_eps(chosen)} --training {training}: run {run_id} has trainings "
                          f"{', '.join(map(str, trainings))} at that epsilon")
    json_path, m = found[0]
    run = _json(path / "manifest.json") if (path / "manifest.json").exists() else {}
    spend = {"mechanism": "gaussian", "noise_multiplier": m["noise_multiplier"], "sampling_rate": m["sampling_rate"],
             "steps": m["steps"], "purpose": m.get("method", "dpsgd")}
    audit_path = path / AUDIT_FILES["dpsgd"]
    return Artifact(
        method="dpsgd", run_id=run_id, path=path, name=json_path.stem, epsilon=chosen, delta=float(m["delta"]),
        spends=(spend,), seeded_noise=bool(m["seeded_noise"]),
        info={"model": m["model"], "dataset": run.get("dataset"),
              "dataset_id": _set(run.get("config", {}).get("dataset_id")) or run.get("dataset"),
              "data_hash": m.get("data_hash"), "task_spec": m.get("task_spec"),
              "model_weights_sha256": m["model_weights_sha256"],
              "parameters": {k: m.get(k) for k in ("kind", "length", "rank", "clip", "batch_size", "lr", "init", "training",
                                                   "noise_multiplier", "sampling_rate", "steps")}},
        prompt_path=json_path.with_suffix(".safetensors"), changed_files=_changed(path),
        audit=read_table(audit_path) if audit_path.exists() else None,
        samplers=("poisson",), selector={"epsilon": chosen, "training": training},
        task_spec=run_task_spec(run_id, run_inputs(path), m.get("task_spec") or run.get("dataset")),
        delta_source=run_delta_source(run_inputs(path), run.get("config")), assumptions=METHOD_ASSUMPTIONS["dpsgd"],
        drawn_records=(float(m["sampling_rate"]), int(m["steps"])))


def _eps_name(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def load_registered_artifact(method: str, run_id: str, home: Path, epsilon: float | None = None) -> Artifact:
    """A registered method's artifact (`METHOD_PLAN_FILES`: AdaDPSyn's demonstrations, DP-OPT's instruction) at
    `epsilon` (default the smallest of the run), with its plan's spends (purpose the method's) as what the
    ledger must hold; the cross-check is recomputed on them."""
    path = find_run_dir(run_id, home)
    plan_path = path / METHOD_PLAN_FILES[method]
    if not plan_path.exists():
        if not (path / "manifest.json").exists():
            raise unfinished(run_id, path)
        raise ConfigError(f"run {run_id!r}: {plan_path} is missing (not a run of {method})")
    sealed = _json(plan_path)
    plans = {float(p["epsilon"]): p for p in sealed["plans"]}
    available = sorted(plans)
    if not available:
        raise ConfigError(f"run {run_id}: {NOTHING_RELEASABLE[method]}")
    chosen = available[0] if epsilon is None else _pick_epsilon(epsilon, available, f"run {run_id} has {method} at")
    plan = plans[chosen]
    artifact_path = path / METHOD_ARTIFACT_FILES[method].format(_eps_name(chosen))
    run = _json(path / "manifest.json") if (path / "manifest.json").exists() else {}
    inputs = run_inputs(path)
    spec = run_task_spec(run_id, inputs, sealed.get("task_spec") or sealed.get("dataset"))
    demos, table, instruction = (), None, None
    if method in INSTRUCTION_METHODS:  # its release is an instruction, not demonstrations
        if artifact_path.exists():
            instruction = str(_json(artifact_path)["instruction"])
            spec = {**spec, "icl": {**spec["icl"], "instruction": instruction.strip()}}  # it leads every prompt
    elif artifact_path.exists():
        table = read_table(artifact_path)
        demos = tuple((str(t), str(y)) for t, y in zip(table["text"], table["label"], strict=True))
    audit_path = path / AUDIT_FILES[method]
    return Artifact(
        method=method, run_id=run_id, path=path, name=f"{method}-eps{_eps_name(chosen)}", epsilon=chosen,
        delta=float(plan["delta"]), spends=tuple(plan["spends"]), seeded_noise=bool(sealed.get("seeded_noise")),
        info={k: sealed.get(k) for k in ("model", "dataset", "dataset_id", "data_hash", "task_spec")}
        | {"parameters": plan["parameters"]},
        demos=demos, changed_files=_changed(path), audit=read_table(audit_path) if audit_path.exists() else None,
        samplers=("poisson",), table=table, selector={"epsilon": chosen}, task_spec=spec,
        delta_source=run_delta_source(inputs, run.get("config")), assumptions=METHOD_ASSUMPTIONS[method],
        instruction=instruction)


def load_artifact(method: str, run_id: str, home: Path, epsilon: float | None = None, training: int = 0,
                  repeat: int | None = None) -> Artifact:
    """What releasing `method` of run `run_id` would publish (public files only)."""
    if method in METHOD_PLAN_FILES:
        return load_registered_artifact(method, run_id, home, epsilon)
    if method == "tang":
        return load_tang_artifact(run_id, home, epsilon)
    if method == "pate":
        if epsilon is not None:
            raise ConfigError("--epsilon: a PromptPATE run has one student prompt per repeat (its epsilon is the "
                              "plan's); use --repeat")
        return load_pate_artifact(run_id, home, repeat)
    if method == "dpsgd":
        return load_dpsgd_artifact(run_id, home, epsilon, training)
    raise ConfigError(f"--method: one of {', '.join(METHODS)}, got {method!r}")


# --------------------------------------------------------------------------- the gate, the manifest


def plan_crosscheck(spends: tuple[dict, ...], delta: float) -> bool:
    """The accountant cross-check (PRV vs PLD, `dpcore.privacy.composition.compose`) on a plan's spends."""
    if not spends or any(s.get("noise_multiplier") is not None and float(s["noise_multiplier"]) <= 0 for s in spends):
        return False
    events = [_spend_event(s) for s in spends]
    return None not in events and bool(composition.compose(events, delta).crosscheck_agreed)


def _spend_event(spend: dict):
    """A plan spend's event: its stored form (plans sealed since events were kept), else its parameters; None
    when it has neither (nothing to check: the gate refuses)."""
    if spend.get("event") is not None:
        return event_from_dict(spend["event"])
    if any(spend.get(k) is None for k in ("mechanism", "noise_multiplier", "sampling_rate", "steps")):
        return None
    return sampled_steps_event(str(spend["mechanism"]), float(spend["noise_multiplier"]),
                               float(spend["sampling_rate"]), int(spend["steps"]))


LEDGER_ENTRY_KEYS = ("id", "run_id", "purpose", "mechanism", "noise_multiplier", "sampling_rate", "steps", "delta",
                     "created_at")


def _recorded(entries: list, run_id: str, spend: dict, delta: float, purposes: tuple[str, ...]) -> list:
    """The entries of `run_id` (of one of `purposes`) holding `spend` (mechanism, sigma, q, T) at `delta`."""
    # dp-accounting loads here, not when the module is imported
    from dpcore.privacy.ledger import entries_holding, matching_entries

    if spend.get("noise_multiplier") is None and spend.get("event") is not None:  # an event of no steps' shape
        return entries_holding(entries, run_id=run_id, event=event_from_dict(spend["event"]), delta=float(delta),
                               purposes=purposes)
    if any(spend.get(k) is None for k in ("mechanism", "noise_multiplier", "sampling_rate", "steps")):
        return []
    try:
        sigma, q = float(spend["noise_multiplier"]), float(spend["sampling_rate"])
        steps, delta = int(spend["steps"]), float(delta)
    except (TypeError, ValueError):
        return []
    if not (math.isfinite(sigma) and sigma > 0 and 0 < q <= 1 and 0 < delta < 1):
        return []
    return matching_entries(entries, run_id=run_id, mechanism=str(spend["mechanism"]), noise_multiplier=sigma,
                            sampling_rate=q, steps=steps, delta=delta, purposes=purposes)


def covering_entries(entries, artifact: Artifact) -> list:
    """For every spend of the artifact, a ledger entry of its run recording it (mechanism, sigma, q, T, delta,
    purpose), in spend order; empty when any spend is unrecorded. Another epsilon of the same run, or the
    same spend under another purpose (an audit, a baseline), does not cover it."""
    entries = list(entries)
    found = []
    for spend in artifact.spends:
        purposes = artifact.ledger_purposes or (str(spend["purpose"]),)
        match = _recorded(entries, artifact.run_id, spend, artifact.delta, purposes)
        if not match:
            return []
        found.append(match[0])
    return found


def audit_rows(artifact: Artifact) -> pd.DataFrame | None:
    """The rows of the artifact's audit table that audit it (a table keyed by `artifact`: that name's rows)."""
    audit = artifact.audit
    if audit is not None and "artifact" in audit.columns:
        return audit[audit["artifact"] == artifact.name]
    return audit


def evidence(artifact: Artifact, entries) -> ReleaseEvidence:
    """The gate's evidence for one artifact: its audit rows, every spend charged to its run (`covering_entries`),
    the cross-check (as calibrated, or recomputed on its spends), its seeded flag and its samplers."""
    ran, passed, reasons = audit_verdict(audit_rows(artifact))
    present = (int(bool(artifact.instruction)) if artifact.method in INSTRUCTION_METHODS
               else len(artifact.demos) if artifact.prompt_path is None else int(artifact.prompt_path.exists()))
    agreed = artifact.crosscheck_agreed
    if agreed is None:
        agreed = math.isfinite(artifact.epsilon) and plan_crosscheck(artifact.spends, artifact.delta)
    return ReleaseEvidence(
        run_id=artifact.run_id, audit_ran=ran, audit_passed=passed, audit_reasons=reasons,
        seeded_noise=artifact.seeded_noise, ledger_entry_present=bool(covering_entries(entries, artifact)),
        crosscheck_agreed=bool(agreed), dp_demos=present, epsilons=(artifact.epsilon,) if present else (),
        samplers=artifact.samplers if present else (), method=artifact.method,
    )


def audit_members(artifact: Artifact, train: pd.DataFrame, read_ids: list[str] | None = None) -> pd.DataFrame:
    """The private records the artifact's mechanism actually read (the audit's members): PromptPATE, the
    teachers' records (from the private teacher assignment); PromptDPSGD, the records some Poisson batch
    drew (from the training's private record). Auditing with every training record would dilute the
    attack: at a CPU preset only 1 - (1 - q)^T of them (about 1%) are ever read, so the AUC would sit near
    0.5 whatever the prompt."""
    if read_ids is None:
        raise ConfigError(f"run {artifact.run_id}: the private record of which records {artifact.name} read is "
                          "missing; the audit needs it (rerun the training)")
    wanted = set(map(str, read_ids))
    return train[train["id"].astype(str).isin(wanted)].reset_index(drop=True)


def teacher_prompts(train: pd.DataFrame, assignment: pd.DataFrame) -> list[pd.DataFrame]:
    """Each PromptPATE teacher's records (id, text, label), in prompt order, from the private assignment."""
    by_id = train.assign(id=train["id"].astype(str)).set_index("id")
    teachers = Teachers.from_table(assignment, int(assignment["teacher"].max()) + 1 if len(assignment) else 0)
    return [by_id.loc[list(ids), ["text", "label"]].reset_index() for ids in teachers.demos if ids]


def release_manifest(artifact: Artifact, *, artifact_file: str, artifact_sha256: str, audit_summary: dict,
                     code_version: str, accountant_versions: dict, version: int, ledger_spend: dict | None,
                     task_spec: dict, ledger_entries: list | None = None) -> dict:
    """The release record (`release.json`) of any method: what was released (the file and its hash, the
    demos when it is a text prompt), its guarantee (epsilon at delta, the spends and the ledger entries
    recording them), public parameters, the audit verdict, the ledger's composed spend of the dataset at
    release (every run, audit and baseline of the dataset id, not only this epsilon) and what the guarantee
    assumes. A single-spend release (tang, dpsgd) also states its mechanism, sigma, q and T at the top level."""
    manifest = {
        "release_version": version, "method": artifact.method, "run_id": artifact.run_id,
        "artifact_name": artifact.name, "dataset": artifact.info.get("dataset"), "dataset_id": artifact.dataset_id,
        "artifact": {"file": artifact_file, "sha256": artifact_sha256},
        "epsilon": artifact.epsilon, "delta": artifact.delta, "spends": [dict(s) for s in artifact.spends],
        "ledger_entries": [{k: getattr(e, k) for k in LEDGER_ENTRY_KEYS} for e in ledger_entries or []],
        "parameters": dict(artifact.info.get("parameters") or {}), "model": artifact.info.get("model"),
        "accountant_versions": accountant_versions, "code_version": code_version, "audit": audit_summary,
        "ledger": ledger_spend, "assumptions": list(artifact.assumptions),
        "task_spec": task_spec,
        "demos": [{"label": y, "text": t} for t, y in artifact.demos],
    }
    # the delta the run used and where it came from, in place of DELTA_ASSUMPTION
    manifest["assumptions"] = [delta_assumption(artifact.delta, artifact.delta_source, artifact.dataset_id)
                               if line == DELTA_ASSUMPTION else line for line in manifest["assumptions"]]
    manifest["delta_source"] = artifact.delta_source
    if artifact_file == DEMOS_FILE:
        manifest["demos_sha256"] = artifact_sha256
    if artifact.instruction is not None:
        manifest["instruction"] = artifact.instruction
    if len(artifact.spends) == 1:
        manifest.update({k: artifact.spends[0].get(k) for k in ("mechanism", "noise_multiplier", "sampling_rate",
                                                                "steps")})
    if "model_weights_sha256" in artifact.info:
        manifest["model_weights_sha256"] = artifact.info["model_weights_sha256"]
    return manifest
