"""The private-prompting pipeline as one Prefect flow: every method `config.methods` names (DP few-shot
generation, Tang et al.; PromptPATE and PromptDPSGD, Duan et al.; AdaDPSyn; DP-OPT) on the same ingested data,
test split and ledger, each through the method protocol (`tasks.methods.REGISTRY`, `flows.methods.MethodFlow`).

    the run's plan (`tasks.run_plans.RunPlan`, the caller's or built here: the data read once, delta, every
      method's plans, the audit's design) -> ingest (the plan's records)
      -> each method's `prepare` (tang: partition by label, the planned sigmas tabled, context checks;
         dpsgd: the prompt fits the model)
      -> ONE ledger charge for every method's spends (all or nothing) -> each method's `mark_charged` (its
         charged stages marked: a run stopped before they began runs them once when resumed)
      -> each method's `run`, in the registry's order: its Prefect subflow on the run's charge (`flows.tang`:
         generate, evaluate, audit; the others: the `subflow` their registry entries name, `flows.pate`, ...)
      -> record (MLflow, Prefect artifacts, manifests) -> the comparison table (a row per method and epsilon)

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

import math
import time

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext

from dpcore.config import RunConfig
from dpcore.data.artifacts import write_json_atomic
from dpcore.display import fmt_delta, fmt_eps
from dpcore.errors import DpiclError, RunStopped
from dpcore.home import configure_environment
from dpcore.public_outputs import Kind, declare_line
from dpcore.report.summary import private_data_verdict
from flows.methods import method_flow
from flows.runner import cancelled_on_stop, default_run_id
from tasks import ingest as ingest_stage
from tasks import record as record_stage
from tasks import release as release_stage
from tasks import tracking
from tasks.charge import (
    charge_spends,
    ledger_report,
    non_private_warning,
    planned_cost,
)
from tasks.common import Ingested, RunPaths
from tasks.methods import REGISTRY
from tasks.run_plans import RunPlan, build_run_plan

FLOW_NAME = "dp-fewshot"


# --------------------------------------------------------------------------- the flow


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
    paths = ingested.paths
    tang = "tang" in config.methods
    # every method the run names, in the registry's order (`tasks.methods`), by its flow (`flows.methods`)
    flows_ = {name: method_flow(name) for name in REGISTRY if name in config.methods}
    # what each method must do before the charge (tang: partition, calibrations, context checks; dpsgd: the model)
    prepared = {name: f.prepare(config, plan, ingested) for name, f in flows_.items() if f.prepare is not None}
    spends = plan.spends(run_id)
    # ledger: every spend of every method the ledger does not already hold for this run, charged at once
    # (all or nothing) before any method runs; a replayed spend may only be served from its cached draw
    if non_private_warning(config):  # a deployment run has no CLI to say it: the flow log does
        logger.warning(non_private_warning(config))
    ledger_entry = charge_spends(config.ledger_id, spends, same_records_ok=config.new_budget_for_same_records)
    cost = planned_cost(spends)
    logger.info(charge_line(ledger_entry, cost, run_id, plan.delta))
    # right after the charge, before any stage: each method's charged stages marked, so a run stopped before
    # they began runs them once when resumed under its id
    for f in flows_.values():
        if f.mark_charged is not None:
            f.mark_charged(config, run_id, ingested, plan, ledger_entry)
    summaries, wall = {}, {}
    for name, f in flows_.items():
        began = time.perf_counter()
        summaries[name] = f.run(config=config, run_id=run_id, ingested=ingested, charge=ledger_entry, plan=plan,
                                prepared=prepared.get(name))
        wall[name] = time.perf_counter() - began
    tang_summary = summaries.pop("tang", None)
    others = summaries
    # each method's wall time depends on its private records (batch sizes, lengths): the private store keeps it
    write_json_atomic(paths.private / "timings.json", {"method_wall_seconds": wall})
    recorded, audit = _record(config, run_id, flow_run_id, ingested, paths, tang_summary, others)
    # the membership audit of the other methods' artifacts (`MethodEntry.audited_in_run`): nothing generated,
    # nothing charged; their verdict joins the comparison beside the DP demos' audit
    method_audits = (_audit_method_artifacts(config, run_id, others)
                     if config.audit.enabled and config.audit.methods and others else [])
    comparison = record_stage.record_comparison(
        run_dir=str(paths.public), run_id=run_id, dataset=config.dataset,
        tang_rows=recorded["results"] if tang else [],
        method_tables=[str(paths.public / REGISTRY[name].results) for name in REGISTRY if name in others],
        cost=cost, calibrated=config.calibrate, method_audits=method_audits) if others else None
    seeded_noise = bool((tang_summary or {}).get("seeded_noise")) or any(o["seeded_noise"] for o in others.values())
    results = comparison["rows"] if comparison is not None else recorded["results"]
    return {
        "run_id": run_id,
        "flow_run_id": flow_run_id,
        "dataset": config.dataset,
        "data_hash": ingested.data_hash,
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


def _record(config: RunConfig, run_id: str, flow_run_id: str, ingested: Ingested, paths: RunPaths,
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
        "run_id": run_id, "dataset": config.dataset, "data_hash": ingested.data_hash,
        "model": config.model, "num_private_records": ingested.num_private_records,
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
    """The release audit (`tasks.release.audit_artifact`) of the artifacts each method's entry names
    (`MethodEntry.audited_in_run`: PromptPATE's chosen student, PromptDPSGD's first training at each epsilon):
    [{method, epsilon, verdict, passed}] (public summaries), in the registry's order."""
    targets = [(name, epsilon, selected) for name, found in REGISTRY.items()
               if name in others and found.audited_in_run is not None
               for epsilon, selected in found.audited_in_run(others[name] or {})]
    audits = []
    for method, epsilon, selected in targets:
        try:
            audited = release_stage.audit_artifact(run_id, method, config.audit_config(), epsilon=selected,
                                                   device=config.device, dtype=config.dtype, seed=config.seed,
                                                   size_to_pools=not ({"audit_trials", "audit_members"}
                                                                      & config.flat_fields_set),
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


def run_pipeline(config: RunConfig, run_id: str | None = None, plan: RunPlan | None = None) -> dict:
    """Run the flow in this process (a temporary local Prefect server when PREFECT_API_URL is unset), on
    `plan` when the caller built it (`tasks.run_plans.build_run_plan`)."""
    return private_prompting_pipeline(config=config, run_id=run_id, plan=plan)
