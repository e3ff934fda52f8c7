"""PromptDPSGD as a Prefect flow (Duan et al. Section 4.1): soft prompts or prefixes trained with DP-SGD.

    the run's plan (sigma per epsilon) -> budget dry run -> model checks -> ingest -> ledger charge
      -> train (one task per epsilon and training, tag `gpu`) -> evaluate (the pipeline's task) -> record

Usable alone (`dpicl tune`) or as a subflow of the pipeline: pass the pipeline's `ingested` value and run
id to reuse its ingested data and run folder. Every check that could fail runs before the charge; the
charge (`tasks.charge.charge_plans`) comes before the first training step and is all or nothing
(`BudgetExceededError`: exit 3). Right after it, every training the charge covers is marked
(`tasks.tune.keep_charged`; the pipeline marks them at its own charge, `mark_charged`), so a run stopped
before a training began may still start it once when resumed under its id. The flow composes tasks only.
"""

from __future__ import annotations

import math

from prefect import flow, get_run_logger

from dpcore.config import RunConfig
from dpcore.display import fmt_eps
from dpcore.errors import DpiclError
from dpcore.home import configure_environment
from dpcore.public_outputs import Kind, declare_line
from flows.methods import MethodFlow
from flows.runner import cancelled_on_stop, default_run_id
from tasks import evaluate as evaluate_stage
from tasks import ingest as ingest_stage
from tasks import tune as tune_stage
from tasks.charge import charge_plans, ledger_report, noise_charged
from tasks.common import Ingested
from tasks.run_plans import RunPlan, build_run_plan

FLOW_NAME = "prompt-dpsgd"
METHOD = "dpsgd"
declare_line(Kind.DP, r"^ledger \S+: .* dataset total epsilon (\S+); prompt")  # every spend on the dataset


def charge_line(charge: dict, shape: str) -> str:
    """The flow's log line of its charge (`tasks.charge.charge_spends`' summary), rounded for people."""
    return (f"ledger {charge['dataset_id']}: {charge['charged']} spend(s) charged, {charge['replayed']} replayed; "
            f"dataset total epsilon {fmt_eps(charge.get('total_epsilon'))}; prompt {shape}")


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="PromptDPSGD (Duan et al. Section 4.1): a soft prompt or prefix trained with DP-SGD.")
@cancelled_on_stop
def dpsgd_flow(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
               ingested: Ingested | None = None, charge: dict | None = None, plan: RunPlan | None = None) -> dict:
    """Train, evaluate and record PromptDPSGD prompts for every epsilon of `config`; a public summary.

    As a subflow: `ingested` is the pipeline's ingest result (its records and run folder are reused);
    `charge` the summary of a `charge_plans` call that already charged `tasks.tune.method_plan` with
    the pipeline's other plans in one transaction (then this flow charges nothing itself, and trains the
    spends that call charged). `plan`: the run's plan (`tasks.run_plans.RunPlan`, PromptDPSGD's part made),
    built in this process by the caller (`plan_tuning`, the pipeline); None plans (and dry-runs) here."""

    configure_environment()
    logger = get_run_logger()
    run_id = run_id or default_run_id()
    if plan is None or plan.method_plan(METHOD) is None:
        plan, shape = plan_tuning(config, run_id)  # data size, plans, budget (dry run), model: nothing written yet
    elif not plan.made_from(config):
        raise DpiclError("dpsgd: the plan was made for other records; plan the run again")
    else:
        shape = tune_stage.check_model(config)  # the model cache's: loaded once per process
    ingested = ingest_stage.ingested_for(plan, run_id, ingested, METHOD)
    plans = list(plan.method_plan(METHOD))
    if charge is None:
        charge = charge_plans(config.ledger_id, ingested.data_hash, run_id, plans,
                              same_records_ok=config.new_budget_for_same_records)
    logger.info(charge_line(charge, shape["shape"]))
    paths = ingested.paths
    calls = training_calls(config, ingested, plans, charge)
    tune_stage.keep_charged(calls)  # before any starts: a stop before a training began leaves it startable once
    trained = [tune_stage.train_prompt(**call) for call in calls]
    calls = tune_stage.evaluation_calls(config, ingested, trained)
    evaluations = [evaluate_stage.evaluate(**call) for call in calls]
    metrics = tune_stage.metrics_table(trained, evaluations)
    rows = tune_stage.summary_rows(plans, metrics)
    seeded = any(t["seeded_noise"] for t in trained)
    info = {"run_id": run_id, "dataset": config.dataset, "data_hash": ingested.data_hash,
            "run_dir": str(paths.public), "private_run_dir": str(paths.private), "seeded_noise": seeded}
    recorded = tune_stage.record_tuning(config=config, info=info, rows=rows, trained=trained)
    return {
        "run_id": run_id, "dataset": config.dataset, "data_hash": ingested.data_hash, "model": config.model,
        "run_dir": str(paths.public), "results": rows, "seeded_noise": seeded,
        "prompts": [{"epsilon": t["epsilon"], "training": t["training"], "path": t["prompt_path"],
                     "curve": t["curve"]} for t in trained],
        "prompt_shape": shape["shape"], "trainable_parameters": shape["parameters"],
        "ledger": charge, "ledger_after": ledger_report(config.ledger_id, run_id),
        "mlflow_run_ids": recorded["mlflow_run_ids"], "plans": [p.to_dict() for p in plans],
        "epsilons": ["inf" if math.isinf(p.epsilon) else p.epsilon for p in plans],
        "metrics_path": str(paths.public / "dpsgd_results.parquet"),
    }


