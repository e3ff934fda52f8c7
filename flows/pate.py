"""PromptPATE (Duan et al. Section 4.2) as one Prefect flow, usable alone or as a subflow of the pipeline.

    the run's plan (every check; or the pipeline's) -> ingest (or the pipeline's) -> ledger charge
      -> teachers (private assignment) -> flock scoring, one task per teacher block (tag `gpu`)
      -> vote histograms + Confident-GNMax, R repeats -> a student prompt per repeat (public data only)
      -> evaluation on the test split (tasks.evaluate) beside the baselines -> record (MLflow, artifacts)

The ledger is charged (`tasks.charge.charge_plans`) after every check and before any teacher sees a
query. Right after it, before the teachers stage, each noisy stage (teachers, aggregate) the charge covers is
marked (`tasks.pate.keep_charged`; the pipeline marks them at its own charge, `mark_charged`), so a run
stopped before a stage drew (e.g. during the flock's scoring) runs it once when resumed under its id, and is
charged nothing again. Public files (`$DPICL_HOME/runs/<dataset>/<hash12>/<run-id>/`): `pate_queries`,
`pate_noisy_labels`, `pate_students`, `pate_results`. Private ones (`$DPICL_HOME/private/runs/<same>/`):
`teacher_assignments`, `vote_histograms`, `pate_data_dependent.json`, `pate_predictions`.
The flow composes `tasks/` and holds no algorithm logic.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

from dpcore.config import RunConfig
from dpcore.data.artifacts import write_table
from dpcore.display import fmt_eps
from dpcore.errors import DpiclError
from dpcore.home import configure_environment
from dpcore.lm.config import EvalConfig
from dpcore.pate.privacy import data_independent_epsilon
from dpcore.pate.released_cost import ACCOUNTING, settled_plan
from flows.methods import MethodFlow
from flows.runner import cancelled_on_stop, default_run_id, map_calls, results, running
from tasks import evaluate as evaluate_stage
from tasks import ingest as ingest_stage
from tasks import pate as pate_stage
from tasks.charge import charge_plans, ledger_report, noise_charged
from tasks.common import Ingested, RunPaths, noise_scope, publish
from tasks.release import seal_pate_run
from tasks.run_plans import RunPlan, build_run_plan

FLOW_NAME = "prompt-pate"
METHOD = "pate"


@dataclass(frozen=True)
class _Plan:
    """What PromptPATE will do on the ingested data, every check passed: settings, delta, the charged plans
    (one per repeat) and the queries each repeat labels, the public queries, the smaller epsilons' prefixes."""

    settings: dict
    delta: float
    plans: list
    per_repeat: int
    inputs: dict
    checkpoints: list[dict]


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="PromptPATE (Duan et al.): a private discrete prompt from a flock of teacher prompts.")
@cancelled_on_stop
def pate_flow(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
              ingested: Ingested | None = None, charge: dict | None = None,
              checkpoint_epsilons: list[float] | None = None, plan: RunPlan | None = None) -> dict:
    """Run PromptPATE for one configuration; returns a public summary (the `dpicl pate --json` object).

    `ingested`: the pipeline's `tasks.ingest.ingest` result, so both methods use the same ingested data
    and run folder; None ingests here. `charge`: the summary of a `charge_spends` call that already
    charged `tasks.pate.privacy_plans` with the pipeline's other methods in one transaction (this flow
    then charges nothing itself). `checkpoint_epsilons`: smaller epsilons to report from prefixes of the
    same labelling (`dpcore.pate.privacy.labelling_checkpoints`; a comparison run's `--epsilons`): a
    student and a result row for each, at no charge beyond the run's. `plan`: the run's plan
    (`tasks.run_plans.RunPlan`, PromptPATE's part made), built in this process by the caller (the CLI's
    dry run, the pipeline: its `method_plan("pate")`, a `tasks.pate.PatePlan`); None builds it here.
    """
    configure_environment()
    logger = get_run_logger()
    run_id = run_id or default_run_id()
    if plan is None or plan.method_plan(METHOD) is None:  # every check on the data, before anything is written
        plan = build_run_plan(config, methods=(METHOD,))
    elif not plan.made_from(config):
        raise DpiclError("pate: the plan was made for other records; plan the run again")
    ingested = ingest_stage.ingested_for(plan, run_id, ingested, "pate")
    paths = ingested.paths
    run_plan, plan = plan, _plan(config, ingested, plan, checkpoint_epsilons or [])
    settings, plans, per_repeat = plan.settings, plan.plans, plan.per_repeat
    # The ledger: charged before any teacher sees a query (all plans in one transaction, or refused: exit 3).
    ledger_entry = charge if charge is not None else charge_plans(
        config.ledger_id, ingested.data_hash, run_id, plans, same_records_ok=config.new_budget_for_same_records)
    calls = _noisy_calls(config, ingested, run_plan, checkpoint_epsilons or [], ledger_entry, run_id)
    pate_stage.keep_charged(calls)  # before the teachers: a stop before a stage drew leaves it drawable once
    logger.info("ledger %s: PromptPATE plan charged (%d new, %d replayed): epsilon %.4g at delta %.3g for %d x %d "
                "queries", config.ledger_id, ledger_entry["charged"], ledger_entry["replayed"], plans[0].epsilon,
                plan.delta, settings["repeats"], per_repeat)
    teachers = pate_stage.pate_teachers(**calls["pate-teachers"])
    done = _label_and_learn(config, ingested, plan, teachers, calls["pate-aggregate"], run_id)
    aggregate, students, evaluations = done["aggregate"], done["students"], done["evaluations"]
    plan, plans = done["plan"], done["plan"].plans  # data-dependent accounting: settled, both spends
    _write_tables(paths, teachers, aggregate, students, evaluations, done["zero"], plan.checkpoints)
    rows, n_test = _result_rows(config, plan, aggregate, evaluations, done["zero"], done["test_rows"])
    results_path = write_table(pd.DataFrame(rows, columns=pate_stage.RESULT_COLUMNS),
                               paths.public / "pate_results.parquet")
    seeded = bool(teachers["seeded_noise"] or aggregate["seeded_noise"])
    # the plan and seeded flag `dpicl release --method pate` reads
    seal_pate_run(paths.public, plan=plans[0].to_dict(), run_id=run_id, dataset=config.dataset,
                  dataset_id=config.ledger_id, data_hash=ingested.data_hash, model=config.model,
                  task_spec=ingested.task_spec, seeded_noise=seeded,
                  best_repeat=max(students, key=lambda s: s["validation_accuracy"])["repeat"] if students else None)
    recorded = pate_stage.record_pate(flat_config=config.flat(), results_path=str(results_path),
                                      parameters=dict(plans[0].parameters), info={
                                          "run_id": run_id, "dataset": config.dataset,
                                          "data_hash": ingested.data_hash, "model": config.model,
                                          "seeded_noise": seeded})
    accuracy = _accuracy(evaluations, config.calibrate)
    logger.info("PromptPATE: answered %s of %d queries per repeat; student %s accuracy %s; epsilon %s",
                aggregate["answered"], per_repeat, "calibrated" if config.calibrate else "raw",
                ", ".join(f"{a:.3f}" for a in accuracy["per_repeat"]) or "-", fmt_eps(plans[0].epsilon))
    return {
        "method": "pate",
        "run_id": run_id,
        "dataset": config.dataset,
        "data_hash": ingested.data_hash,
        "epsilon": plans[0].epsilon,
        "epsilon_per_repeat": (None if settings["accounting"] == ACCOUNTING
                               else _per_repeat_epsilon(settings, per_repeat, plan.delta)),
        "accounting": settings["accounting"],
        "epsilon_data_independent": plans[0].parameters["epsilon_data_independent"],
        "released_rdp": plans[0].parameters.get("released_rdp"),
        "gnss_delta0": plans[0].parameters.get("gnss_delta0"),
        "delta": plan.delta,
        "queries": per_repeat,
        "queries_requested": settings["queries"],
        "answered": aggregate["answered"],
        "accuracy": {**accuracy, "calibrated": bool(config.calibrate), "n": n_test},
        "student_prompts": [{"repeat": s["repeat"], "validation_accuracy": s["validation_accuracy"],
                             "demos": s["prompt"]} for s in students],
        "student_prompt": students[int(np.argmax([s["validation_accuracy"] for s in students]))]["prompt"]
        if students else [],
        "baselines": {row["method"]: row["calibrated_accuracy_mean" if config.calibrate else "accuracy_mean"]
                      for row in rows[1:] if row["method"] != "pate"},
        "checkpoints": [{"epsilon": c["epsilon"], "epsilon_data_independent": c["epsilon_data_independent"],
                         "queries": c["queries"],
                         "answered": c["answered"], "accuracy": _accuracy(c["evaluations"], config.calibrate)}
                        for c in plan.checkpoints],
        "parameters": {**settings, "public_source": plan.inputs["source"], "test_size": config.test_size},
        **{k: settings[k] for k in ("preset", "teachers", "shots", "threshold", "sigma1", "sigma2", "vote_mode",
                                    "repeats")},
        "public": plan.inputs["source"],
        "seeded_noise": seeded,
        "run_dir": str(paths.public),
        "private_run_dir": str(paths.private),
        "ledger": ledger_entry,
        "ledger_after": ledger_report(config.ledger_id, run_id),
        **recorded,
    }


