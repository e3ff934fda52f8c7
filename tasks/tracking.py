"""MLflow client code: the project's tracking store, its experiments and the runs of a finished pipeline run.

Store: SQLite `sqlite:///$DPICL_HOME/mlflow/mlflow.db`, artifacts under
`$DPICL_HOME/mlflow/artifacts`, experiment `dp-fewshot/<dataset>`. One `MlflowClient` per
process and URI (no global MLflow state). `log_run` writes one parent run per pipeline run
and a nested run per (method, epsilon):
- params: `RunConfig.flat()` plus sigma (`noise_multiplier`), q (`sampling_rate`), T (`steps`);
- metrics: epsilon (requested bound) and the accountant's upper bound, delta, accuracy and
  calibrated accuracy mean/std over seeds (the audit's verdict as a tag: its figures are private);
- tags: data hash, model, code version, seeded-noise flag, dataset, run id, Prefect flow run id;
- artifacts (parent): the public files of the run folder; a private path or a per-record table
  (`dpcore.data.artifacts.PRIVATE_TABLES`) is refused.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd

from dpcore.data.artifacts import PRIVATE_TABLES
from dpcore.home import is_private_path, subdir
from dpcore.public_outputs import Kind, declare
from dpcore.report.summary import epsilon_text, finite_or_none

# MLflow's runs (every writer's params, metrics and tags, and the rows of MLflow's store that hold them): the DP
# outputs' figures (accuracies on public test items, the loss on public examples, PromptPATE's answered
# queries), the public counts and what the accountant derives from them, the records' keyed content hash,
# and the time spent scoring public test items.
_DP_METRICS = ("accuracy", "accuracy_mean", "accuracy_std", "calibrated_accuracy", "calibrated_accuracy_mean",
               "calibrated_accuracy_std", "val_loss", "answered", "answered_mean", "validation_accuracy",
               "released_rdp")
_COUNT_METRICS = ("noise_multiplier", "sampling_rate", "epsilon_spent", "num_private_records", "train_size",
                  "planned_epsilon", "planned_epsilon_tang", "planned_epsilon_pate", "planned_epsilon_dpsgd",
                  "epsilon", "epsilon_upper", "epochs", "training_records", "sigma", "q", "limiting_label")
for _section in ("metrics", "params"):
    declare("mlflow", Kind.DP, *(f"/*/{_section}/{name}" for name in _DP_METRICS))
    declare("mlflow", Kind.COUNT, *(f"/*/{_section}/{name}" for name in _COUNT_METRICS))
    declare("mlflow", Kind.COUNT, f"/*/{_section}/records_*", f"/*/{_section}/epsilon_*",
            f"/*/{_section}/planned_epsilon_*")  # every registered method's planned epsilon (`tasks.methods`)
    declare("mlflow", Kind.PUBLIC_TIMING, f"/*/{_section}/seconds")
declare("mlflow", Kind.IDENTITY, "/*/params/data_hash", "/*/tags/data_hash")
EXPERIMENT_PREFIX = "dp-fewshot"


def tracking_uri() -> str:
    return f"sqlite:///{subdir('mlflow') / 'mlflow.db'}"


def artifact_root() -> Path:
    return subdir("mlflow") / "artifacts"


_CLIENTS: dict[str, object] = {}
_CLIENTS_LOCK = threading.Lock()


def mlflow_client():
    """An `MlflowClient` on the project's SQLite store (one per process and URI; no global MLflow state)."""
    uri = tracking_uri()
    with _CLIENTS_LOCK:
        if uri not in _CLIENTS:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)  # creates / migrates the SQLite store now
            _CLIENTS[uri] = client
        return _CLIENTS[uri]


def warm_up() -> threading.Thread:
    """Create the MLflow client in a background thread (its import and store set-up take seconds)."""

    def work() -> None:
        try:
            mlflow_client()
        except Exception:  # the record stage will raise it properly
            pass

    thread = threading.Thread(target=work, name="mlflow-warm-up", daemon=True)
    thread.start()
    return thread


