"""PromptPATE stages (Duan et al. Section 4.2): thin Prefect tasks over `dpcore`.

    pate_inputs (public queries; checks)  ->  [ledger charge: the flow]  ->  pate_teachers (private assignment)
      -> pate_flock (one task per teacher block, tag `gpu`: votes on the public queries, and on the test
         split for the non-private baselines)  ->  pate_aggregate (vote histograms; Confident-GNMax, R repeats)
      -> pate_student (one per repeat: the student prompt chosen on public data)  ->  evaluate (tasks.evaluate)

Private outputs (teacher assignments, votes, vote histograms, the data-dependent analysis) go to
private stage folders; public ones (queries, noisy labels, student prompts) to public ones. Every
task returns paths and public aggregates only. Noise-drawing stages (`pate_teachers`, `pate_aggregate`) are
cached per run (unseeded) or per seed, like generation. Right after the charge, before the teachers stage, the
flow marks each of them that the attempt charged (`keep_charged`: `pate/<stage>.pending` in the run's private
folder, keyed by the stage's public inputs known then, `PENDING_FIELDS`); a stage removes its mark once its
output is written, and its cached result serves retries from then on. A retry whose charge an earlier attempt
made (the run was stopped, e.g. during the flock's scoring) runs a stage once when its mark matches; with
neither its cached result nor a matching mark the stage is refused, seeded or not: never drawn again under a
charge made once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import get_run_logger
from prefect.artifacts import create_table_artifact

from dpcore.data.artifacts import read_table, write_json_atomic, write_table, write_text_atomic
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import ConfigError, DpiclError
from dpcore.flags import flag
from dpcore.home import is_private_path
from dpcore.lm import runtime
from dpcore.pate import gnmax, public_queries
from dpcore.pate.gnmax import check_gnmax_parameters, default_threshold
from dpcore.pate.presets import preset
from dpcore.pate.privacy import labelling_checkpoints, max_queries_within, pate_plan
from dpcore.pate.released_cost import (
    ACCOUNTING,
    ReleaseParameters,
    data_dependent_plan,
    release_parameters,
    released_labelling_rdp,
)
from dpcore.pate.student import select_student, student_candidates
from dpcore.pate.teachers import Teachers, assign_teachers, check_flock_size
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend
from tasks.common import (
    cached_task,
    derive_seed,
    digest,
    language_model,
    report_progress,
    stage_dir,
    stage_key,
    uncached_task,
)
from tasks.ingest import public_test_split

PATE_MODULES = ("dpcore.pate.teachers", "dpcore.pate.gnmax", "dpcore.pate.flock", "dpcore.lm.icl", "dpcore.pate.public_queries",
                "dpcore.pate.student", "dpcore.pate.data_dependent", "dpcore.pate.smooth_sensitivity",
                "dpcore.pate.released_cost", "dpcore.lm.model", "dpcore.data.taskspec")
TEACHERS_KEY = ("data_hash", "teachers", "shots", "seed", "noise_scope")
FLOCK_KEY = ("data_hash", "assignment_key", "queries_key", "task_spec", "labels", "first", "last", "calibrate",
             "split", "test_size", "model", "dtype")
AGGREGATE_KEY = ("data_hash", "votes_keys", "labels", "vote_mode", "threshold", "sigma1", "sigma2", "repeats",
                 "delta", "seed", "noise_scope", "checkpoints", "release")
# What a noisy stage's mark is for (`keep_charged`): its public inputs known at the charge. The aggregate's
# votes (`votes_keys`) come later, from the flock: a deterministic function of the teachers and the queries.
PENDING_FIELDS = {"pate-teachers": TEACHERS_KEY,
                  "pate-aggregate": tuple(f for f in AGGREGATE_KEY if f != "votes_keys") + ("queries",)}
STUDENT_KEY = ("labels_key", "repeat", "task_spec", "labels", "shots", "candidates", "calibrate", "model", "dtype",
               "queries_limit")


# --------------------------------------------------------------------------- inputs and checks (no task)


def pate_settings(config, spec, delta: float) -> dict:
    """The Confident-GNMax parameters of a run: every unset pate_* field from the preset (`pate_preset`, by
    device when auto: `dpcore.pate.presets`), sigma1 then from the task YAML; T defaults to round(0.9 E).
    `queries`: the most each repeat may label (the plan labels what its epsilon affords)."""
    name, values = preset(config.pate.preset, config.device)
    for setting in ("teachers", "queries", "sigma1", "sigma2", "student_candidates"):
        if getattr(config.pate, setting) is not None:
            values[setting] = getattr(config.pate, setting)
    if values["sigma1"] is None:
        values["sigma1"] = spec.pate.sigma1
    teachers = int(values["teachers"])
    threshold = config.pate.threshold if config.pate.threshold is not None else default_threshold(teachers)
    settings = {"preset": name, "teachers": teachers, "shots": config.pate.shots, "threshold": float(threshold),
                "sigma1": float(values["sigma1"]), "sigma2": float(values["sigma2"]),
                "vote_mode": config.pate.vote_mode, "repeats": config.pate.repeats, "public": config.pate.public,
                "queries": int(values["queries"]), "student_candidates": int(values["student_candidates"]),
                "accounting": config.pate.accounting}
    if config.pate.accounting == ACCOUNTING:  # the release's parameters, from public settings alone
        release = release_parameters(settings["sigma2"], gnmax.vote_classes(spec.label_names, config.pate.vote_mode),
                                     delta, config.pate.gnss_order, config.pate.gnss_beta, config.pate.gnss_sigma,
                                     config.pate.gnss_delta0)
        settings["gnss"] = {"order": release.order, "beta": release.beta, "sigma_ss": release.sigma_ss,
                            "delta0": release.delta0}
    return settings


def target_epsilon(config) -> float:
    """The epsilon PromptPATE is planned at: `pate_target_epsilon`, else the largest epsilon of the run's
    `epsilons` (`dpicl run --epsilons`, `dpicl pate --epsilon`). inf: no cap (the plan covers every query asked,
    charged at their data-independent bound); a run that asks only epsilon 0 is refused (no labelling is free)."""
    if config.pate.target_epsilon is not None:
        return float(config.pate.target_epsilon)
    largest = max((float(e) for e in config.epsilons), default=0.0)
    if largest <= 0.0:
        raise ConfigError("epsilon: PromptPATE needs an epsilon > 0 (or inf); zero-shot is the epsilon = 0 "
                          "comparison")
    return largest


def check_inputs(config, data, delta: float) -> tuple[pd.DataFrame, str, dict]:
    """Every PromptPATE check that needs the data, before anything is written or charged: E*k within the
    private records, T in [0, E], sigmas > 0, the public source readable and non-empty (never compared with the
    private records: that would be a free query on them), Q within the public set, --test-size within the test split. Returns (the Q
    queries, where they come from, the settings)."""
    from dpcore.lm.icl import check_test_size

    settings = pate_settings(config, data.spec, delta)
    check_flock_size(settings["teachers"], config.pate.shots, len(data.train))
    check_gnmax_parameters(settings["threshold"], settings["sigma1"], settings["sigma2"], settings["teachers"])
    check_test_size(config.test_size, len(data.test))
    texts, where = public_queries.public_texts(data, config.pate.public, config.pate.public_path,
                                               config.pate.public_column)
    queries = public_queries.select_queries(texts, settings["queries"], where)
    return queries, where, settings


def privacy_plans(config, settings: dict, delta: float) -> tuple[list, int]:
    """(plans, Q per repeat): the Confident-GNMax plan for R repeats of Q queries (`dpcore.pate.privacy`), and
    the non-private baselines' infinite spend when asked. Q is the most each repeat labels within the run's
    epsilon (`target_epsilon`) over the R repeats, at most the settings' queries (labelling stops at the
    budget): the plan's data-independent epsilon never exceeds the epsilon asked. A plan that labels too few
    queries for a student prompt is refused here, before anything is charged."""
    repeats = settings["repeats"]
    per_repeat = settings["queries"]
    target = target_epsilon(config)
    if settings.get("accounting") == ACCOUNTING:  # every query asked; the labelling is settled against the target
        plans = [data_dependent_plan(epsilon_target=target, delta=delta, queries=per_repeat * repeats,
                                     threshold_sigma=settings["sigma1"], vote_sigma=settings["sigma2"],
                                     teachers=settings["teachers"], threshold=settings["threshold"],
                                     release=ReleaseParameters(**settings["gnss"]))]
        return plans + _baseline_plans(config, delta), per_repeat
    if math.isfinite(target):
        per_repeat = max_queries_within(target, delta, settings["sigma1"], settings["sigma2"],
                                        limit=per_repeat * repeats) // repeats
    if per_repeat <= settings["shots"]:  # refused before the charge: such a labelling can make no student
        within = f" within epsilon {target:g} (delta {delta:.3g})" if math.isfinite(target) else ""
        raise ConfigError(
            f"{flag('pate_queries')}: the plan labels at most {per_repeat} public "
            f"quer{'y' if per_repeat == 1 else 'ies'} per repeat{within}, but a student prompt needs more than "
            f"{settings['shots']} (its demonstrations and at least one to choose them on); raise the epsilon or "
            f"{flag('pate_queries')}, use fewer {flag('pate_repeats')}, or larger {flag('pate_sigma1')} / "
            f"{flag('pate_sigma2')} (now {settings['sigma1']:g} / {settings['sigma2']:g})")
    plans = [pate_plan(epsilon_target=None, delta=delta, queries=per_repeat * repeats,
                       threshold_sigma=settings["sigma1"], vote_sigma=settings["sigma2"],
                       teachers=settings["teachers"], threshold=settings["threshold"])]
    return plans + _baseline_plans(config, delta), per_repeat


def _baseline_plans(config, delta: float) -> list[PrivacyPlan]:
    """The non-private baselines' infinite spend, when asked."""
    if not set(config.pate.baselines) & set(NON_PRIVATE_BASELINES):
        return []
    return [PrivacyPlan(method="pate", epsilon=math.inf, delta=delta, spends=(Spend.sampled_steps(
        "gaussian", 0.0, 1.0, 1, "baseline", "PromptPATE non-private baselines: teacher prompts on the test "
        "split (ensemble, best single teacher)"),), parameters={"baselines": sorted(config.pate.baselines)})]


