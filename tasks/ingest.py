"""Stages 1-2: ingest (load and validate the dataset) and partition it by label.

Ingest writes the private `records` table (train = D_priv and the test split: a separate
`test_path` file, or rows held out of the data file; with a test file, the audit's held-out rows of the data
file) into the run's private folder and returns only paths, the content hash and counts.
Beside it, in the public run folder, `run_inputs.json` (`dpcore.data.artifacts.RUN_INPUTS_FILE`): the task
spec's content and resolved path, the run's delta and its source, what a release of the run reads.
Partition writes the private `partitions` table (which record ids form D_y, in the
order the sampler indexes them) and the public `label_counts` table: per-label record
counts |D_y| are treated as public, as in Tang et al. (they set the sampling rate).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import get_run_logger

from dpcore.data.artifacts import RUN_INPUTS_FILE, read_table, write_json_atomic, write_table
from dpcore.data.datasets import LoadedDataset, load_dataset
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import DpiclError
from dpcore.privacy.ledger import Ledger
from dpcore.public_outputs import declare_log
from tasks.common import Ingested, run_paths, uncached_task

# |D| is a public count; the content hash a keyed version id of the records
INGESTED_LOG = declare_log("ingested %s: %d private records, %d test items, %d labels, content hash %s",
                           count=(1,), identity=(4,))
PARTITIONED_LOG = declare_log("partitioned by label: %s", count=(0,))  # |D_y|: they set q


def load_data(config, audit_holdout: float | None = None) -> LoadedDataset:
    """The dataset of a command (`RunConfig`: a shipped task or a user's file with its task YAML), validated (the
    checks and dry runs before a run or a command). `audit_holdout`: a run's (`RunConfig.audit_holdout_fraction`,
    which its plan passes), the rows of the private file its audits hold out; a command that audits nothing
    holds none out. The one write: `remember_records`."""
    return remember_records(load_dataset(load_task_spec(config.task_spec or config.dataset), config.data_path,
                                         config.test_path, audit_holdout))


def remember_records(data: LoadedDataset) -> LoadedDataset:
    """Keep the records' sketch beside the ledger's content hash, so a charge under another dataset id on
    the same records is told apart from new records (`dpcore.privacy.ledger`: a budget belongs to the records)."""
    Ledger().remember_records(data.content_hash, data.record_set())
    return data


@uncached_task("ingest")
def ingest(dataset: str, run_id: str, data_path: str | None = None, task_spec: str | None = None,
           test_path: str | None = None, plan=None) -> Ingested:
    """Load + validate the dataset; write the private `records` table. Returns paths and aggregates only.

    `test_path`: a separate test file (the test split); without it the test rows are held out of the
    private file by the task's seeded split. Either way the test rows are private too (records table).
    `plan`: the run's `tasks.run_plans.RunPlan`, whose records (loaded when it was made, in this process)
    are the ones ingested, so what is written is what the plan charges for; refused when the plan was made
    from another source or its records do not have its content hash.
    """
    if plan is None:
        spec = load_task_spec(task_spec or dataset)
        data = remember_records(load_dataset(spec, data_path, test_path))
    else:
        data, spec = plan.data, plan.data.spec
        source = (plan.config.dataset, plan.config.data_path, plan.config.task_spec, plan.config.test_path)
        if source != (dataset, data_path, task_spec, test_path) or data.content_hash != plan.data_hash:
            raise DpiclError("ingest: the run's plan was made from other records than these; plan the run again")
    paths = run_paths(dataset, data.content_hash, run_id)
    # `public`: a shipped source's public split (public rows, kept beside the others for PromptDPSGD's
    # public loss curve); never present for a user's file
    records = pd.concat(
        [data.train.assign(split="train"), data.test.assign(split="test"), data.public.assign(split="public"),
         data.audit.assign(split="audit")],
        ignore_index=True,
    )[["split", "id", "text", "label"]]
    records["id"] = records["id"].astype(str)
    records_path = write_table(records, paths.private / "records.parquet")
    write_json_atomic(paths.public / RUN_INPUTS_FILE, {
        "task_spec": spec.model_dump(mode="json"), "task_spec_path": task_spec or dataset,
        "delta": None if plan is None else plan.delta, "delta_source": None if plan is None else plan.delta_source})
    summary = data.summary()
    get_run_logger().info(
        INGESTED_LOG,
        dataset, summary["train_size"], summary["test_size"], summary["labels"], data.content_hash[:12],
    )
    return Ingested(
        dataset=dataset,
        task_spec=task_spec or dataset,
        kind=spec.kind,
        data_hash=data.content_hash,
        source=data.source,
        labels=tuple(data.labels),
        num_private_records=int(summary["train_size"]),
        num_test=int(summary["test_size"]),
        records_path=str(records_path),
        paths=paths,
    )


@uncached_task("partition")
def ingested_for(plan, run_id: str, ingested: Ingested | None, who: str) -> Ingested:
    """The plan's records ingested for `run_id`, or, for a subflow handed its pipeline's ingest result, that
    result checked against the plan's content hash (`who` names the method in the refusal)."""
    if ingested is None:
        config = plan.config
        return ingest(config.dataset, run_id, config.data_path, config.task_spec, config.test_path, plan=plan)
    if ingested.data_hash != plan.data_hash:
        raise DpiclError(f"{who}: the dataset changed since it was planned (content hash differs); run again")
    return ingested


def partition(ingested: Ingested) -> dict:
    """Split D_priv by label: private `partitions` (label, position, id) and public `label_counts`."""
    records = read_table(Path(ingested.records_path))
    train = records[records["split"] == "train"]
    rows, counts = [], []
    for label in ingested.labels:
        ids = train.loc[train["label"] == label, "id"].tolist()
        rows.append(pd.DataFrame({"label": label, "position": range(len(ids)), "id": ids}))
        counts.append({"label": label, "records": len(ids)})
    private, public = ingested.paths.private, ingested.paths.public
    write_table(pd.concat(rows, ignore_index=True), private / "partitions.parquet")
    write_table(pd.DataFrame(counts, columns=["label", "records"]), public / "label_counts.parquet")
    label_counts = {row["label"]: int(row["records"]) for row in counts}
    get_run_logger().info(PARTITIONED_LOG, label_counts)
    return {"label_counts": label_counts}


def private_split(records_path: str, split: str = "train") -> pd.DataFrame:
    """One split (id, text, label) of the private `records` table: "train" (D_priv), "test" or "audit" (rows of
    the private file held out as the audit's non-members; read inside a task or a command's process, never
    returned from a task)."""
    records = read_table(Path(records_path))
    return records[records["split"] == split][["id", "text", "label"]].reset_index(drop=True)


def records_by_label(records_path: str, labels: list[str] | None = None) -> dict[str, list[str]]:
    """D_y for each label from the private `records` table (read inside a task, never returned from one)."""
    train = private_split(records_path, "train")
    wanted = labels if labels is not None else sorted(train["label"].unique())
    return {label: train.loc[train["label"] == label, "text"].tolist() for label in wanted}


def public_test_split(records_path: str) -> pd.DataFrame:
    """The test split (id, text, label) from the private `records` table.

    Its rows are held out of generation (not covered by the DP guarantee): per-item outputs computed
    from them (predictions) stay private; only aggregates over them (accuracy) are published."""
    return private_split(records_path, "test")
