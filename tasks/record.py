"""Stage 7: record a finished run in MLflow and as Prefect artifacts, and seal its folder.

The results table and the markdown summary come from `dpcore.report.summary`; the MLflow runs
(one parent, one nested run per (method, epsilon)) from `tasks.tracking`. Prefect: a
markdown summary and a table artifact. The run folders are sealed with their manifests.

Everything logged is public configuration, DP outputs or aggregates; files are taken only
from the public run folder (a private path, or a per-record table such as `predictions` or
`mia_scores`, is refused: those live in the private run folder and its own manifest).
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from dpcore.data.artifacts import read_table, write_manifest, write_table
from dpcore.home import dpicl_home, is_private_path
from dpcore.public_outputs import Kind, declare, declare_line
from dpcore.report.summary import (
    audit_verdict,
    comparison_markdown,
    comparison_table,
    jsonable_rows,
    results_table,
    summary_markdown,
    with_audit_verdict,
)
from tasks import tracking
from tasks.common import code_version, uncached_task
from tasks.methods import REGISTRY

SUMMARY_ARTIFACT_KEY = "dp-fewshot-summary"
TABLE_ARTIFACT_KEY = "dp-fewshot-results"
COMPARISON_ARTIFACT_KEY = "private-prompts-compared"

# A run's public tables, plots and artifacts: the DP demos, accuracies of DP prompts on test items and plots of
# them are DP outputs; sigma, q and the epsilons planned follow from |D_y|; the audit's verdict is its one public
# bit; the records' keyed content hash is an identity.
_RESULT_COLUMNS = ("accuracy_mean", "accuracy_std", "calibrated_accuracy_mean", "calibrated_accuracy_std")
declare("file:*demos.parquet", Kind.DP, "/*")
declare("file:*.png", Kind.DP, "")
for _output in ("file:*results.parquet", "file:*comparison.parquet", f"artifact:{TABLE_ARTIFACT_KEY}",
                "artifact:prompt-pate-results"):
    _rows = "/data/*" if _output.startswith("artifact:") else "/*"
    declare(_output, Kind.DP, *(f"{_rows}/{column}" for column in _RESULT_COLUMNS))
    declare(_output, Kind.COUNT, f"{_rows}/noise_multiplier", f"{_rows}/sampling_rate")
    declare(_output, Kind.VERDICT, f"{_rows}/audit")
    declare(_output, Kind.PUBLIC_TIMING, f"{_rows}/seconds")
declare("file:*calibration.parquet", Kind.COUNT, "/*/noise_multiplier", "/*/sampling_rate", "/*/epsilon_upper",
        "/*/epsilon_lower", "/*/epsilon_crosscheck", "/*/limiting_label", "/*/per_label_epsilon")
declare("file:*label_counts.parquet", Kind.COUNT, "/*/records")
for _key in (SUMMARY_ARTIFACT_KEY, COMPARISON_ARTIFACT_KEY):
    declare(f"artifact:{_key}", Kind.DP, "/data/tables/*/*/accuracy", "/data/tables/*/*/calibrated accuracy",
            "/data/tables/*/*/calibrated")
    declare(f"artifact:{_key}", Kind.COUNT, "/data/tables/*/*/sigma", "/data/tables/*/*/q",
            "/data/tables/*/*/accountant upper")
    declare(f"artifact:{_key}", Kind.VERDICT, "/data/tables/*/*/audit")
declare_line(Kind.COUNT, r"^- dataset \*\*.*\*\* \(content hash `.*`\), (\d+) private records")
declare_line(Kind.VERDICT, r"^\*\*(PASSED|FAILED|INCONCLUSIVE)\*\*$")
declare_line(Kind.VERDICT, r"^- epsilon \S+: (.*)$")  # the audit's figure-free reasons
declare_line(Kind.COUNT, r"^Planned cost of every method, composed as the ledger composes it: epsilon (\S+) at delta")


# --------------------------------------------------------------------------- the task


@uncached_task("record")
def record(*, flat_config: dict[str, str], info: dict) -> dict:
    """Plots, MLflow runs, Prefect artifacts and the manifests of a finished run.

    `info`: run_id, dataset, data_hash, model, num_private_records, seeded_noise, run_dir,
    private_run_dir, flow_run_id (all public). Tables are read from the public run folder.
    """
    from dpcore.report import plots

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
    client = tracking.mlflow_client()
    exp = tracking.experiment_id(client, info["dataset"])
    parent_id = tracking.log_run(client, exp, info, flat_config, table, calibration, verdict, run_dir)

    # ------------------------------------------------------------ Prefect artifacts
    markdown = summary_markdown({**info, "run_dir": str(run_dir)}, table, calibration, verdict)
    markdown += f"\nMLflow run `{parent_id}` (experiment `{tracking.EXPERIMENT_PREFIX}/{info['dataset']}`).\n"
    create_markdown_artifact(markdown=markdown, key=SUMMARY_ARTIFACT_KEY,
                             description=f"dp-fewshot run {info['run_id']}: accuracy, privacy, audit")
    create_table_artifact(table=jsonable_rows(table), key=TABLE_ARTIFACT_KEY,
                          description=f"accuracy per method and epsilon, run {info['run_id']}")
    logger.info("recorded run %s: MLflow run %s, %d result rows, audit %s", info["run_id"], parent_id,
                len(table), "not run" if not verdict["ran"] else ("passed" if verdict["passed"] else "FAILED"))
    return {"mlflow_run_id": parent_id, "mlflow_experiment_id": exp, "tracking_uri": tracking.tracking_uri(),
            "results": jsonable_rows(table), "audit": verdict, "home": str(dpicl_home())}


@uncached_task("record-comparison")
def record_comparison(*, run_dir: str, run_id: str, dataset: str, tang_rows: list[dict], method_tables: list[str],
                      cost: dict, calibrated: bool, method_audits: list[dict] | None = None) -> dict:
    """The methods of one run side by side (`dpcore.report.summary.comparison_table`): `comparison.parquet` and
    `comparison.png` in the public run folder, a Prefect markdown artifact and an MLflow parent run with a
    nested run per (method, epsilon). `method_tables`: every other method's public results table
    (`tasks.methods.MethodEntry.results`), in the registry's order. `method_audits`: the membership audits of
    methods' artifacts ({method, epsilon, verdict}), shown in their rows. Public rows only."""
    from dpcore.report import plots

    folder = Path(run_dir)
    if is_private_path(folder):
        raise PermissionError("record: the public run folder may not lie in the private store")
    method_rows = [row for path in method_tables for row in read_table(Path(path)).to_dict(orient="records")]
    table = comparison_table(tang_rows, with_audit_verdict(method_rows, method_audits or []), delta=cost.get("delta"))
    write_table(table, folder / "comparison.parquet")
    plots.comparison_curve(table, folder / "comparison.png", title=f"{dataset}: private prompts compared",
                           calibrated=calibrated, labels={m.name: m.title.split(" (")[0] for m in REGISTRY.values()})
    # the manifest covers every file of the run folder: written again with the comparison's files in it
    manifest = folder / "manifest.json"
    kept = json.loads(manifest.read_text()) if manifest.exists() else {"run_id": run_id}
    write_manifest(folder, extra={k: v for k, v in kept.items() if k != "files"})
    create_markdown_artifact(markdown=comparison_markdown(run_id, table, cost), key=COMPARISON_ARTIFACT_KEY,
                             description=f"private-prompting methods compared, run {run_id}")
    mlflow_run_id = tracking.log_comparison(dataset, run_id, table, cost, [folder / "comparison.parquet",
                                                                            folder / "comparison.png"])
    return {"rows": jsonable_rows(table), "mlflow_run_id": mlflow_run_id}
