"""The private-prompting pipeline as one Prefect flow: DP few-shot generation (Tang et al.), and
PromptPATE and PromptDPSGD (Duan et al.) when `config.methods` names them, on the same ingested
data, test split and ledger.

    the run's plan (`tasks.run_plans.RunPlan`, the caller's or built here: the data read once, delta, sigma
      per epsilon, every method's plans, the audit's design) -> ingest (the plan's records) -> partition by
      label -> calibrate (the planned sigmas logged and tabled)
      -> ONE ledger charge for every method's spends (all or nothing)
      -> generate (one task per (method, label, epsilon), mapped, tag `gpu`)
      -> evaluate (every baseline and the DP demos) -> audit (membership inference)
      -> PromptPATE subflow (`flows.pate`) -> PromptDPSGD subflow (`flows.tune`) (their charged stages
         marked right after the charge: a run stopped before they began runs them once when resumed)
      -> every registered method's subflow (`tasks.methods`, resolved by `flows.methods.subflow`: AdaDPSyn,
         DP-OPT), in the run's order, on the same charge
      -> record (MLflow, Prefect artifacts, manifests) -> the comparison table

The flow composes `tasks/` (thin wrappers over `dpcore`) and holds no algorithm logic.
Its parameter is one `RunConfig` (and, in process only, the `RunPlan` made from it); `config.task_runner` picks where the mapped stages run:
`threads` (default, a ThreadPoolTaskRunner), `dask` (a local `distributed` cluster through
prefect-dask; `dask:N` for N worker processes) or a Dask scheduler address
(`tcp://host:8786`).

A run writes `$DPICL_HOME/runs/<dataset>/<data-hash12>/<run-id>/` (public: DP demos, aggregate
tables, plots, configuration, `manifest.json`) and `$DPICL_HOME/private/runs/<same>/` (records,
partitions, sigma = 0 demos, the random-real baseline's demo ids, and every per-record table
computed from private data: `predictions`, `mia_scores`, the ROC with the non-private reference,
and the generation counters that depend on the records in `generation_stats.json`; see the
docs/privacy.md). The run id defaults to `<UTC start>-<flow run id prefix>`, so a
retry of the same flow run reuses its folder and its cached noise draws.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger
from prefect.context import FlowRunContext

from dpcore.config import GenerationConfig, RunConfig
from dpcore.data.artifacts import read_table, write_json_atomic, write_table
from dpcore.display import fmt_delta, fmt_eps
from dpcore.errors import DpiclError, RunStopped
from dpcore.fewshot.plan import FewShotPlan
from dpcore.home import configure_environment
from dpcore.public_outputs import Kind, declare_line
from dpcore.report.summary import private_data_verdict
from flows import pate as pate_subflow
from flows import tune as dpsgd_subflow
from flows.methods import subflow as method_subflow
from flows.pate import pate_flow
from flows.runner import cancelled_on_stop, default_run_id, map_calls, results, running
from flows.tune import dpsgd_flow
from tasks import audit as audit_stage
from tasks import calibrate as calibrate_stage
from tasks import evaluate as evaluate_stage
from tasks import generate as generate_stage
from tasks import ingest as ingest_stage
from tasks import record as record_stage
from tasks import release as release_stage
from tasks import tracking
from tasks.charge import (
    charge_spends,
    checks_after_ingest,
    ledger_report,
    noise_charged,
    non_private_warning,
    planned_cost,
)
from tasks.common import RunPaths, noise_scope, publish
from tasks.generate import GenerationItem, Shard
from tasks.run_plans import RunPlan, build_run_plan
from tasks.tune import check_model

FLOW_NAME = "dp-fewshot"


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


# --------------------------------------------------------------------------- the flow


@dataclass(frozen=True)
class _FewShotRun:
    """DP few-shot generation's part of a run, decided before the charge: the plan (a sigma per epsilon),
    the generation items, the generation parameters."""

    plan: FewShotPlan
    items: list[GenerationItem]
    generation_config: GenerationConfig


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="Private prompting on one dataset: tang (DP few-shot demonstrations, Tang et al. Algorithm 1), "
                  "pate, dpsgd: charge, generate or train, evaluate, audit, record.")
@cancelled_on_stop
def private_prompting_pipeline(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
                               plan: RunPlan | None = None) -> dict:
    """Run the whole pipeline for one configuration; returns a small public summary.

    `plan`: the run's plan (`tasks.run_plans.build_run_plan(config)`) when the caller built it in this
    process (the CLI, after its dry run); None (a deployment, a scheduled regeneration) builds it here."""
    configure_environment()  # a worker-started run: HF, MLflow and XDG state under $DPICL_HOME, telemetry off
    logger = get_run_logger()
    run_id = run_id or default_run_id()
    ctx = FlowRunContext.get()
    flow_run_id = str(ctx.flow_run.id) if ctx and ctx.flow_run else ""
    logger.info("run %s: dataset %s, model %s, epsilons %s, task runner %s", run_id, config.dataset, config.model,
                ", ".join(fmt_eps(e) for e in config.epsilons), config.task_runner)
    if plan is None:  # checks that could fail after the charge (model, context, task runner) run before it
        plan = build_run_plan(config)
    elif plan.config != config.for_test_split(plan.num_test):
        raise DpiclError("run: the plan was made for another configuration; plan the run again")
    config = plan.config  # an unset --test-size resolved on the test split (`RunConfig.for_test_split`)
    tracking.warm_up()  # MLflow's import and SQLite store set-up (~10 s) overlap the run

    # 1-2. ingest and partition (private records stay in the private store)
    ingested = ingest_stage.ingested_for(plan, run_id, None, "run")
    paths = RunPaths(**{k: (Path(v) if k in ("public", "private") else v) for k, v in ingested["paths"].items()})
    tang = "tang" in config.methods
    fewshot = _fewshot_run(config, plan, ingested, paths) if tang else None
    if "dpsgd" in config.methods:  # PromptDPSGD's prompt fits the model, checked before the charge
        check_model(config)
    spends = plan.spends(run_id)
    # ledger: every spend of every method the ledger does not already hold for this run, charged at once
    # (all or nothing) before any method runs; a replayed spend may only be served from its cached draw
    if non_private_warning(config):  # a deployment run has no CLI to say it: the flow log does
        logger.warning(non_private_warning(config))
    ledger_entry = charge_spends(config.ledger_id, spends, same_records_ok=config.new_budget_for_same_records)
    cost = planned_cost(spends)
    logger.info(charge_line(ledger_entry, cost, run_id, plan.delta))
    _mark_charged(config, run_id, ingested, plan, ledger_entry)
    tang_summary = _tang_stages(config, run_id, ingested, paths, fewshot, plan, ledger_entry) if tang else None
    others, wall = _other_methods(config, run_id, ingested, plan, ledger_entry)
    if tang:
        wall["tang"] = tang_summary.pop("wall_seconds")
    # each method's wall time depends on its private records (batch sizes, lengths): the private store keeps it
    write_json_atomic(paths.private / "timings.json", {"method_wall_seconds": wall})
    recorded, audit = _record(config, run_id, flow_run_id, ingested, paths, tang_summary, others)
    # the membership audit of the other methods' artifacts (PromptPATE's student, PromptDPSGD's prompts):
    # nothing generated, nothing charged; their verdict joins the comparison beside the DP demos' audit
    method_audits = (_audit_method_artifacts(config, run_id, others)
                     if config.audit and config.audit_methods and others else [])
    comparison = record_stage.record_comparison(
        run_dir=str(paths.public), run_id=run_id, dataset=config.dataset,
        tang_rows=recorded["results"] if tang else [],
        pate_results_path=str(paths.public / "pate_results.parquet") if "pate" in others else None,
        dpsgd_rows=(others.get("dpsgd") or {}).get("results", []), cost=cost,
        method_rows=[row for name in config.methods if name in plan.method_plans for row in others[name]["results"]],
        calibrated=config.calibrate, method_audits=method_audits) if others else None
    seeded_noise = bool((tang_summary or {}).get("seeded_noise")) or any(o["seeded_noise"] for o in others.values())
    results = comparison["rows"] if comparison is not None else recorded["results"]
    return {
        "run_id": run_id,
        "flow_run_id": flow_run_id,
        "dataset": config.dataset,
        "data_hash": ingested["data_hash"],
        "methods": list(config.methods),
        "run_dir": str(paths.public),
        "private_run_dir": str(paths.private),
        "manifest": str(paths.public / "manifest.json"),
        "mlflow_run_id": recorded["mlflow_run_id"],
        "mlflow_experiment_id": recorded["mlflow_experiment_id"],
        "tracking_uri": recorded["tracking_uri"],
        "results": results,
        "private_data_verdict": private_data_verdict(results, config.epsilons),
        "mlflow_comparison_run_id": comparison["mlflow_run_id"] if comparison is not None else None,
        "method_summaries": others,
        "method_audits": method_audits,
        "audit": audit,
        "seeded_noise": seeded_noise,
        "generation_workers": (tang_summary or {}).get("generation_workers", []),
        "planned_cost": cost,
        "ledger": ledger_entry,
        "ledger_after": ledger_report(config.ledger_id, run_id),  # audit charges included
        "epsilons": ["inf" if math.isinf(e) else e for e in config.epsilons],
        "delta": plan.delta,
    }


# The flow's earlier name: a Prefect deployment registered with it (entrypoint flows/pipeline.py:dp_fewshot_pipeline)
# still starts.
dp_fewshot_pipeline = private_prompting_pipeline


def _fewshot_run(config: RunConfig, plan: RunPlan, ingested: dict, paths: RunPaths) -> _FewShotRun:
    """Stages 2-3 of DP few-shot generation, before the charge: partition by label, the plan's sigmas logged
    and written (`calibration.parquet`), the checks that need the model and the data."""
    labels = list(ingested["labels"])
    ingest_stage.partition(ingested)
    fewshot, generation_config = plan.fewshot, plan.generation
    calibrate_stage.record_calibrations(plan=fewshot, generation=generation_config, public_dir=str(paths.public))
    # --test-size and the longest group prompt against the model's context: checked before any charge
    checks_after_ingest(config, ingested["num_test"], labels, generation_config)
    items = generate_stage.generation_plan(labels, fewshot, config.seed)
    return _FewShotRun(fewshot, items, generation_config)


def _mark_charged(config: RunConfig, run_id: str, ingested: dict, plan: RunPlan, ledger_entry: dict) -> None:
    """Right after the charge, before any stage: PromptPATE's noisy stages and PromptDPSGD's trainings this
    charge covers are marked, so a run stopped before their subflows began (during generation, the audit)
    runs them once when resumed under its id (DP few-shot generation marks its own before it starts)."""
    if "pate" in config.methods:
        pate_subflow.mark_charged(config, ingested, plan, ledger_entry, run_id, list(config.epsilons))
    if "dpsgd" in config.methods:
        dpsgd_subflow.mark_charged(config, ingested, plan, ledger_entry)


def _other_methods(config: RunConfig, run_id: str, ingested: dict, plan: RunPlan,
                   ledger_entry: dict) -> tuple[dict, dict]:
    """PromptPATE's and PromptDPSGD's subflows on the plan and the charge already made: (their summaries,
    their wall seconds), by method."""
    others, wall = {}, {}
    if "pate" in config.methods:
        began = time.perf_counter()
        # the zero-shot row, when DP few-shot generation evaluated it on the same test items, is not run twice
        pate_config = (config.model_copy(update={"pate_baselines": [b for b in config.pate_baselines
                                                                    if b != "zero-shot"]})
                       if "tang" in config.methods and "zero-shot" in config.baselines else config)
        # PromptPATE at the run's smaller epsilons too: prefixes of its one labelling, charged once
        others["pate"] = pate_flow(config=pate_config, run_id=run_id, ingested=ingested, charge=ledger_entry,
                                   checkpoint_epsilons=list(config.epsilons), plan=plan)
        wall["pate"] = time.perf_counter() - began
    if "dpsgd" in config.methods:
        began = time.perf_counter()
        others["dpsgd"] = dpsgd_flow(config=config, run_id=run_id, ingested=ingested, charge=ledger_entry, plan=plan)
        wall["dpsgd"] = time.perf_counter() - began
    for name in config.methods:  # every method the registry plans (`tasks.methods`): its subflow, by entry point
        if name in plan.method_plans:
            began = time.perf_counter()
            others[name] = method_subflow(name)(config=config, run_id=run_id, ingested=ingested, charge=ledger_entry,
                                                plan=plan)
            wall[name] = time.perf_counter() - began
    return others, wall


def _record(config: RunConfig, run_id: str, flow_run_id: str, ingested: dict, paths: RunPaths,
            tang_summary: dict | None, others: dict) -> tuple[dict, dict]:
    """7. record: MLflow, Prefect artifacts, manifests (after the other methods: it writes the manifest), when
    the run generated DP demonstrations; otherwise the other methods' MLflow runs. (recorded, audit)."""
    if tang_summary is None:
        first = (others.get("pate") or ({"mlflow_run_id": (others["dpsgd"]["mlflow_run_ids"] or [None])[0]}
                                        if "dpsgd" in others else {}))
        return ({"mlflow_run_id": first.get("mlflow_run_id"), "mlflow_experiment_id":
                 first.get("mlflow_experiment_id"), "tracking_uri": tracking.tracking_uri(), "results": []},
                {"ran": False})
    recorded = record_stage.record(flat_config=config.flat(), info={
        "run_id": run_id, "dataset": config.dataset, "data_hash": ingested["data_hash"],
        "model": config.model, "num_private_records": ingested["num_private_records"],
        "seeded_noise": tang_summary["seeded_noise"], "run_dir": str(paths.public),
        "private_run_dir": str(paths.private), "flow_run_id": flow_run_id,
    })
    audit = recorded["audit"]
    if tang_summary["audit_summary"] is not None:
        audit = {**audit, "summary": tang_summary["audit_summary"], "reference": tang_summary["audit_reference"]}
    return recorded, audit