NON_PRIVATE_BASELINES = ("ensemble", "upper-bound")


@dataclass(frozen=True)
class PatePlan:
    """PromptPATE's part of a run's plan, decided on the data (`method_plan`: `check_inputs`, `privacy_plans`):
    its Confident-GNMax settings, its plans (one per repeat set, and the non-private baselines' when asked), the
    queries each repeat labels, and the public queries (public text) with where they come from."""

    settings: dict
    plans: tuple[PrivacyPlan, ...]
    per_repeat: int
    queries: pd.DataFrame = field(repr=False, compare=False)
    source: str = ""

    def privacy_plans(self) -> tuple[PrivacyPlan, ...]:
        """What the run charges for it (`tasks.methods` protocol), the labelling's plan first."""
        return self.plans


def method_plan(config, data, delta: float) -> PatePlan:
    """Its plan on the run's data (`tasks.methods` protocol), after every check on the data (a classification
    task; `check_inputs`: flock size, GNMax parameters, test size, the public queries; `privacy_plans`: a
    labelling that can make a student)."""
    if data.spec.kind != "classification":
        raise ConfigError(f"pate: PromptPATE votes on labels; task {data.spec.name!r} is not a classification task")
    queries, where, settings = check_inputs(config, data, delta)
    plans, per_repeat = privacy_plans(config, settings, delta)
    return PatePlan(settings, tuple(plans), per_repeat, queries.head(per_repeat), where)


