"""AdaDPSyn as a Prefect subflow (Gao et al. 2024; `tasks.adadpsyn`, `dpcore.adadpsyn`), in the method protocol
of `tasks.methods`:

    the run's plan (AdaDPSyn's part: sigma_avg per epsilon) -> ingest (the pipeline's, or the plan's records)
      -> the ledger charge (the pipeline's one charge, or its own) -> DP demonstrations per epsilon (tag `gpu`)
      -> evaluation on the run's test items -> its results rows (`adadpsyn_results.parquet`)

The flow composes tasks only.
"""

from __future__ import annotations

from prefect import flow

from dpcore.config import RunConfig
from dpcore.home import configure_environment
from flows.methods import MethodFlow, evaluated_rows
from flows.runner import cancelled_on_stop, default_run_id
from tasks import adadpsyn as adadpsyn_stage
from tasks import ingest as ingest_stage
from tasks.charge import charge_plans, noise_charged
from tasks.run_plans import RunPlan, build_run_plan

FLOW_NAME = "adadpsyn"
METHOD = "adadpsyn"


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="AdaDPSyn (Gao et al. 2024): DP demonstrations by data-adaptive aggregation (PFIRR).")
@cancelled_on_stop
def adadpsyn_flow(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
                  ingested: dict | None = None, charge: dict | None = None, plan: RunPlan | None = None) -> dict:
    """AdaDPSyn's demonstrations at every epsilon > 0 of `config`, evaluated; a public summary ({method,
    results, seeded_noise, artifacts}). As a subflow: the pipeline's `ingested`, `charge` (which charged
    AdaDPSyn's plans with the run's others) and `plan`; alone, it plans, ingests and charges here."""
    configure_environment()
    run_id = run_id or default_run_id()
    if plan is None or METHOD not in plan.method_plans:
        plan = build_run_plan(config, methods=(METHOD,))
        plan.dry_run(run_id)
    ingested = ingest_stage.ingested_for(plan, run_id, ingested, METHOD)
    plans = list(plan.method_plans[METHOD])
    if charge is None:
        charge = charge_plans(config.ledger_id, ingested["data_hash"], run_id, plans,
                              same_records_ok=config.new_budget_for_same_records)
    made = [adadpsyn_stage.generate(**adadpsyn_stage.generate_call(
        plan.config, ingested, p, len(plan.labels), noise_charged(charge, METHOD, p.epsilon))) for p in plans]
    rows = evaluated_rows(METHOD, plan.config, ingested, plans, made)
    return {"method": METHOD, "results": rows, "seeded_noise": any(m["seeded_noise"] for m in made),
            "artifacts": [m["path"] for m in made], "run_dir": ingested["paths"]["public"]}


def _run_in_pipeline(*, config: RunConfig, run_id: str, ingested: dict, charge: dict, plan: RunPlan,
                     prepared=None) -> dict:
    """The subflow in a run of several methods (`flows.methods.MethodFlow.run`), on the run's charge."""
    return adadpsyn_flow(config=config, run_id=run_id, ingested=ingested, charge=charge, plan=plan)


ADADPSYN = MethodFlow(run=_run_in_pipeline)