def _plan(config: RunConfig, ingested: Ingested, run_plan: RunPlan, checkpoint_epsilons: list[float]) -> _Plan:
    """The run plan's PromptPATE part (settings, plans, public queries: every check made), its public queries
    written to the run folder, and the smaller epsilons' prefixes."""
    pate, delta = run_plan.method_plan(METHOD), run_plan.delta
    inputs = pate_stage.pate_inputs(queries=pate.queries, source=pate.source, settings=pate.settings,
                                    public_dir=str(ingested.paths.public))
    checkpoints = pate_stage.checkpoints(checkpoint_epsilons, pate.settings, pate.per_repeat, delta)
    return _Plan(pate.settings, delta, list(pate.plans), pate.per_repeat, inputs, checkpoints)


def _noisy_calls(config: RunConfig, ingested: Ingested, run_plan: RunPlan, checkpoint_epsilons: list[float],
                 charge: dict, run_id: str) -> dict[str, dict]:
    """The noisy stages' task arguments, by stage: the teachers' in full, the aggregate's but for its votes
    (the flock's, added when they exist); each says whether `charge` (this attempt's) charged PromptPATE."""
    pate, delta = run_plan.method_plan(METHOD), run_plan.delta
    settings = pate.settings
    fresh = noise_charged(charge, "pate", pate.plans[0].epsilon)
    scope = noise_scope(config.seed, run_id)
    private = str(ingested.paths.private)
    prefixes = [c["queries"] for c in pate_stage.checkpoints(checkpoint_epsilons, settings, pate.per_repeat, delta)]
    teachers = dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                    teachers=settings["teachers"], shots=settings["shots"], seed=config.seed, noise_scope=scope,
                    noise_charged=fresh, private_run_dir=private)
    aggregate = dict(data_hash=ingested.data_hash, task_spec=ingested.task_spec,
                     labels=list(ingested.labels), vote_mode=settings["vote_mode"],
                     threshold=settings["threshold"], sigma1=settings["sigma1"], sigma2=settings["sigma2"],
                     repeats=settings["repeats"], queries=pate.per_repeat, delta=delta, model=config.model,
                     device=config.device, dtype=config.dtype, seed=config.seed, noise_scope=scope,
                     noise_charged=fresh, checkpoints=prefixes or None, release=settings.get("gnss"),
                     private_run_dir=private)
    return {"pate-teachers": teachers, "pate-aggregate": aggregate}


