"""Generation statistics are no side channel: the public outputs of a generation (the result's public
stats, progress lines, log lines, the task result, `dpicl generate --json`, `generation.json`) are a
function of the DP outputs and the configuration only.

Reproduction: two datasets that differ in one record (made much longer), the tiny model, a fixed seed
and enough noise that the demos agree: the prompt token counts differ (private counters), every public
output is identical.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pipeline_support import prefect_harness, share_tiny_model  # noqa: F401  (the shared harness fixture)

from dpcore.data.taskspec import TASKS_DIR, load_task_spec
from dpcore.fewshot.config import GenerationConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)

LABELS = ["World", "Sports", "Business", "Technology"]
PER_LABEL = 12
CHANGED = ("World", 3)  # (label, index) of the one record that differs


def _records(longer: bool) -> dict[str, list[str]]:
    """Made-up records standing in for private ones; `longer`: one record is ten times longer."""
    words = ["market", "match", "election", "chip", "storm", "merger", "league", "rocket"]
    rng = np.random.default_rng(0)
    records = {label: [f"{label} item {i}: " + " ".join(rng.choice(words, size=4)) for i in range(PER_LABEL)]
               for label in LABELS}
    if longer:
        label, index = CHANGED
        records[label][index] = " ".join([records[label][index]] * 10)
    return records


def _public_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("dpcore.fewshot.generation")]


def test_public_stats_progress_and_logs_do_not_depend_on_record_lengths(tiny_lm, caplog):
    from dpcore.fewshot.generation import generate_demos

    spec = load_task_spec("agnews")
    config = GenerationConfig(num_subsets=3, subset_size=3, top_k=20, max_tokens=4)
    outputs = []
    for longer in (False, True):
        caplog.clear()
        progress: list[dict] = []
        with caplog.at_level(logging.DEBUG, logger="dpcore.fewshot.generation"):
            result = generate_demos(tiny_lm, spec, _records(longer), config, 20.0, seed=11, progress=progress.append)
        outputs.append((result, progress, _public_log(caplog)))
    (first, progress_a, log_a), (second, progress_b, log_b) = outputs
    # The DP outputs agree, and so does everything public ...
    assert [d.text for d in first.demos] == [d.text for d in second.demos]
    assert first.stats == second.stats
    public = [[{k: v for k, v in info.items() if k != "private"} for info in p] for p in (progress_a, progress_b)]
    assert public[0] == public[1] and len(public[0]) == first.stats["steps"]
    assert log_a == log_b and log_a and not any("token" in line for line in log_a)
    # ... although the private counters see the longer record.
    from dpcore.fewshot.generation import PUBLIC_STATS

    assert set(first.stats) == set(PUBLIC_STATS)
    assert first.stats["demos"] == len(LABELS) and first.stats["synthetic_tokens"] > 0
    assert second.private_stats["prompt_tokens"] > first.private_stats["prompt_tokens"]
    assert second.private_stats["batching"]["forward_tokens"] > first.private_stats["batching"]["forward_tokens"]


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model-side-channel")
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    return folder


def _user_dataset(folder: Path, longer: bool) -> tuple[Path, Path]:
    """(data CSV, task YAML) of a small user dataset (a tenth held out as the test split); with `longer`,
    one training record of the first label is ten times longer."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"r{label[:2]}{i:02d}", "text": text, "label": label}
            for label, texts in _records(False).items() for i, text in enumerate(texts)]
    frame = pd.DataFrame(rows)
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="side-channel", split={"test_size": 0.1, "seed": 0},
                source={"type": "file", "path": str(folder / "data.csv"), "text_column": "text",
                        "label_column": "label", "id_column": "id"})
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    if longer:  # a record of the training split (the split is a keyed hash of the ids: it does not move)
        from dpcore.data.datasets import record_split

        train, _ = record_split(frame, 0.1, 0, "test", "split.test_size")
        changed = train[train["label"] == LABELS[0]]["id"].iloc[0]
        frame.loc[frame["id"] == changed, "text"] = " ".join([frame.loc[frame["id"] == changed, "text"].iloc[0]] * 10)
    frame.to_csv(folder / "data.csv", index=False)
    return folder / "data.csv", folder / "task.yaml"


# Fields that legitimately differ between the two runs: where they wrote, the ledger identity we gave them,
# the content hash (it identifies the dataset version by design).
RUN_SPECIFIC = ("run_id", "out", "content_hash", "ledger_entry")