def work(config, plan: PatePlan, *, labels: int, record_tokens: int, test_items: int) -> runtime.Work:
    """Its model work from public sizes (`tasks.methods` protocol; `dpcore.lm.runtime.pate_positions`): every
    teacher's votes on the public queries, the candidate students', every repeat's student on the test items."""
    s = plan.settings
    return runtime.Work(pate=runtime.pate_positions(
        int(s["teachers"]), plan.per_repeat, int(s.get("repeats", 1)), int(s["student_candidates"]), test_items,
        labels, record_tokens))


def audited_in_run(summary: dict) -> list[tuple[float, float | None]]:
    """The run's membership audit checks its chosen student, its one artifact (`tasks.methods` protocol)."""
    return [(summary["epsilon"], None)] if summary.get("student_prompt") else []


def checkpoints(epsilons: list[float], settings: dict, per_repeat: int, delta: float) -> list[dict]:
    """The smaller epsilons a run reports from prefixes of its labelling
    (`dpcore.pate.privacy.labelling_checkpoints`): epsilon, Q_i per repeat, its data-independent epsilon."""
    if settings.get("accounting") == ACCOUNTING:  # a prefix's cost is data-dependent too: no free smaller epsilons
        return []
    return [{"epsilon": eps, "queries": prefix, "epsilon_data_independent": bound}
            for eps, prefix, bound in labelling_checkpoints(epsilons, delta, settings["sigma1"], settings["sigma2"],
                                                           repeats=settings["repeats"], queries=per_repeat)]


