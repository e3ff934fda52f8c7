"""DP-OPT as a Prefect subflow (Hong et al. 2024; `tasks.dp_opt`, `dpcore.dp_opt`), in the method protocol of
`tasks.methods`:

    the run's plan (DP-OPT's part: sigma per epsilon) -> ingest (the pipeline's, or the plan's records)
      -> the ledger charge (the pipeline's one charge, or its own) -> a private instruction per epsilon (tag
      `gpu`) -> evaluation on the run's test items (the instruction in front of a zero-shot prompt) -> its
      results rows (`dp_opt_results.parquet`)

The flow composes tasks only.
"""

from __future__ import annotations

from prefect import flow

from dpcore.config import RunConfig
from flows.methods import MethodFlow, artifacts_evaluated
from flows.runner import cancelled_on_stop
from tasks import dp_opt as dp_opt_stage
from tasks.charge import noise_charged
from tasks.common import Ingested
from tasks.run_plans import RunPlan

FLOW_NAME = "dp-opt"
METHOD = "dp-opt"


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="DP-OPT (Hong et al. 2024): a private instruction written by a noisy ensemble.")
@cancelled_on_stop
def dp_opt_flow(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
                ingested: Ingested | None = None, charge: dict | None = None, plan: RunPlan | None = None) -> dict:
    """DP-OPT's instruction at every epsilon > 0 of `config`, evaluated; a public summary ({method, results,
    seeded_noise, artifacts, run_dir}). As a subflow: the pipeline's `ingested`, `charge` and `plan`;
    alone, it plans, ingests and charges here (`flows.methods.artifacts_evaluated`)."""

    def make(run_plan, data: Ingested, p, charged: bool) -> dict:
        call = dp_opt_stage.write_call(run_plan.config, data, p, charged)
        dp_opt_stage.keep_charged(call)  # alone, its charge came just before
        return dp_opt_stage.write(**call)

    return artifacts_evaluated(METHOD, make, config=config, run_id=run_id, ingested=ingested, charge=charge,
                               plan=plan)


def _run_in_pipeline(*, config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan,
                     prepared=None) -> dict:
    """The subflow in a run of several methods (`flows.methods.MethodFlow.run`), on the run's charge."""
    return dp_opt_flow(config=config, run_id=run_id, ingested=ingested, charge=charge, plan=plan)


def _mark_in_pipeline(config: RunConfig, run_id: str, ingested: Ingested, plan: RunPlan, charge: dict) -> None:
    """Right after the run's charge (`flows.methods.MethodFlow.mark_charged`): each instruction it charged is
    marked, so a run stopped before DP-OPT began writes it once when resumed under its id."""
    for p in plan.method_plan(METHOD) or ():
        dp_opt_stage.keep_charged(dp_opt_stage.write_call(config, ingested, p, noise_charged(charge, METHOD,
                                                                                               p.epsilon)))


DP_OPT = MethodFlow(run=_run_in_pipeline, mark_charged=_mark_in_pipeline)