def training_calls(config: RunConfig, ingested: Ingested, plans: list, charge: dict) -> list[dict]:
    """`tasks.tune.train_prompt`'s arguments for every (epsilon, training) of `plans`, each saying whether
    `charge` (this attempt's) charged its spend."""
    paths = ingested.paths
    return [dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                 task_spec=ingested.task_spec, plan=plan.to_dict(), epsilon=plan.epsilon, training=i,
                 config=config, public_dir=str(paths.public), private_dir=str(paths.private),
                 noise_charged=noise_charged(charge, "dpsgd", plan.epsilon, i))
            for plan in plans for i in range(len(plan.spends))]


def mark_charged(config: RunConfig, ingested: Ingested, plan: RunPlan, charge: dict) -> None:
    """Mark the trainings `charge` charged (`tasks.tune.keep_charged`): for a caller that charges PromptDPSGD
    with other methods and runs this flow later (the pipeline), right after its charge."""
    tune_stage.keep_charged(training_calls(config, ingested, list(plan.method_plan(METHOD)), charge))


def plan_tuning(config: RunConfig, run_id: str | None) -> tuple[RunPlan, dict]:
    """Every check that could fail after the charge, before anything is written: (the run's plan, the prompt's
    shape). The plan (`tasks.run_plans.build_run_plan`: a classification task, `--test-size` within the
    test split, the plans: epsilon > 0, batch <= N, sigma reachable), the budget (a dry run of the charge:
    `BudgetExceededError`, exit 3, before any model loads), then the model (`tasks.tune.check_model`)."""
    plan = build_run_plan(config, methods=(METHOD,))
    plan.dry_run(run_id)
    return plan, tune_stage.check_model(config)


def run_tuning(config: RunConfig, run_id: str | None = None, plan: RunPlan | None = None) -> dict:
    """Run the flow in this process (a temporary local Prefect server when PREFECT_API_URL is unset), on
    `plan` when the caller made it (`plan_tuning`)."""
    return dpsgd_flow(config=config, run_id=run_id, plan=plan)


def _run_in_pipeline(*, config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan,
                     prepared=None) -> dict:
    """PromptDPSGD in a run of several methods (`flows.methods.MethodFlow.run`), on the run's charge."""
    return dpsgd_flow(config=config, run_id=run_id, ingested=ingested, charge=charge, plan=plan)


def _prepare_in_pipeline(config: RunConfig, plan: RunPlan, ingested: Ingested) -> dict:
    """Before the run's charge: the prompt fits the model (`tasks.tune.check_model`)."""
    return tune_stage.check_model(config)


def _mark_in_pipeline(config: RunConfig, run_id: str, ingested: Ingested, plan: RunPlan, charge: dict) -> None:
    mark_charged(config, ingested, plan, charge)


DPSGD = MethodFlow(run=_run_in_pipeline, prepare=_prepare_in_pipeline, mark_charged=_mark_in_pipeline)