# --------------------------------------------------------------------------- tasks


@uncached_task("pate-inputs")
def pate_inputs(*, queries: pd.DataFrame, source: str, settings: dict, public_dir: str) -> dict:
    """The run plan's public queries (checked when it was made: what the plan covers) written to the public
    run folder, and the run's Confident-GNMax settings."""
    path = write_table(queries, Path(public_dir) / "pate_queries.parquet")
    get_run_logger().info("PromptPATE: %d public queries from %s; E=%d, k=%d, T=%g, sigma1=%g, sigma2=%g",
                          len(queries), source, settings["teachers"], settings["shots"], settings["threshold"],
                          settings["sigma1"], settings["sigma2"])
    return {"queries_path": str(path), "queries_key": stage_key("pate-queries", {"where": source,
            "texts": queries["text"].tolist()}), "source": source, "settings": settings}


@cached_task("pate-teachers", TEACHERS_KEY, PATE_MODULES, private_outputs=True)
def pate_teachers(*, records_path: str, data_hash: str, teachers: int, shots: int, seed: int | None,
                  noise_scope: str, noise_charged: bool, private_run_dir: str | None = None) -> dict:
    """E disjoint k-shot teachers (`dpcore.pate.teachers`); the assignment table is private. `noise_charged`,
    `private_run_dir` (not in the cache key): see `_refuse_redraw`."""
    from dpcore.fewshot.mechanisms import noise_generator

    _refuse_redraw("pate-teachers", locals())
    key = stage_key("pate-teachers", {k: v for k, v in locals().items() if k in TEACHERS_KEY}, PATE_MODULES)
    records = read_table(Path(records_path))
    train_ids = records.loc[records["split"] == "train", "id"].astype(str).tolist()
    rng, seeded = noise_generator(derive_seed(seed, "pate-teachers"))
    flock = assign_teachers(train_ids, teachers, shots, rng)
    path = write_table(flock.table(), stage_dir("pate-teachers", key, private=True) / "teacher_assignments.parquet")
    _drawn("pate-teachers", private_run_dir)
    return {"key": key, "assignment_path": str(path), "seeded_noise": seeded}


@cached_task("pate-flock", FLOCK_KEY, PATE_MODULES, private_outputs=True, tags=["gpu"],
             task_run_name="pate-flock-{split}-{first}-{last}")
def pate_flock(*, records_path: str, data_hash: str, assignment_path: str, assignment_key: str, queries_path: str,
               queries_key: str, task_spec: str, labels: list[str], first: int, last: int, calibrate: bool,
               split: str = "public", test_size: int | None = None, model: str, device: str = "auto",
               dtype: str = "auto") -> dict:
    """Teachers [first, last) score every query (`dpcore.pate.flock`): split "public" the public queries, "test"
    the evaluation items (non-private baselines). Writes the block's label scores, private."""
    from dpcore.lm.icl import select_test
    from dpcore.pate import flock

    key = stage_key("pate-flock", {k: v for k, v in locals().items() if k in FLOCK_KEY}, PATE_MODULES)
    spec = load_task_spec(task_spec)
    records = read_table(Path(records_path))
    train = records[records["split"] == "train"].set_index("id")
    assignment = read_table(Path(assignment_path))
    table = assignment[(assignment["teacher"] >= first) & (assignment["teacher"] < last)]
    members = Teachers.from_table(table.assign(teacher=table["teacher"] - first), last - first)
    prompts = [[(train.at[rid, "text"], train.at[rid, "label"]) for rid in ids] for ids in members.demos]
    if split == "public":
        queries = read_table(Path(queries_path))["text"].tolist()
    else:
        queries = select_test(public_test_split(records_path), test_size)["text"].tolist()
    lm = language_model(model, device, dtype)
    what = f"PromptPATE flock {split}: teachers {first}-{last - 1}"
    scores = flock.flock_scores(lm, spec, prompts, queries, labels, calibrate=calibrate,
                                progress=lambda done, total: report_progress(what, done, total))
    out = stage_dir("pate-flock", key, private=True)
    np.savez(out / "flock_scores.npz", logprobs=scores.logprobs, content_free=scores.content_free,
             greedy=scores.greedy)
    return {"key": key, "scores_path": str(out / "flock_scores.npz"), "first": first, "last": last,
            "split": split, "scorings": (last - first) * len(queries)}