# the run's charge: the planned cost follows from the public counts; the dataset's total composes every spend
# on it, PromptPATE's DP-released bounds among them
declare_line(Kind.COUNT, r"^ledger \S+: .* planned cost epsilon (\S+); dataset total epsilon \S+ at delta")
declare_line(Kind.DP, r"^ledger \S+: .* planned cost epsilon \S+; dataset total epsilon (\S+) at delta")


def charge_line(ledger_entry: dict, cost: dict, run_id: str, delta: float) -> str:
    """The flow's log line of the run's charge (`tasks.charge.charge_spends`' summary and `planned_cost`),
    epsilons and delta rounded for people (the ledger keeps them exactly)."""
    return (f"ledger {ledger_entry['dataset_id']}: {ledger_entry['charged']} spend(s) charged, "
            f"{ledger_entry['replayed']} replayed from earlier attempts of run {run_id}; planned cost epsilon "
            f"{fmt_eps(cost['epsilon'])}; dataset total epsilon {fmt_eps(ledger_entry.get('total_epsilon'))} at delta "
            f"{fmt_delta(ledger_entry.get('delta') or delta)}")


def _audit_method_artifacts(config: RunConfig, run_id: str, others: dict) -> list[dict]:
    """The release audit (`tasks.release.audit_artifact`) of PromptPATE's chosen student and of PromptDPSGD's
    first training at each epsilon: [{method, epsilon, verdict, passed}] (public summaries)."""
    targets = []
    if (others.get("pate") or {}).get("student_prompt"):
        targets.append(("pate", others["pate"]["epsilon"], None))
    dpsgd_epsilons = {float(r["epsilon"]) for r in (others.get("dpsgd") or {}).get("results", [])
                      if r.get("method") == "dpsgd"}
    targets += [("dpsgd", epsilon, epsilon) for epsilon in sorted(dpsgd_epsilons)]
    audits = []
    for method, epsilon, selected in targets:
        try:
            audited = release_stage.audit_artifact(run_id, method, config.audit_config(), epsilon=selected,
                                                   device=config.device, dtype=config.dtype, seed=config.seed,
                                                   size_to_pools=not ({"audit_trials", "audit_members"}
                                                                      & config.model_fields_set),
                                                   cap_to_pools=True)
        except RunStopped:  # a stop request ends the run, not just this audit
            raise
        except DpiclError as error:  # the methods' results stand; `dpicl release --audit-only` can retry it
            get_run_logger().warning("no membership audit of the %s artifact at epsilon %s: %s", method, fmt_eps(epsilon),
                                     error)
            continue
        audits.append({"method": method, "epsilon": epsilon, "verdict": audited["audit"]["verdict"],
                       "passed": audited["audit"].get("passed")})
    return audits


def _tang_stages(config: RunConfig, run_id: str, ingested: dict, paths: RunPaths, run: _FewShotRun, plan: RunPlan,
                ledger_entry: dict) -> dict:
    """DP few-shot generation's stages 4-6 (Tang et al. Algorithm 1): generation, evaluation and the audit,
    on the charge already made; tables written to the run folders."""
    began = time.perf_counter()
    fewshot, items, generation_config = run.plan, run.items, run.generation_config
    labels = list(ingested["labels"])
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
            "generation_workers": sorted({s.worker for s in shards}),
            "wall_seconds": time.perf_counter() - began}


def run_pipeline(config: RunConfig, run_id: str | None = None, plan: RunPlan | None = None) -> dict:
    """Run the flow in this process (a temporary local Prefect server when PREFECT_API_URL is unset), on
    `plan` when the caller built it (`tasks.run_plans.build_run_plan`)."""
    return private_prompting_pipeline(config=config, run_id=run_id, plan=plan)