def mark_charged(config: RunConfig, ingested: Ingested, plan: RunPlan, charge: dict, run_id: str,
                 checkpoint_epsilons: list[float] | None = None) -> None:
    """Mark the noisy stages `charge` charged (`tasks.pate.keep_charged`): for a caller that charges PromptPATE
    with other methods and runs this flow later (the pipeline), right after its charge; `checkpoint_epsilons`
    as it will pass them to `pate_flow`."""
    pate_stage.keep_charged(_noisy_calls(config, ingested, plan, checkpoint_epsilons or [], charge, run_id))


def _label_and_learn(config: RunConfig, ingested: Ingested, plan: _Plan, teachers: dict, aggregate_call: dict,
                     run_id: str) -> dict:
    """The mapped stages, on the charge already made: the flock's votes on the public queries (and on the
    test split for the non-private baselines), Confident-GNMax's noisy labels, a student per repeat (and per
    smaller epsilon's prefix), their evaluation beside zero-shot's. Fills each checkpoint's `answered`,
    `students` and `evaluations`. Data-dependent accounting: the labelling's released cost is charged
    (`_settle`) before any label or student is made public; `plan` in the result is the plan as settled."""
    settings, labels = plan.settings, list(ingested.labels)
    common = dict(task_spec=ingested.task_spec, labels=labels, model=config.model, device=config.device,
                  dtype=config.dtype)
    blocks = [(first, min(first + config.pate.teacher_block, settings["teachers"]))
              for first in range(0, settings["teachers"], config.pate.teacher_block)]
    test_baselines = sorted(set(config.pate.baselines) & set(pate_stage.NON_PRIVATE_BASELINES))
    eval_common = dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                       task_spec=ingested.task_spec, labels=labels, model=config.model, device=config.device,
                       dtype=config.dtype)
    with running(config.task_runner) as runner:
        flock_calls = [dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                            assignment_path=teachers["assignment_path"], assignment_key=teachers["key"],
                            queries_path=plan.inputs["queries_path"], queries_key=plan.inputs["queries_key"],
                            first=first, last=last, calibrate=settings["vote_mode"] == "calibrated", split=split,
                            test_size=config.test_size if split == "test" else None, **common)
                       for split in (["public"] + (["test"] if test_baselines else [])) for first, last in blocks]
        eval_calls = []
        if "zero-shot" in config.pate.baselines:
            eval_calls.append(dict(method="zero-shot", epsilon=0.0, demo_paths=[], demo_keys=[],
                                   eval_config=EvalConfig(shots=0, seeds=1, test_size=config.test_size,
                                                          calibrate=config.calibrate), **eval_common))
        zero_futures = map_calls(runner, evaluate_stage.evaluate, eval_calls)
        blocks_done = results(map_calls(runner, pate_stage.pate_flock, flock_calls))
        public_blocks = [b for b in blocks_done if b["split"] == "public"]
        aggregate = pate_stage.pate_aggregate(votes_paths=[b["scores_path"] for b in public_blocks],
                                              votes_keys=[b["key"] for b in public_blocks], **aggregate_call)
        if aggregate["released_rdp"] is not None:
            plan = _settle(config, ingested, plan, aggregate["released_rdp"], run_id)
            aggregate = pate_stage.publish_labels(aggregate=aggregate)
        students = _students(runner, config, plan, aggregate, common)
        evaluations = _evaluate_students(runner, config, plan, students, eval_common)
        zero = results(zero_futures)
        test_rows = {}
        if test_baselines:
            test_blocks = [b for b in blocks_done if b["split"] == "test"]
            test_rows = pate_stage.pate_test_baselines(
                records_path=ingested.records_path, scores_paths=[b["scores_path"] for b in test_blocks],
                vote_mode=settings["vote_mode"], test_size=config.test_size, **common)
    return {"aggregate": aggregate, "students": students, "evaluations": evaluations, "zero": zero,
            "test_rows": test_rows, "plan": plan}