def load_votes(block_paths: list[str], lm, spec, labels: list[str], mode: str) -> np.ndarray:
    """[E, Q] votes of every teacher from the flock blocks (in teacher order)."""
    from dpcore.pate.flock import FlockScores, votes

    parts = []
    for path in block_paths:
        with np.load(path) as npz:
            scores = FlockScores(npz["logprobs"], npz["content_free"], npz["greedy"])
        parts.append(votes(lm, spec, scores, labels, mode))
    return np.concatenate(parts, axis=0)


@cached_task("pate-aggregate", AGGREGATE_KEY, PATE_MODULES, private_outputs=True)
def pate_aggregate(*, data_hash: str, votes_paths: list[str], votes_keys: list[str], task_spec: str,
                   labels: list[str], vote_mode: str, threshold: float, sigma1: float, sigma2: float, repeats: int,
                   queries: int, delta: float, model: str, device: str = "auto", dtype: str = "auto",
                   seed: int | None, noise_scope: str, noise_charged: bool, checkpoints: list[int] | None = None,
                   release: dict | None = None, private_run_dir: str | None = None) -> dict:
    """Vote histograms (private) and R independent Confident-GNMax labellings of the first Q queries (public).
    Each repeat's data-dependent epsilon (Papernot et al. 2018) is a non-DP function of the vote histograms:
    it is written to the private store only, never returned (a task's result is public).
    `checkpoints`: query counts Q_i < Q per repeat whose prefixes are reported too
    (`dpcore.pate.privacy.labelling_checkpoints`): their answered and labelled counts (DP outputs).
    `release` (data-dependent accounting: the GNSS order, beta, sigma_ss, delta0): the labels stay in the
    private store until the flow has charged their cost, and the released upper bound on the labelling's
    data-dependent RDP (`released_rdp`, a DP output, `dpcore.pate.released_cost`) is returned.
    `noise_charged`, `private_run_dir` (not in the cache key): see `_refuse_redraw`."""
    from dpcore.fewshot.mechanisms import noise_generator
    from dpcore.pate.data_dependent import data_dependent_epsilon, epsilon_from_rdp

    _refuse_redraw("pate-aggregate", locals())
    key = stage_key("pate-aggregate", {k: v for k, v in locals().items() if k in AGGREGATE_KEY}, PATE_MODULES)
    spec = load_task_spec(task_spec)
    votes = load_votes(votes_paths, language_model(model, device, dtype), spec, labels, vote_mode)[:, :queries]
    classes = gnmax.vote_classes(labels, vote_mode)
    histograms = gnmax.vote_histograms(votes, classes)
    rng, seeded = noise_generator(derive_seed(seed, "pate-gnmax"))
    names = list(labels) + ["other"]
    prefixes = sorted({int(c) for c in checkpoints or ()})
    rows, reports, total_rdp = [], [], None
    prefix_rdp: dict[int, np.ndarray] = {}
    for repeat in range(repeats):
        answers = gnmax.confident_gnmax(histograms, threshold, sigma1, sigma2, rng)
        report = data_dependent_epsilon(histograms, threshold, sigma1, sigma2, delta, answered=answers >= 0)
        reports.append({"repeat": repeat, "epsilon_data_dependent": report.epsilon, "order": report.order})
        total_rdp = report.rdp if total_rdp is None else total_rdp + report.rdp  # RDP adds up over repeats
        for prefix in prefixes:  # the first Q_i answers are a run of Q_i queries of their own
            part = data_dependent_epsilon(histograms[:prefix], threshold, sigma1, sigma2, delta,
                                          answered=answers[:prefix] >= 0)
            prefix_rdp[prefix] = prefix_rdp.get(prefix, 0.0) + part.rdp
        usable = (answers >= 0) & (answers < len(labels))  # "other" (black-box) gives no label
        rows.append(pd.DataFrame({"repeat": repeat, "query_index": np.arange(len(answers)),
                                  "answered": answers >= 0, "labelled": usable,
                                  "noisy_label": [names[a] if a >= 0 else "" for a in answers]}))
        report_progress("PromptPATE Confident-GNMax repeats", repeat + 1, repeats)
    private = stage_dir("pate-aggregate", key, private=True)
    hist = pd.DataFrame(histograms, columns=[f"votes_{n}" for n in names[:classes]])
    hist.insert(0, "query_index", np.arange(len(hist)))
    hist_path = write_table(hist, private / "vote_histograms.parquet")
    epsilon_all = epsilon_from_rdp(report.orders, total_rdp, delta)[0]
    write_json_atomic(private / "data_dependent.json", {
        "note": "PRIVATE: a non-DP function of the vote histograms (Papernot et al. 2018); never published raw",
        "repeats": reports, "epsilon_data_dependent": epsilon_all,
        "checkpoints": [{"queries": prefix, "epsilon_data_dependent": epsilon_from_rdp(
            report.orders, prefix_rdp[prefix], delta)[0]} for prefix in prefixes]})
    released = None
    if release is not None:  # the labels are published only once their released cost is charged
        gnss_rng, _ = noise_generator(derive_seed(seed, "pate-gnss"))
        released = released_labelling_rdp(histograms, [frame["answered"].to_numpy() for frame in rows],
                                          teachers=len(votes), threshold=threshold, sigma1=sigma1, sigma2=sigma2,
                                          delta=delta, release=ReleaseParameters(**release), rng=gnss_rng)
    labels_path = write_table(pd.concat(rows, ignore_index=True), stage_dir(
        "pate-aggregate", key, private=release is not None) / "pate_noisy_labels.parquet")
    _drawn("pate-aggregate", private_run_dir)
    if release is not None:  # the labelling's outcome stays private until its cost is charged (`publish_labels`)
        return {"key": key, "labels_path": str(labels_path), "histograms_path": str(hist_path), "answered": None,
                "labelled": None, "seeded_noise": seeded, "checkpoints": [], "released_rdp": released}
    answered, labelled = _counts(rows)
    prefix_reports = [{"queries": prefix, "answered": [int(f["answered"].iloc[:prefix].sum()) for f in rows],
                       "labelled": [int(f["labelled"].iloc[:prefix].sum()) for f in rows]} for prefix in prefixes]
    get_run_logger().info("PromptPATE: %d queries, answered per repeat %s (of %d)", queries, answered, queries)
    return {"key": key, "labels_path": str(labels_path), "histograms_path": str(hist_path),
            "answered": answered, "labelled": labelled, "seeded_noise": seeded, "checkpoints": prefix_reports,
            "released_rdp": None}