def experiment_id(client, dataset: str) -> str:
    """The experiment of a dataset, created with an explicit artifact location under $DPICL_HOME."""
    name = f"{EXPERIMENT_PREFIX}/{dataset}"
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = (artifact_root() / name.replace("/", "_")).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another run
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def log_batch(client, run_id: str, params: dict | None = None, metrics: dict | None = None, tags: dict | None = None):
    """Params, finite metrics and tags of one run in one call (values cut to MLflow's length limits)."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in (metrics or {}).items() if finite_or_none(v) is not None],
        params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()],
    )


def log_run(client, exp: str, info: dict, flat_config: dict[str, str], table: pd.DataFrame,
            calibration: pd.DataFrame, verdict: dict, run_dir: Path) -> str:
    """One parent run (the pipeline run) with a nested run per row of `table` (method, epsilon); the
    public files of `run_dir` as the parent's artifacts (a private one is refused). Returns the parent's id."""
    base_tags = {"data_hash": info["data_hash"], "model": info["model"], "code_version": info["code_version"],
                 "seeded_noise": str(bool(info["seeded_noise"])).lower(), "dataset": info["dataset"],
                 "dpicl_run_id": info["run_id"], "prefect_flow_run_id": info.get("flow_run_id", ""),
                 "audit_passed": str(verdict["passed"]).lower()}
    parent = client.create_run(exp, run_name=info["run_id"], tags=base_tags)
    parent_id = parent.info.run_id
    try:
        deltas = calibration["delta"].dropna()
        log_batch(client, parent_id, params={**flat_config, "data_hash": info["data_hash"]},
                  metrics={"delta": float(deltas.iloc[0]) if len(deltas) else None,
                           "num_private_records": info["num_private_records"]})
        calib = {float(r["epsilon"]): r for r in calibration.to_dict(orient="records")}
        for row in table.to_dict(orient="records"):
            eps = float(row["epsilon"])
            c = calib.get(eps) if row["method"] in ("tang", "sigma-zero", "instruction-only") else None
            child = client.create_run(
                exp, run_name=f"{row['method']}-eps{epsilon_text(eps)}",
                tags={**base_tags, "mlflow.parentRunId": parent_id, "method": row["method"],
                      "epsilon": epsilon_text(eps), **({"audit": str(row["audit"])} if row.get("audit") else {})},
            )
            params = dict(flat_config)
            params.update({"method": row["method"], "epsilon": epsilon_text(eps),
                           "noise_multiplier": c["noise_multiplier"] if c else "",
                           "sampling_rate": c["sampling_rate"] if c else "",
                           "steps": c["steps"] if c else ""})
            child_metrics = {
                "epsilon": eps, "epsilon_upper": c["epsilon_upper"] if c else None,
                "delta": c["delta"] if c else None,
                "noise_multiplier": c["noise_multiplier"] if c else None,
                **{k: row.get(k) for k in ("accuracy_mean", "accuracy_std", "calibrated_accuracy_mean",
                                            "calibrated_accuracy_std")},
            }
            log_batch(client, child.info.run_id, params=params, metrics=child_metrics)
            client.set_terminated(child.info.run_id)
        log_public_files(client, parent_id, [path for path in sorted(run_dir.iterdir()) if path.is_file()
                                             and not path.name.startswith(".")
                                             and path.suffix in (".parquet", ".png", ".json")])
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise
    return parent_id


def log_public_files(client, run_id: str, files: list[Path]) -> None:
    """The files as the run's artifacts (a private one is refused), then the run is terminated."""
    for path in files:
        if is_private_path(path) or path.stem in PRIVATE_TABLES:
            raise PermissionError(f"record: refusing to log private file {path.name} to MLflow")
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)


def log_comparison(dataset: str, run_id: str, table: pd.DataFrame, cost: dict, files: list[Path]) -> str:
    """The methods of one run compared: a parent MLflow run `<run-id>-comparison` (the planned cost) with a
    nested run per (method, epsilon) row and the comparison files as artifacts. Returns the parent's id."""
    client = mlflow_client()
    exp = experiment_id(client, dataset)
    tags = {"dataset": dataset, "dpicl_run_id": run_id, "kind": "comparison"}
    parent_id = client.create_run(exp, run_name=f"{run_id}-comparison", tags=tags).info.run_id
    try:
        log_batch(client, parent_id, params={"methods": ",".join(cost.get("methods", {}))},
                  metrics={"planned_epsilon": cost.get("epsilon"), "planned_delta": cost.get("delta"),
                           **{f"planned_epsilon_{m}": e for m, e in cost.get("methods", {}).items()}})
        for row in table.to_dict(orient="records"):
            name = f"{row['method']}-eps{epsilon_text(row['epsilon'])}"
            child = client.create_run(exp, run_name=name, tags={**tags, "mlflow.parentRunId": parent_id,
                                                                "method": row["method"],
                                                                "epsilon": epsilon_text(row["epsilon"])})
            log_batch(client, child.info.run_id, metrics={k: row[k] for k in row if k != "method"})
            client.set_terminated(child.info.run_id)
        log_public_files(client, parent_id, files)
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise
    return parent_id
