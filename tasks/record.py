"""Stage 7: record a finished run in MLflow and as Prefect artifacts, and seal its folder.

MLflow (SQLite store `sqlite:///$DPICL_HOME/mlflow/mlflow.db`, artifacts under
`$DPICL_HOME/mlflow/artifacts`, experiment `dp-fewshot/<dataset>`): one parent run per
pipeline run and a nested run per (method, epsilon), with
- params: `RunConfig.flat()` plus sigma (`noise_multiplier`), q (`sampling_rate`), T (`steps`);
- metrics: epsilon (requested bound) and the accountant's upper bound, delta, accuracy and
  calibrated accuracy mean/std over seeds, MIA AUC, TPR at 1% / 0.1% FPR;
- tags: data hash, model, code version, seeded-noise flag, dataset, run id, Prefect flow run id;
- artifacts (parent): the public Parquet tables, the ROC PNG, the privacy-utility PNG, the manifest.
Prefect: a markdown summary and a table artifact.

Everything logged is public configuration, DP outputs or aggregates; files are taken only
from the public run folder (a private path, or a per-record table such as `predictions` or
`mia_scores`, is refused: those live in the private run folder and its own manifest).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dpcore.artifacts import PRIVATE_TABLES, read_table, write_manifest
from dpcore.home import dpicl_home, is_private_path, subdir
from tasks.common import RETRIES, RETRY_DELAY_SECONDS, code_version, transient_only

EXPERIMENT_PREFIX = "dp-fewshot"
SUMMARY_ARTIFACT_KEY = "dp-fewshot-summary"
TABLE_ARTIFACT_KEY = "dp-fewshot-results"


# --------------------------------------------------------------------------- MLflow plumbing


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


def _finite(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _eps_text(epsilon: float) -> str:
    return "inf" if math.isinf(float(epsilon)) else f"{float(epsilon):g}"


def _log(client, run_id: str, params: dict | None = None, metrics: dict | None = None, tags: dict | None = None):
    import time

    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in (metrics or {}).items() if _finite(v) is not None],
        params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
        tags=[RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()],
    )


# --------------------------------------------------------------------------- summaries


def results_table(metrics: pd.DataFrame, calibration: pd.DataFrame, audit: pd.DataFrame | None) -> pd.DataFrame:
    """One row per (method, epsilon): accuracy mean/std (raw and calibrated), sigma, and the audit's AUC."""
    from dpcore.icl import summarise_metrics

    summary = summarise_metrics(metrics)
    sigma = {float(r.epsilon): r for r in calibration.itertuples(index=False)}
    rows = []
    for r in summary.itertuples(index=False):
        eps = float(r.epsilon)
        calib = sigma.get(eps) if r.method in ("dp", "sigma-zero", "instruction-only") else None
        row = {
            "method": r.method, "epsilon": eps,
            "noise_multiplier": (float(calib.noise_multiplier) if calib is not None
                                 else 0.0 if r.method == "sigma-zero" else None),
            "accuracy_mean": float(r.accuracy_mean), "accuracy_std": float(r.accuracy_std),
            "calibrated_accuracy_mean": float(r.calibrated_accuracy_mean),
            "calibrated_accuracy_std": float(r.calibrated_accuracy_std),
            "seeds": int(r.seeds), "n": int(r.n),
        }
        row.update(audit_metrics(audit, r.method, eps))
        rows.append(row)
    order = {"zero-shot": 0, "instruction-only": 1, "dp": 2, "sigma-zero": 3, "random-real": 4}
    table = pd.DataFrame(rows)
    if len(table):
        table = table.sort_values(by=["method", "epsilon"], key=lambda s: s.map(order) if s.name == "method" else s)
    return table.reset_index(drop=True)


def audit_metrics(audit: pd.DataFrame | None, method: str, epsilon: float) -> dict:
    """MIA AUC and TPR at low FPR of the audit row matching (method, epsilon), if any."""
    if audit is None or not len(audit) or "epsilon" not in audit.columns:
        return {}
    rows = audit[audit["epsilon"].astype(float) == float(epsilon)]
    if "setting" in audit.columns:
        rows = rows[rows["setting"] == method]
    elif method != "dp":
        return {}
    if not len(rows):
        return {}
    row = rows.iloc[0]
    out = {}
    for source, target in (("auc", "mia_auc"), ("tpr_at_1pct_fpr", "tpr_at_1pct_fpr"),
                           ("tpr_at_01pct_fpr", "tpr_at_0.1pct_fpr"), ("tpr_at_0_1pct_fpr", "tpr_at_0.1pct_fpr"),
                           ("epsilon_lower_bound", "empirical_epsilon_lower_bound"),
                           ("max_overlap_tokens", "max_overlap_tokens")):
        if source in row.index and _finite(row[source]) is not None:
            out[target] = float(row[source])
    return out