@uncached_task("pate-publish-labels")
def publish_labels(*, aggregate: dict) -> dict:
    """Data-dependent accounting, once the labelling's released cost is charged: its noisy labels copied from
    the private store to a public stage folder, and the aggregate with their public path and counts."""
    labels = read_table(Path(aggregate["labels_path"]))
    path = write_table(labels, stage_dir("pate-aggregate", aggregate["key"]) / "pate_noisy_labels.parquet")
    frames = [frame for _, frame in labels.groupby("repeat", sort=True)]
    answered, labelled = _counts(frames)
    get_run_logger().info("PromptPATE: %d queries, answered per repeat %s (labelling charged at the released "
                          "upper bound on its cost)", len(frames[0]) if frames else 0, answered)
    return {**aggregate, "labels_path": str(path), "answered": answered, "labelled": labelled}


def _counts(frames: list[pd.DataFrame]) -> tuple[list[int], list[int]]:
    """(answered, labelled) per repeat of a labelling's tables (DP outputs once its cost is charged)."""
    return ([int(frame["answered"].sum()) for frame in frames], [int(frame["labelled"].sum()) for frame in frames])


@cached_task("pate-student", STUDENT_KEY, PATE_MODULES, tags=["gpu"], task_run_name="pate-student-{repeat}")
def pate_student(*, queries_path: str, labels_path: str, labels_key: str, repeat: int, task_spec: str,
                 labels: list[str], shots: int, candidates: int, calibrate: bool, model: str, device: str = "auto",
                 dtype: str = "auto", queries_limit: int | None = None) -> dict:
    """The student prompt of one repeat: candidates of k answered queries, each labelling the other answered
    queries; the best on these public validation labels wins (`dpcore.pate.student`). Public throughout.
    `queries_limit`: only the first Q_i queries of the labelling (a smaller epsilon's prefix)."""
    from dpcore.pate import flock

    key = stage_key("pate-student", {k: v for k, v in locals().items() if k in STUDENT_KEY}, PATE_MODULES)
    spec = load_task_spec(task_spec)
    queries = read_table(Path(queries_path))
    noisy = read_table(Path(labels_path))
    noisy = noisy[(noisy["repeat"] == repeat) & noisy["labelled"]]
    if queries_limit is not None:
        noisy = noisy[noisy["query_index"] < int(queries_limit)]
    noisy = noisy.merge(queries, on="query_index")
    texts, names = noisy["text"].tolist(), noisy["noisy_label"].tolist()
    groups = student_candidates(len(texts), shots, candidates, np.random.default_rng(repeat))
    prompts = [[(texts[i], names[i]) for i in group] for group in groups]
    lm = language_model(model, device, dtype)
    what = f"PromptPATE student {repeat}: candidates on the validation queries"
    scores = flock.flock_scores(lm, spec, prompts, texts, labels, calibrate=calibrate,
                                progress=lambda done, total: report_progress(what, done, total))
    predicted = flock.votes(lm, spec, scores, labels, "calibrated")
    label_index = np.asarray([labels.index(n) for n in names])
    choice = select_student(predicted, label_index, groups)
    student = pd.DataFrame({"position": range(len(choice.members)),
                            "query_index": [int(noisy["query_index"].iloc[i]) for i in choice.members],
                            "text": [texts[i] for i in choice.members], "label": [names[i] for i in choice.members]})
    path = write_table(student, stage_dir("pate-student", key) / "pate_student.parquet")
    return {"key": key, "student_path": str(path), "repeat": repeat, "candidates": len(groups),
            "validation_accuracy": choice.validation_accuracy, "validation_queries": len(texts) - shots,
            "prompt": [{"text": t, "label": lab} for t, lab in zip(student["text"], student["label"], strict=True)]}