def _settle(config: RunConfig, ingested: Ingested, plan: _Plan, released_rdp: float, run_id: str) -> _Plan:
    """Data-dependent accounting: the labelling charged at the released upper bound on its cost
    (`dpcore.pate.released_cost`), refused (nothing published) over the epsilon asked or the dataset's budget."""
    settled = settled_plan(plan.plans[0], released_rdp)
    charge_plans(config.ledger_id, ingested.data_hash, run_id, [settled],
                 same_records_ok=config.new_budget_for_same_records)
    get_run_logger().info("ledger %s: PromptPATE labelling charged at the released upper bound on its data-dependent "
                          "cost: the run's PromptPATE epsilon %.4g at delta %.3g", config.ledger_id, settled.epsilon,
                          plan.delta)
    return dataclasses.replace(plan, plans=[settled, *plan.plans[1:]])


def _students(runner, config: RunConfig, plan: _Plan, aggregate: dict, common: dict) -> list[dict]:
    """A student prompt per repeat with more labelled queries than shots; each checkpoint's students from
    the prefix of the same labelling (one mapped batch over every (checkpoint, repeat))."""
    shots = plan.settings["shots"]
    student_calls = [dict(queries_path=plan.inputs["queries_path"], labels_path=aggregate["labels_path"],
                          labels_key=aggregate["key"], repeat=r, shots=shots,
                          candidates=plan.settings["student_candidates"], calibrate=config.calibrate, **common)
                     for r in range(plan.settings["repeats"]) if aggregate["labelled"][r] > shots]
    students = results(map_calls(runner, pate_stage.pate_student, student_calls))
    prefix_calls = []
    for checkpoint, prefix in zip(plan.checkpoints, aggregate["checkpoints"], strict=True):
        checkpoint.update(answered=prefix["answered"], students=[], evaluations=[])
        prefix_calls += [(checkpoint, {**call, "queries_limit": checkpoint["queries"]}) for call in student_calls
                         if prefix["labelled"][call["repeat"]] > shots]
    for (checkpoint, _), student in zip(prefix_calls, results(map_calls(
            runner, pate_stage.pate_student, [call for _, call in prefix_calls])), strict=True):
        checkpoint["students"].append(student)
    return students