def test_cli_generate_public_outputs_are_identical_for_neighbouring_datasets(tiny_model_dir, tmp_path, cli,
                                                                            caplog, dpicl_home):
    reports, texts, logs, private = [], [], [], []
    for longer in (False, True):
        name = "longer" if longer else "base"
        data, task = _user_dataset(tmp_path / name, longer)
        out = tmp_path / f"out-{name}"
        caplog.clear()
        with caplog.at_level(logging.INFO):
            code, stdout, stderr = cli(
                ["generate", "--task-spec", str(task), "--data-path", str(data),
                 "--dataset-id", f"side-channel-{name}", "--epsilon", "1", "--model", str(tiny_model_dir),
                 "--num-subsets", "3", "--subset-size", "3", "--top-k", "20", "--max-tokens", "4", "--seed", "5",
                 "--out", str(out), "--json"])
        assert code == 0, stderr
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
        texts.append(json.loads((out / "generation.json").read_text()))
        logs.append(_public_log(caplog))
        found = [p for p in (dpicl_home / "private" / "runs").rglob("generation_stats.json")
                 if p.parent.name == out.name]
        private.append(json.loads(found[0].read_text()) if len(found) == 1 else None)
        assert set(pd.read_parquet(out / "demos.parquet")["text"]) == {d["text"] for d in reports[-1]["demos"]}

    # The --json report, generation.json and the log lines are identical ...
    for pair in (reports, texts):
        a, b = ({k: v for k, v in r.items() if k not in RUN_SPECIFIC} for r in pair)
        assert a == b
        assert "private_stats" not in a and "prompt_tokens" not in json.dumps(a)
    assert logs[0] == logs[1]
    assert reports[0]["stats"]["synthetic_tokens"] == sum(d["tokens"] for d in reports[0]["demos"])
    assert "wall_seconds" not in reports[0] and "wall_seconds" not in texts[0]  # a timing of the records' work
    # ... while the private counters (private store only) differ: the longer record was sampled.
    assert private[1]["private_stats"]["prompt_tokens"] > private[0]["private_stats"]["prompt_tokens"]


# --------------------------------------------------------------------------- the pipeline's generate task


def _private_records(folder: Path, longer: bool) -> Path:
    from dpcore.data.artifacts import write_table

    rows = [{"split": "train", "id": f"{label}-{i}", "text": text, "label": label}
            for label, texts in _records(longer).items() for i, text in enumerate(texts)]
    return write_table(pd.DataFrame(rows), folder / "records.parquet")


@pytest.mark.usefixtures("prefect_harness")
class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_generate_task_result_and_logs_are_identical_for_neighbouring_datasets(tiny_lm):
    from prefect import flow

    from dpcore.home import private_dir
    from tasks import generate as generate_stage

    share_tiny_model(tiny_lm)
    config = GenerationConfig(num_subsets=3, subset_size=3, top_k=20, max_tokens=4)

    @flow(name="side-channel-generate")
    def one(records_path: str, data_hash: str):
        return generate_stage.generate(
            records_path=records_path, data_hash=data_hash, task_spec="agnews", method="tang", label="World",
            epsilon=1.0, noise_multiplier=20.0, generation=config, model="tiny-random", seed=3,
            noise_scope="seed:3", noise_charged=True)  # a stage called alone: nothing charged to replay

    results, logs = [], []
    for longer in (False, True):
        folder = private_dir() / "tests" / "side-channel" / ("longer" if longer else "base")
        records = _private_records(folder, longer)
        # The task's and the engine's log records, less the clock time. A handler on the two loggers
        # themselves: starting a flow may re-run Prefect's logging set-up, which replaces root handlers.
        captured = _Collect()
        watched = [logging.getLogger("prefect.task_runs"), logging.getLogger("dpcore.fewshot.generation")]
        for logger in watched:
            logger.addHandler(captured)
        try:
            results.append(one(str(records), ("b" if longer else "a") * 64))
        finally:
            for logger in watched:
                logger.removeHandler(captured)
        logs.append([r.getMessage() for r in captured.records
                     if r.name.startswith("dpcore.fewshot.generation")
                     or "generate-" in str(getattr(r, "task_run_name", ""))])
    results = [r.model_dump() for r in results]  # the task's result: a `tasks.generate.Shard`
    assert pd.read_parquet(results[0]["path"])["text"].tolist() == pd.read_parquet(results[1]["path"])["text"].tolist()
    varying = ("key", "path", "private_stats_path", "worker")
    a, b = ({k: v for k, v in r.items() if k not in varying} for r in results)
    assert a == b and not {"forward_tokens_per_s", "prompt_tokens", "prompts"} & set(results[0])
    assert logs[0] == logs[1] and any("demos done" in line for line in logs[0])
    assert "seconds" not in results[0]  # the wall time depends on the groups' lengths: private stats only
    # The record-dependent counters are kept, in the private store.
    stats = [json.loads(Path(r["private_stats_path"]).read_text()) for r in results]
    assert stats[1]["private_stats"]["prompt_tokens"] > stats[0]["private_stats"]["prompt_tokens"]
    assert all(Path(r["private_stats_path"]).is_relative_to(private_dir()) for r in results)