def audit_verdict(audit: pd.DataFrame | None) -> dict:
    if audit is None or not len(audit):
        return {"ran": False, "passed": None, "reasons": []}
    passed = bool(audit["passed"].astype(bool).all()) if "passed" in audit.columns else None
    reasons: list[str] = []
    if "reasons" in audit.columns:
        for row in audit.to_dict(orient="records"):
            value = row["reasons"]
            lines = ([str(v) for v in value if v] if isinstance(value, list | tuple)
                     else [line for line in str(value or "").splitlines() if line])
            where = f"epsilon {_eps_text(row['epsilon'])}: " if "epsilon" in row else ""
            reasons.extend(where + line for line in lines)
    return {"ran": True, "passed": passed, "reasons": reasons}


def _fmt(value, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def summary_markdown(info: dict, table: pd.DataFrame, calibration: pd.DataFrame, verdict: dict) -> str:
    lines = [
        f"# DP few-shot run `{info['run_id']}`",
        "",
        f"- dataset **{info['dataset']}** (content hash `{info['data_hash'][:12]}`), "
        f"{info['num_private_records']} private records, model `{info['model']}`",
        f"- code version `{info['code_version']}`, noise: "
        + ("**fixed seed (experiment, never releasable)**" if info["seeded_noise"] else "cryptographically seeded"),
        f"- run folder `{info['run_dir']}`",
        "",
        "## Privacy",
        "",
        "| epsilon | method | sigma | q | T | delta | accountant upper | cross-check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in calibration.itertuples(index=False):
        lines.append(
            f"| {_eps_text(r.epsilon)} | {r.method} | {_fmt(r.noise_multiplier, '.4f')} | {_fmt(r.sampling_rate, '.3g')} "
            f"| {r.steps} | {_fmt(r.delta, '.3g')} | {_fmt(r.epsilon_upper, '.3f')} "
            f"| {'agreed' if r.crosscheck_agreed else 'DISAGREED'} |"
        )
    lines += ["", "## Accuracy (mean +/- std over seeds)", "",
              "| method | epsilon | accuracy | calibrated accuracy | MIA AUC |", "|---|---|---|---|---|"]
    for r in table.to_dict(orient="records"):
        lines.append(
            f"| {r['method']} | {_eps_text(r['epsilon'])} | {_fmt(r['accuracy_mean'])} +/- {_fmt(r['accuracy_std'])} "
            f"| {_fmt(r['calibrated_accuracy_mean'])} +/- {_fmt(r['calibrated_accuracy_std'])} "
            f"| {_fmt(r.get('mia_auc'))} |"
        )
    lines += ["", "## Audit", ""]
    if not verdict["ran"]:
        lines.append("Not run (`--no-audit`); such a run cannot be released.")
    else:
        lines.append(f"**{'PASSED' if verdict['passed'] else 'FAILED'}**")
        lines += [f"- {reason}" for reason in verdict["reasons"]]
    return "\n".join(lines) + "\n"


def _jsonable_rows(table: pd.DataFrame) -> list[dict]:
    rows = []
    for row in table.to_dict(orient="records"):
        clean = {}
        for key, value in row.items():
            if isinstance(value, float):
                value = None if math.isnan(value) else ("inf" if math.isinf(value) else round(value, 6))
            clean[key] = value
        rows.append(clean)
    return rows


# --------------------------------------------------------------------------- the task


@task(name="record", cache_policy=NO_CACHE, persist_result=False, retries=RETRIES,
      retry_delay_seconds=RETRY_DELAY_SECONDS, retry_condition_fn=transient_only)
def record(*, flat_config: dict[str, str], info: dict) -> dict:
    """Plots, MLflow runs, Prefect artifacts and the manifests of a finished run.

    `info`: run_id, dataset, data_hash, model, num_private_records, seeded_noise, run_dir,
    private_run_dir, flow_run_id (all public). Tables are read from the public run folder.
    """
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from dpcore import plots

    logger = get_run_logger()
    run_dir = Path(info["run_dir"])
    if is_private_path(run_dir):
        raise PermissionError("record: the public run folder may not lie in the private store")
    info = {**info, "code_version": code_version()}
    metrics = read_table(run_dir / "metrics.parquet")
    calibration = read_table(run_dir / "calibration.parquet")
    audit = read_table(run_dir / "audit.parquet") if (run_dir / "audit.parquet").exists() else None
    table = results_table(metrics, calibration, audit)
    verdict = audit_verdict(audit)
    from dpcore.artifacts import write_table

    write_table(table, run_dir / "results.parquet")
    plots.privacy_utility_curve(metrics, run_dir / "privacy_utility.png",
                                title=f"{info['dataset']}: accuracy vs epsilon ({info['model']})")
    manifest_extra = {"run_id": info["run_id"], "dataset": info["dataset"], "data_hash": info["data_hash"],
                      "model": info["model"], "code_version": info["code_version"],
                      "seeded_noise": info["seeded_noise"], "config": flat_config}
    write_manifest(run_dir, extra=manifest_extra)
    if info.get("private_run_dir"):
        write_manifest(Path(info["private_run_dir"]), extra={"run_id": info["run_id"]})

    # ------------------------------------------------------------ MLflow
    client = mlflow_client()
    exp = experiment_id(client, info["dataset"])
    base_tags = {"data_hash": info["data_hash"], "model": info["model"], "code_version": info["code_version"],
                 "seeded_noise": str(bool(info["seeded_noise"])).lower(), "dataset": info["dataset"],
                 "dpicl_run_id": info["run_id"], "prefect_flow_run_id": info.get("flow_run_id", ""),
                 "audit_passed": str(verdict["passed"]).lower()}
    parent = client.create_run(exp, run_name=info["run_id"], tags=base_tags)
    parent_id = parent.info.run_id
    try:
        deltas = calibration["delta"].dropna()
        _log(client, parent_id, params={**flat_config, "data_hash": info["data_hash"]},
             metrics={"delta": float(deltas.iloc[0]) if len(deltas) else None,
                      "num_private_records": info["num_private_records"]})
        calib = {float(r["epsilon"]): r for r in calibration.to_dict(orient="records")}
        for row in table.to_dict(orient="records"):
            eps = float(row["epsilon"])
            c = calib.get(eps) if row["method"] in ("dp", "sigma-zero", "instruction-only") else None
            child = client.create_run(
                exp, run_name=f"{row['method']}-eps{_eps_text(eps)}",
                tags={**base_tags, "mlflow.parentRunId": parent_id, "method": row["method"],
                      "epsilon": _eps_text(eps)},
            )
            params = dict(flat_config)
            params.update({"method": row["method"], "epsilon": _eps_text(eps),
                           "noise_multiplier": c["noise_multiplier"] if c else "",
                           "sampling_rate": c["sampling_rate"] if c else "",
                           "steps": c["steps"] if c else ""})
            child_metrics = {
                "epsilon": eps, "epsilon_upper": c["epsilon_upper"] if c else None,
                "delta": c["delta"] if c else None,
                "noise_multiplier": c["noise_multiplier"] if c else None,
                **{k: row.get(k) for k in ("accuracy_mean", "accuracy_std", "calibrated_accuracy_mean",
                                            "calibrated_accuracy_std", "mia_auc", "tpr_at_1pct_fpr",
                                            "tpr_at_0.1pct_fpr", "empirical_epsilon_lower_bound")},
            }
            _log(client, child.info.run_id, params=params, metrics=child_metrics)
            client.set_terminated(child.info.run_id)
        for path in sorted(run_dir.iterdir()):
            if path.is_file() and not path.name.startswith(".") and path.suffix in (".parquet", ".png", ".json"):
                if is_private_path(path) or path.stem in PRIVATE_TABLES:
                    raise PermissionError(f"record: refusing to log private file {path.name} to MLflow")
                client.log_artifact(parent_id, str(path))
        client.set_terminated(parent_id)
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise

    # ------------------------------------------------------------ Prefect artifacts
    markdown = summary_markdown({**info, "run_dir": str(run_dir)}, table, calibration, verdict)
    markdown += f"\nMLflow run `{parent_id}` (experiment `{EXPERIMENT_PREFIX}/{info['dataset']}`).\n"
    create_markdown_artifact(markdown=markdown, key=SUMMARY_ARTIFACT_KEY,
                             description=f"dp-fewshot run {info['run_id']}: accuracy, privacy, audit")
    create_table_artifact(table=_jsonable_rows(table), key=TABLE_ARTIFACT_KEY,
                          description=f"accuracy per method and epsilon, run {info['run_id']}")
    logger.info("recorded run %s: MLflow run %s, %d result rows, audit %s", info["run_id"], parent_id,
                len(table), "not run" if not verdict["ran"] else ("passed" if verdict["passed"] else "FAILED"))
    return {"mlflow_run_id": parent_id, "mlflow_experiment_id": exp, "tracking_uri": tracking_uri(),
            "results": _jsonable_rows(table), "audit": verdict, "home": str(dpicl_home())}