def _evaluate_students(runner, config: RunConfig, plan: _Plan, students: list[dict], eval_common: dict) -> list[dict]:
    """Every student on the test split: the run's (returned) and each checkpoint's (into its `evaluations`)."""
    student_eval = EvalConfig(shots=plan.settings["shots"], seeds=1, test_size=config.test_size,
                              calibrate=config.calibrate)

    def student_call(student: dict, epsilon: float) -> dict:
        return dict(method="pate", epsilon=float(epsilon), demo_paths=[student["student_path"]],
                    demo_keys=[student["key"]], eval_config=student_eval, **eval_common)

    student_calls_eval = [student_call(s, plan.plans[0].epsilon) for s in students]
    prefix_evals = [(checkpoint, student_call(s, checkpoint["epsilon"]))
                    for checkpoint in plan.checkpoints for s in checkpoint["students"]]
    evaluations = results(map_calls(runner, evaluate_stage.evaluate,
                                    student_calls_eval + [call for _, call in prefix_evals]))
    for (checkpoint, _), evaluation in zip(prefix_evals, evaluations[len(student_calls_eval):], strict=True):
        checkpoint["evaluations"].append(evaluation)
    return evaluations[:len(student_calls_eval)]


def _write_tables(paths: RunPaths, teachers: dict, aggregate: dict, students: list[dict], evaluations: list[dict],
                  zero: list[dict], checkpoints: list[dict]) -> None:
    """Private: teacher assignments, vote histograms, the data-dependent analysis, per-item predictions.
    Public: the noisy labels and the students (the run's, and the smaller epsilons')."""
    publish(teachers["assignment_path"], paths.private, "teacher_assignments.parquet")
    publish(aggregate["histograms_path"], paths.private, "vote_histograms.parquet")
    publish(Path(aggregate["histograms_path"]).with_name("data_dependent.json"), paths.private,
            "pate_data_dependent.json")
    publish(aggregate["labels_path"], paths.public, "pate_noisy_labels.parquet")
    if evaluations:
        predictions = pd.concat([pd.read_parquet(e["predictions_path"]) for e in evaluations + zero
                                 + [e for c in checkpoints for e in c["evaluations"]]], ignore_index=True)
        write_table(predictions, paths.private / "pate_predictions.parquet")
    student_table = pd.concat([pd.read_parquet(s["student_path"]).assign(repeat=s["repeat"]) for s in students],
                              ignore_index=True) if students else pd.DataFrame(columns=["repeat", "text", "label"])
    write_table(student_table, paths.public / "pate_students.parquet")
    if checkpoints:  # DP outputs (prefixes of the labelling), public like the run's own students
        write_table(pd.DataFrame([{"epsilon": c["epsilon"], "queries": c["queries"], "repeat": s["repeat"],
                                   "position": i, "text": d["text"], "label": d["label"]}
                                  for c in checkpoints for s in c["students"] for i, d in enumerate(s["prompt"])],
                                 columns=["epsilon", "queries", "repeat", "position", "text", "label"]),
                    paths.public / "pate_students_checkpoints.parquet")