@uncached_task("pate-baselines")
def pate_test_baselines(*, records_path: str, scores_paths: list[str], task_spec: str, labels: list[str],
                        vote_mode: str, test_size: int | None, model: str, device: str = "auto",
                        dtype: str = "auto") -> dict:
    """The non-private rows of Duan et al. Table 2 from the teachers' votes on the test split: the flock's
    plurality vote (ensemble) and the best single teacher (upper bound). Aggregates only."""
    from dpcore.lm.icl import select_test
    from dpcore.pate.flock import ensemble_accuracy, single_prompt_accuracies

    spec = load_task_spec(task_spec)
    votes = load_votes(scores_paths, language_model(model, device, dtype), spec, labels, vote_mode)
    gold = select_test(public_test_split(records_path), test_size)["label"].tolist()
    gold_index = np.asarray([labels.index(g) for g in gold])
    return {"ensemble": ensemble_accuracy(votes, gold_index, len(labels) + 1),
            "upper-bound": float(single_prompt_accuracies(votes, gold_index).max()), "n": len(gold)}


def _pending_path(private_run_dir: str, stage: str) -> Path:
    """`pate/<stage>.pending` in the run's private folder: a charged noisy stage that has not drawn yet."""
    path = Path(private_run_dir) / "pate" / f"{stage}.pending"
    if not is_private_path(path):
        raise PermissionError(f"{path.name}: a stage's mark belongs in the private store")
    return path


