"""DP-ICL as a Prefect subflow (Wu et al. 2024; `tasks.dp_icl`, `dpcore.dp_icl`), in the method protocol of
`tasks.methods`:

    the run's plan (DP-ICL's part: sigma per epsilon, sized to the run's Q test items) -> ingest (the pipeline's,
      or the plan's records) -> `prepare`: each plan's line logged (before the charge) -> the ledger charge (the
      pipeline's one charge, or its own) -> the test items answered per epsilon (tag `gpu`) -> its results rows
      (`dp_icl_results.parquet`)

Its product is private prediction, not a prompt: nothing is evaluated with a prompt, nothing is released; the
accuracy of its answers on the run's test items is its row of the comparison. The flow composes tasks only.
"""

from __future__ import annotations

from prefect import flow

from dpcore.config import RunConfig
from flows.methods import MethodFlow, planned_and_charged
from flows.runner import cancelled_on_stop
from tasks import dp_icl as dp_icl_stage
from tasks.charge import noise_charged
from tasks.common import Ingested, stage_logger
from tasks.run_plans import RunPlan

FLOW_NAME = "dp-icl"
METHOD = "dp-icl"


@flow(name=FLOW_NAME, log_prints=False, validate_parameters=True, retries=0,
      description="DP-ICL (Wu et al. 2024): the test items answered by a noisy vote of private exemplar subsets.")
@cancelled_on_stop
def dp_icl_flow(config: RunConfig = RunConfig(), run_id: str | None = None,  # noqa: B008
                ingested: Ingested | None = None, charge: dict | None = None, plan: RunPlan | None = None) -> dict:
    """DP-ICL's answers to the run's test items at every finite epsilon > 0 of `config`; a public summary
    ({method, results, seeded_noise, artifacts, run_dir}). As a subflow: the pipeline's `ingested`, `charge`
    (which charged DP-ICL's plans with the run's others) and `plan`; alone, it plans, ingests and charges here."""
    run_id, plan, ingested, plans, charge = planned_and_charged(METHOD, config=config, run_id=run_id,
                                                                ingested=ingested, charge=charge, plan=plan,
                                                                before_charge=_say_plans)
    calls = [dp_icl_stage.answer_call(plan.config, ingested, p, noise_charged(charge, METHOD, p.epsilon))
             for p in plans]
    for call in calls:  # alone, its charge came just before (in a run, `_mark_in_pipeline` marked them)
        dp_icl_stage.keep_charged(call)
    answered = [dp_icl_stage.answer(**call) for call in calls]
    rows = dp_icl_stage.result_rows(plans, answered, dp_icl_stage.run_settings(plan.config).vote_mode)
    dp_icl_stage.write_results(rows, str(ingested.paths.public))
    return {"method": METHOD, "results": rows, "seeded_noise": any(a["seeded_noise"] for a in answered),
            "artifacts": [a["path"] for a in answered], "run_dir": str(ingested.paths.public)}


def _say_plans(plans) -> None:
    """Each plan's line (`tasks.dp_icl.PLANNED_LOG`: Q, M, k, q and the noise), logged before the charge."""
    for p in plans:
        stage_logger().info(dp_icl_stage.PLANNED_LOG, *dp_icl_stage.plan_line(p))


def _prepare(config: RunConfig, plan: RunPlan, ingested: Ingested) -> None:
    """Before the run's charge (`flows.methods.MethodFlow.prepare`): the plans said."""
    _say_plans(plan.method_plans.get(METHOD, ()))


def _run_in_pipeline(*, config: RunConfig, run_id: str, ingested: Ingested, charge: dict, plan: RunPlan,
                     prepared=None) -> dict:
    """The subflow in a run of several methods (`flows.methods.MethodFlow.run`), on the run's charge."""
    return dp_icl_flow(config=config, run_id=run_id, ingested=ingested, charge=charge, plan=plan)


def _mark_in_pipeline(config: RunConfig, run_id: str, ingested: Ingested, plan: RunPlan, charge: dict) -> None:
    """Right after the run's charge (`flows.methods.MethodFlow.mark_charged`): each plan's answers it charged are
    marked, so a run stopped before DP-ICL answered answers them once when resumed under its id."""
    for p in plan.method_plans.get(METHOD, ()):
        dp_icl_stage.keep_charged(dp_icl_stage.answer_call(config, ingested, p, noise_charged(charge, METHOD,
                                                                                              p.epsilon)))


DP_ICL = MethodFlow(run=_run_in_pipeline, prepare=_prepare, mark_charged=_mark_in_pipeline)
