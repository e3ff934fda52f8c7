"""DP few-shot generation (Tang et al. 2024, Algorithm 1) as a Prefect subflow, in the method protocol
(`tasks.methods`, `flows.methods.MethodFlow`), like every other method of a run.

    prepare (before the run's charge, in the pipeline's flow run): partition by label -> the plan's sigmas logged
      and tabled (`calibration`) -> the checks that need the model and the data
    run (on the run's one charge): the subflow `tang_flow`: generate (one task per (method, label, epsilon),
      mapped, tag `gpu`) -> evaluate (every baseline and the DP demos) -> audit (membership inference)

Its plan is the run plan's (`tasks.tang.TangPlan`: the `FewShotPlan` and Algorithm 1's parameters), never made
again; its stages are task runs of its own flow run, under the pipeline's. A stop request ends them and the
subflow Cancelled, and the pipeline with them (`flows.runner.cancelled_on_stop`); the same run resumed under its
id replays the charged noise from the stages' caches and kept states. The flow composes tasks only. Tables go to
the run folders (public: `demos`, `metrics`, `audit`; private: sigma = 0 demos, `predictions`, the real demos'
ids, the generation counters that depend on the records).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger

from dpcore.config import RunConfig
from dpcore.data.artifacts import read_table, write_json_atomic, write_table
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import FewShotPlan
from flows.methods import MethodFlow
from flows.runner import cancelled_on_stop, map_calls, results, running
from tasks import audit as audit_stage
from tasks import calibrate as calibrate_stage
from tasks import evaluate as evaluate_stage
from tasks import generate as generate_stage
from tasks import ingest as ingest_stage
from tasks.charge import checks_after_ingest, noise_charged
from tasks.common import Ingested, noise_scope, publish
from tasks.generate import GenerationItem, Shard
from tasks.run_plans import RunPlan

FLOW_NAME = "dp-fewshot-generation"
METHOD = "tang"


def _concat(paths: list[str]) -> pd.DataFrame:
    frames = [read_table(Path(p)) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _write_generation_stats(shards: list[Shard], path: Path) -> None:
    """The generation counters that depend on the private records (prompt tokens, padding, timings), per
    shard, into the private run folder (a benchmark's or an operator's figures, never published)."""
    rows = []
    for shard in shards:
        if Path(shard.private_stats_path).exists():
            rows.append(json.loads(Path(shard.private_stats_path).read_text()))
    write_json_atomic(path, rows)


@dataclass(frozen=True)
class FewShotRun:
    """DP few-shot generation's part of a run, decided before the charge: the plan (a sigma per epsilon),
    the generation items, the generation parameters."""

    plan: FewShotPlan
    items: list[GenerationItem]
    generation_config: GenerationConfig


def planned_run(config: RunConfig, plan: RunPlan, ingested: Ingested) -> FewShotRun:
    """The run plan's DP few-shot generation part (`tasks.tang.TangPlan`) and its generation items, one per
    (row, label, epsilon), each with its seed from the run seed (a pure function of the plan)."""
    tang = plan.method_plan(METHOD)
    items = generate_stage.generation_plan(list(ingested.labels), tang.fewshot, config.seed)
    return FewShotRun(tang.fewshot, items, tang.generation)


def prepare_stages(config: RunConfig, plan: RunPlan, ingested: Ingested) -> FewShotRun:
    """Stages 2-3 of DP few-shot generation, before the charge: partition by label, the plan's sigmas logged
    and written (`calibration.parquet`), the checks that need the model and the data."""
    ingest_stage.partition(ingested)
    run = planned_run(config, plan, ingested)
    calibrate_stage.record_calibrations(plan=run.plan, generation=run.generation_config,
                                        public_dir=str(ingested.paths.public))
    # --test-size and the longest group prompt against the model's context: checked before any charge
    checks_after_ingest(config, ingested.num_test, list(ingested.labels), run.generation_config)
    return run


def tang_stages(config: RunConfig, run_id: str, ingested: Ingested, run: FewShotRun, plan: RunPlan,
                ledger_entry: dict) -> dict:
    """DP few-shot generation's stages 4-6 (Tang et al. Algorithm 1): generation, evaluation and the audit,
    on the charge already made; tables written to the run folders."""
    fewshot, items, generation_config = run.plan, run.items, run.generation_config
    paths = ingested.paths
    labels = list(ingested.labels)
    scope = noise_scope(config.seed, run_id)
    calls = [generate_stage.generate_call(item, ingested, generation_config, config, scope,
                                          noise_charged(ledger_entry, item.method, item.epsilon)) for item in items]
    generate_stage.keep_charged(calls)  # before any starts: a stop before a stage began leaves it drawable once
    with running(config.task_runner) as runner:
        # 4. generation, one task per (method, label, epsilon), each continuing from the steps it kept
        shards = results(map_calls(runner, generate_stage.generate, calls))
        public_shards = [s.path for s in shards if not s.private]
        private_shards = [s.path for s in shards if s.private]
        demos = _concat(public_shards)
        write_table(demos, paths.public / "demos.parquet")
        if private_shards:
            write_table(_concat(private_shards), paths.private / "sigma_zero_demos.parquet")
        seeded_noise = any(s.seeded_noise for s in shards if s.method != generate_stage.INSTRUCTION_ONLY)
        _write_generation_stats(shards, paths.private / "generation_stats.json")

        # 5-6. evaluation of every method, and the audit, submitted together (they only need the demos)
        eval_calls = [evaluate_stage.evaluate_call(demo_set, ingested, config, labels)
                      for demo_set in evaluate_stage.evaluation_plan(list(config.baselines), shards)]
        eval_futures = map_calls(runner, evaluate_stage.evaluate, eval_calls)
        audit_futures = []
        if plan.audit is not None:  # designed with the plan, from public counts
            if plan.audit.note:
                get_run_logger().warning(plan.audit.note)
            if plan.audit.config is not None:
                charged = all(noise_charged(ledger_entry, p.method, p.epsilon) for p in plan.audit.plans)
                audit_futures = map_calls(runner, audit_stage.audit, [
                    audit_stage.audit_call(config, ingested, fewshot, shards, generation_config, scope,
                                           plan.audit.config, charged=charged)])

        evaluations = results(eval_futures)
        # Per-item predictions (test ids, gold labels, probabilities) are private; metrics are aggregates.
        write_table(_concat([e["predictions_path"] for e in evaluations]), paths.private / "predictions.parquet")
        write_table(_concat([e["metrics_path"] for e in evaluations]), paths.public / "metrics.parquet")
        real = [e["real_demos_path"] for e in evaluations if e.get("real_demos_path")]
        if real:
            write_table(_concat(real), paths.private / "real_demos.parquet")

        audit_summary, audit_reference = None, None
        if audit_futures:
            audit_result = audit_futures[0].result()
            # Every figure of the audit (scores, AUCs, intervals, ROC) is a statistic of private records:
            # the private folder keeps them (the operator's diagnostic); the public side gets the verdict.
            publish(audit_result["mia_scores_path"], paths.private, "mia_scores.parquet")
            publish(audit_result["private_audit_path"], paths.private, "audit.parquet")
            publish(audit_result["audit_path"], paths.public, "audit.parquet")
            if audit_result.get("roc_path"):
                publish(audit_result["roc_path"], paths.private, "roc.png")
            if audit_result.get("reference_path"):
                publish(audit_result["private_reference_path"], paths.private, "audit_reference.parquet")
                publish(audit_result["reference_path"], paths.public, "audit_reference.parquet")
            audit_summary = audit_result.get("summary")
            audit_reference = audit_result.get("reference")

    return {"seeded_noise": seeded_noise, "audit_summary": audit_summary, "audit_reference": audit_reference,
            "generation_workers": sorted({s.worker for s in shards})}


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0, persist_result=False,
      description="DP few-shot generation (Tang et al. Algorithm 1): DP demonstrations, their evaluation beside the "
                  "baselines and the membership audit, on the run's charge.")
@cancelled_on_stop
def tang_flow(config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan) -> dict:
    """DP few-shot generation's stages 4-6 (`tang_stages`) as a subflow of the pipeline, on its `plan`, its
    `ingested` data and its `charge` (the run's one charge, made after `prepare`); a public summary
    (seeded_noise, the audit's public summary and reference, the generation workers)."""
    ingested = ingest_stage.ingested_for(plan, run_id, ingested, METHOD)
    return tang_stages(config, run_id, ingested, planned_run(config, plan, ingested), plan, charge)


def prepare(config: RunConfig, plan: RunPlan, ingested: Ingested) -> FewShotRun:
    """`prepare_stages` in the protocol (`MethodFlow.prepare`): before the charge."""
    return prepare_stages(config, plan, ingested)


def run(*, config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan,
        prepared: FewShotRun | None = None) -> dict:
    """The subflow (`tang_flow`) in the protocol (`MethodFlow.run`), on the run's charge (its stages before the
    charge made here when `prepare` did not run)."""
    if prepared is None:
        prepare_stages(config, plan, ingested)
    return tang_flow(config=config, run_id=run_id, ingested=ingested, charge=charge, plan=plan)


TANG = MethodFlow(run=run, prepare=prepare)