def _pending_fields(stage: str, call: dict) -> str:
    return digest({name: call.get(name) for name in PENDING_FIELDS[stage]})


def keep_charged(calls: dict[str, dict]) -> None:
    """Mark each noisy stage of `calls` (stage name -> its task's arguments; the aggregate's without its votes)
    whose spend this attempt charged (`noise_charged`): an attempt stopped before the stage drew leaves it
    drawable once by a retry. Called right after the charge, before the teachers stage."""
    for stage, call in calls.items():
        if call.get("noise_charged") and call.get("private_run_dir"):
            write_text_atomic(_pending_path(call["private_run_dir"], stage),
                              json.dumps({"fields": _pending_fields(stage, call)}) + "\n")


def _drawn(stage: str, private_run_dir: str | None) -> None:
    """The stage's output is written: its cached result serves a retry from now on, not its mark."""
    if private_run_dir:
        _pending_path(private_run_dir, stage).unlink(missing_ok=True)


def _refuse_redraw(stage: str, call: dict) -> None:
    """A noisy stage runs only under a charge: this attempt's (`noise_charged`), or the earlier attempt's that
    marked it and was stopped before it drew (its mark in `private_run_dir` matches); else it is refused."""
    if call["noise_charged"]:
        return
    if call.get("private_run_dir"):
        path = _pending_path(call["private_run_dir"], stage)
        if path.exists() and json.loads(path.read_text()).get("fields") == _pending_fields(stage, call):
            return
    # seeded or not: the charge covers one draw
    raise DpiclError(f"stage {stage} ({call['noise_scope']}): the cached noise draw of this run is missing; drawing "
                     "fresh noise (or a seeded draw for another configuration) would spend privacy the ledger charged "
                     "only once. Start a new run (a new --run-id): it is charged afresh.")


RESULT_COLUMNS = ["method", "epsilon", "delta", "accuracy_mean", "accuracy_std",
                  "calibrated_accuracy_mean", "calibrated_accuracy_std", "n", "repeats", "queries", "answered_mean"]


@uncached_task("pate-record")
def record_pate(*, flat_config: dict[str, str], info: dict, results_path: str, parameters: dict) -> dict:
    """MLflow (tasks.record's store and experiment): a parent run for the PromptPATE run and a nested run per
    result row (the charged epsilon, answered count, accuracy); a Prefect table
    artifact. Everything logged is public (configuration, DP outputs, aggregates)."""
    from tasks.tracking import experiment_id, log_batch, mlflow_client, tracking_uri

    if is_private_path(Path(results_path)):
        raise PermissionError("record: the PromptPATE results table may not come from the private store")
    table = read_table(Path(results_path))
    client = mlflow_client()
    exp = experiment_id(client, info["dataset"])
    tags = {"data_hash": info["data_hash"], "model": info["model"], "dataset": info["dataset"], "method": "pate",
            "dpicl_run_id": info["run_id"], "seeded_noise": str(bool(info["seeded_noise"])).lower()}
    parent = client.create_run(exp, run_name=f"{info['run_id']}-pate", tags=tags)
    parent_id = parent.info.run_id
    try:
        log_batch(client, parent_id, params={**flat_config, **{f"pate_plan_{k}": v for k, v in parameters.items()}})
        for row in table.to_dict(orient="records"):
            child = client.create_run(exp, run_name=f"pate-{row['method']}",
                                      tags={**tags, "mlflow.parentRunId": parent_id, "row": row["method"]})
            log_batch(client, child.info.run_id, metrics={k: row[k] for k in RESULT_COLUMNS if k != "method"})
            client.set_terminated(child.info.run_id)
        client.log_artifact(parent_id, results_path)
        client.set_terminated(parent_id)
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise
    rows = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
            for row in table.to_dict(orient="records")]
    create_table_artifact(table=rows, key="prompt-pate-results",
                          description=f"PromptPATE accuracy and privacy, run {info['run_id']}")
    return {"mlflow_run_id": parent_id, "mlflow_experiment_id": exp, "tracking_uri": tracking_uri()}