def _result_rows(config: RunConfig, plan: _Plan, aggregate: dict, evaluations: list[dict], zero: list[dict],
                 test_rows: dict) -> tuple[list[dict], int]:
    """(the results table's rows, the test items evaluated): the run's row, the same labelling's prefixes at
    the smaller epsilons asked for, then the baselines."""
    n_test = int(zero[0]["metrics"][0]["n"]) if zero else (int(evaluations[0]["metrics"][0]["n"]) if evaluations
                                                           else int(test_rows.get("n", 0)))
    repeats, delta = plan.settings["repeats"], plan.delta
    rows = []
    for epsilon, done, queries, answered in (
            [(plan.plans[0].epsilon, evaluations, plan.per_repeat, aggregate["answered"])]
            + [(c["epsilon"], c["evaluations"], c["queries"], c["answered"]) for c in plan.checkpoints]):
        rows.append(_row("pate", epsilon, delta, _metric(done, "accuracy"),
                         _metric(done, "calibrated_accuracy"), n_test, repeats, queries,
                         float(np.mean(answered))))
    for z in zero:
        m = z["metrics"][0]
        rows.append(_row("zero-shot", 0.0, delta, [m["accuracy"]], [m["calibrated_accuracy"]], n_test, 1, 0, 0))
    for name in sorted(set(config.pate.baselines) & set(pate_stage.NON_PRIVATE_BASELINES)):
        rows.append(_row(name, math.inf, delta, [test_rows[name]], [test_rows[name]], n_test, 1, 0, 0))
    return rows, n_test


def _metric(evaluations: list[dict], name: str) -> list[float]:
    """One evaluation metric (accuracy, calibrated_accuracy) of each student."""
    return [e["metrics"][0][name] for e in evaluations]


def _accuracy(evaluations: list[dict], calibrated: bool) -> dict:
    values = _metric(evaluations, "calibrated_accuracy" if calibrated else "accuracy")
    return {"mean": float(np.mean(values)) if values else None, "std": float(np.std(values)) if values else None,
            "per_repeat": values}


def _per_repeat_epsilon(settings: dict, queries: int, delta: float) -> float:
    return data_independent_epsilon(settings["sigma1"], settings["sigma2"], queries, delta)


def _row(method, epsilon, delta, raw, calibrated, n, repeats, queries, answered) -> dict:
    return {"method": method, "epsilon": float(epsilon),
            "delta": float(delta), "accuracy_mean": float(np.mean(raw)) if raw else math.nan,
            "accuracy_std": float(np.std(raw)) if raw else math.nan,
            "calibrated_accuracy_mean": float(np.mean(calibrated)) if calibrated else math.nan,
            "calibrated_accuracy_std": float(np.std(calibrated)) if calibrated else math.nan,
            "n": int(n), "repeats": int(repeats), "queries": int(queries), "answered_mean": float(answered)}


def _run_in_pipeline(*, config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan,
                     prepared=None) -> dict:
    """PromptPATE in a run of several methods (`flows.methods.MethodFlow.run`): at the run's smaller epsilons too
    (prefixes of its one labelling, charged once); the zero-shot row, when DP few-shot generation evaluates it on
    the same test items, is not run twice."""
    pate_config = (config.with_updates(pate_baselines=[b for b in config.pate.baselines if b != "zero-shot"])
                   if "tang" in config.methods and "zero-shot" in config.baselines else config)
    return pate_flow(config=pate_config, run_id=run_id, ingested=ingested, charge=charge,
                     checkpoint_epsilons=list(config.epsilons), plan=plan)


def _mark_in_pipeline(config: RunConfig, run_id: str, ingested: Ingested, plan: RunPlan, charge: dict) -> None:
    mark_charged(config, ingested, plan, charge, run_id, list(config.epsilons))


PATE = MethodFlow(run=_run_in_pipeline, mark_charged=_mark_in_pipeline)
