"""Scheduled regeneration: re-run the pipeline only when the private records changed.

    fingerprint the dataset source -> unchanged since the last successful run? -> 'no change', no spend
                                   -> changed -> the dp-fewshot pipeline (ledger-checked) -> remember the hash
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.states import Completed

from dpcore.config import RunConfig
from dpcore.data import refresh
from flows.pipeline import private_prompting_pipeline
from flows.runner import cancelled_on_stop
from tasks.common import stoppable_task
from tasks.ingest import load_data


@stoppable_task(name="fingerprint-source", retries=2, retry_delay_seconds=5)
def fingerprint(config: RunConfig) -> dict:
    """The content hash of the private records the pipeline would read (public: a hash)."""
    data = load_data(config, config.audit_holdout_fraction)  # the records the pipeline's plan reads
    decision = refresh.decide(config.ledger_id, data.content_hash)
    return {"content_hash": decision.content_hash, "last_hash": decision.last_hash,
            "last_run_id": decision.last_run_id, "changed": decision.changed}


@stoppable_task(name="remember-source")
def remember(config: RunConfig, content_hash: str, run_id: str) -> str:
    return str(refresh.record_success(config.ledger_id, content_hash, run_id))


@flow(name="scheduled-regeneration", retries=0,
      description="Regenerate DP demonstrations when the dataset changed (no change: no privacy spent).")
@cancelled_on_stop
def regenerate(config: RunConfig = RunConfig()):  # noqa: B008
    logger = get_run_logger()
    source = fingerprint(config)
    if not source["changed"]:
        logger.info("dataset %s unchanged since run %s (hash %s): nothing to do", config.ledger_id,
                    source["last_run_id"], source["content_hash"][:12])
        return Completed(message="no change", data={"changed": False, **source})
    logger.info("dataset %s changed (%s -> %s): running the pipeline", config.ledger_id,
                (source["last_hash"] or "none")[:12], source["content_hash"][:12])
    summary = private_prompting_pipeline(config=config)
    remember(config, summary["data_hash"], summary["run_id"])
    return {"changed": True, **source, "run_id": summary["run_id"], "run_dir": summary["run_dir"],
            "mlflow_run_id": summary["mlflow_run_id"]}
