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
from flows.methods import MethodFlow, artifacts_evaluated
from flows.runner import cancelled_on_stop
from tasks import adadpsyn as adadpsyn_stage
from tasks.charge import noise_charged
from tasks.common import Ingested
from tasks.run_plans import RunPlan

FLOW_NAME = "adadpsyn"
METHOD = "adadpsyn"


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="AdaDPSyn (Gao et al. 2024): DP demonstrations by data-adaptive aggregation (PFIRR).")
@cancelled_on_stop
def adadpsyn_flow(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
                  ingested: Ingested | None = None, charge: dict | None = None, plan: RunPlan | None = None) -> dict:
    """AdaDPSyn's demonstrations at every epsilon > 0 of `config`, evaluated; a public summary ({method,
    results, seeded_noise, artifacts}). As a subflow: the pipeline's `ingested`, `charge` (which charged
    AdaDPSyn's plans with the run's others) and `plan`; alone, it plans, ingests and charges here
    (`flows.methods.artifacts_evaluated`)."""

    def make(run_plan, data: Ingested, p, charged: bool) -> dict:
        call = adadpsyn_stage.generate_call(run_plan.config, data, p, len(run_plan.labels), charged)
        adadpsyn_stage.keep_charged(call)  # alone, its charge came just before
        return adadpsyn_stage.generate(**call)

    return artifacts_evaluated(METHOD, make, config=config, run_id=run_id, ingested=ingested, charge=charge,
                               plan=plan)


def _run_in_pipeline(*, config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan,
                     prepared=None) -> dict:
    """The subflow in a run of several methods (`flows.methods.MethodFlow.run`), on the run's charge."""
    return adadpsyn_flow(config=config, run_id=run_id, ingested=ingested, charge=charge, plan=plan)


def _mark_in_pipeline(config: RunConfig, run_id: str, ingested: Ingested, plan: RunPlan, charge: dict) -> None:
    """Right after the run's charge (`flows.methods.MethodFlow.mark_charged`): each generation it charged is marked,
    so a run stopped before AdaDPSyn began draws it once when resumed under its id."""
    for p in plan.method_plan(METHOD) or ():
        adadpsyn_stage.keep_charged(adadpsyn_stage.generate_call(config, ingested, p, len(plan.labels),
                                                                 noise_charged(charge, METHOD, p.epsilon)))


ADADPSYN = MethodFlow(run=_run_in_pipeline, mark_charged=_mark_in_pipeline)
