"""The privacy boundary: after pipeline runs (DP few-shot generation and PromptPATE), no private training text appears anywhere under $DPICL_HOME
outside the private store (except the Prefect and MLflow databases), nor in the run's logs, Prefect
artifacts, task-run state messages or MLflow params/tags.

Nor does any per-record function of private data: no id of a private record (training or test split,
both from the user's private file) appears there as a whole token, no public Parquet table has a
per-record column (ids, membership bits, scores, label probabilities, gold labels), and no public JSON
(Prefect results, --json, generation reports) holds a generation counter that depends on the records'
lengths (prompt/forward/padded tokens, prompt counts, tokens/s).

Files are decoded before the search: Parquet cells (strings and lists of strings), JSON strings
(recursively, also JSON inside JSON: Prefect's persisted results), other files as UTF-8 bytes. The
converted model's weight files (public: a function of the shipped GGUF alone) are skipped.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import (
    home,
    mini_agnews,
    prefect_harness,  # noqa: F401  (the shared harness fixture)
    share_tiny_model,
    tiny_config,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

MIN_LENGTH = 20
DATABASE_SUFFIXES = (".db", ".db-wal", ".db-shm", ".db-journal")
# Columns that hold one value per private record (test item or audited record).
PER_RECORD_COLUMNS = frozenset({"id", "ids", "record_id", "test_id", "demo_ids", "member", "membership", "score",
                                "scores", "label_probs", "calibrated_probs", "probability", "probabilities", "gold",
                                "pred_raw", "pred_calibrated", "correct_raw", "correct_calibrated"})
# Generation counters that depend on the sampled records' lengths (or on the sample itself).
RECORD_DEPENDENT_KEYS = frozenset({"prompt_tokens", "forward_tokens", "padded_tokens", "forward_tokens_per_s",
                                   "prompts", "prefix_tokens_reused", "tokens_per_s", "forward_seconds"})
TOKEN = re.compile(r"[\w.:/-]+")


def _needles() -> list[str]:
    """Private train texts of >= 20 characters that do not also occur inside a public test text."""
    _, _, private, public = mini_agnews()
    public_blob = "\n".join(public)
    return sorted(t for t in private if len(t) >= MIN_LENGTH and t not in public_blob)


def _strings(value):
    if isinstance(value, str):
        yield value
        stripped = value.strip()
        if stripped[:1] in "[{" and len(stripped) > 1:
            try:
                yield from _strings(json.loads(stripped))
            except ValueError:
                pass
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif hasattr(value, "tolist"):
        yield from _strings(value.tolist())
    elif value is not None:
        yield str(value)


def _file_text(path: Path) -> str:
    data = path.read_bytes()
    parts = [data.decode("utf-8", errors="ignore")]
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        parts += [s for column in frame.columns for cell in frame[column] for s in _strings(cell)]
    else:
        try:
            parts += list(_strings(json.loads(data)))
        except ValueError:
            pass
    return "\n".join(parts)


def _scanned_files(root: Path) -> list[Path]:
    private = root / "private"
    out = []
    for path in root.rglob("*"):
        if not path.is_file() or path.is_relative_to(private):
            continue
        if path.name.endswith(DATABASE_SUFFIXES) and path.name.startswith(("prefect", "mlflow")):
            continue  # the Prefect and MLflow databases
        if path.suffix == ".safetensors" and "models" in path.relative_to(root).parts:
            continue  # public model weights: a function of the shipped GGUF alone
        out.append(path)
    return out


def _leaks(text: str, needles: list[str]) -> list[str]:
    return [n[:12] + "..." for n in needles if n in text]  # report a prefix only


def _id_leaks(text: str, ids: set[str]) -> list[str]:
    """Private record ids found as whole tokens (Parquet cells of any type are decoded to text first)."""
    found = set()
    for token in TOKEN.findall(text):
        for part in {token, *token.split("/")}:
            if part in ids:
                found.add(part)
    return sorted(found)


def _keys(value) -> set[str]:
    """Every key of a JSON value (recursively, also JSON inside JSON strings)."""
    keys: set[str] = set()
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in "[{" and len(stripped) > 1:
            try:
                keys |= _keys(json.loads(stripped))
            except ValueError:
                pass
    elif isinstance(value, dict):
        for key, item in value.items():
            keys.add(str(key))
            keys |= _keys(item)
    elif isinstance(value, list | tuple):
        for item in value:
            keys |= _keys(item)
    return keys


def _per_record_problems(path: Path) -> list[str]:
    """A public file's per-record columns (Parquet) or record-dependent generation counters (JSON)."""
    if path.suffix == ".parquet":
        return sorted(PER_RECORD_COLUMNS & set(pd.read_parquet(path).columns))
    try:
        value = json.loads(path.read_bytes())
    except ValueError:
        return []
    return sorted(RECORD_DEPENDENT_KEYS & _keys(value))


def _is_duration(name: str) -> bool:
    name = name.lower()
    return name == "seconds" or name.endswith("_seconds") or "elapsed" in name or "duration" in name


def _fractional_times(value, key: str = "") -> list[str]:
    """Durations (keys or columns named seconds, *_seconds, *elapsed*, *duration*) with a fractional value,
    anywhere in a JSON value (recursively, also JSON inside JSON strings)."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in "[{" and len(stripped) > 1:
            try:
                return _fractional_times(json.loads(stripped), key)
            except ValueError:
                return []
        return []
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _fractional_times(v, str(k))]
    if isinstance(value, list | tuple):
        return [found for item in value for found in _fractional_times(item, key)]
    if (_is_duration(key) and isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and not float(value).is_integer()):
        return [f"{key}={value}"]
    return []


def _fractional_file_times(path: Path) -> list[str]:
    """A public file's durations that are not whole seconds (Parquet columns, or JSON keys)."""
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        return [found for column in frame.columns for cell in frame[column]
                for found in _fractional_times(cell.tolist() if hasattr(cell, "tolist") else cell, str(column))]
    try:
        return _fractional_times(json.loads(path.read_bytes()))
    except (ValueError, UnicodeDecodeError):
        return []


def test_no_private_text_outside_the_private_store(tiny_lm, capfd, caplog):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.pate import pate_flow
    from flows.pipeline import run_pipeline
    from tasks.tracking import mlflow_client

    share_tiny_model(tiny_lm)
    caplog.set_level(logging.DEBUG)
    # matplotlib's font lookup logs every installed font's score at DEBUG (thousands of lines, each rendered by
    # Prefect's console handler: seconds of CPU); font names hold no record
    caplog.set_level(logging.INFO, logger="matplotlib")
    # A fresh (uncached) run with every stage: its logs are part of what is checked.
    # Every baseline (the non-private ones included): their per-record outputs must stay private too.
    result = run_pipeline(tiny_config(seed=4242, baselines=["zero-shot", "instruction-only", "sigma-zero",
                                                            "random-real"]))
    # ... and a PromptPATE run on the same data (teacher prompts of real records, their votes and vote
    # histograms, the non-private ensemble and best-teacher baselines on the test split)
    pate = pate_flow(config=tiny_config(seed=4242, methods=["pate"], epsilons=[math.inf], pate_teachers=6,
                                        pate_queries=10,
                                        pate_public="ood", pate_sigma1=1.0, pate_sigma2=2.0, pate_repeats=1,
                                        pate_student_candidates=3, test_size=8,
                                        pate_baselines=["zero-shot", "ensemble", "upper-bound"]))
    assert {"teacher_assignments.parquet", "vote_histograms.parquet"} <= {
        p.name for p in Path(pate["private_run_dir"]).iterdir()}
    out, err = capfd.readouterr()
    needles = _needles()
    assert len(needles) > 300  # the check has teeth: the mini dataset's private texts

    private_dir = Path(result["private_run_dir"])
    private_records = pd.read_parquet(private_dir / "records.parquet")
    assert set(needles) <= set(private_records["text"])  # ... and they are in the private store

    root = home()
    files = _scanned_files(root)
    # the scan reaches the public tables and the cached stages' persisted results (Prefect's own result
    # storage is scanned too where an earlier test of the session wrote one)
    assert any(p.suffix == ".parquet" for p in files) and any("stages" in p.parts for p in files)
    assert Path(pate["run_dir"]) / "pate_plan.json" in files  # what `dpicl release --method pate` reads
    leaks = {str(p.relative_to(root)): found for p in files if (found := _leaks(_file_text(p), needles))}
    assert leaks == {}

    assert _leaks(out + err, needles) == []
    assert _leaks(caplog.text, needles) == []

    # Per-record functions of private data: record ids (training and test rows of the private file) ...
    ids = set(private_records["id"].astype(str))
    assert len(ids) == len(private_records) > 400 and (private_records["split"] == "test").any()
    id_leaks = {str(p.relative_to(root)): found[:3] for p in files if (found := _id_leaks(_file_text(p), ids))}
    assert id_leaks == {}
    assert _id_leaks(out + err, ids) == [] and _id_leaks(caplog.text, ids) == []
    # ... per-record columns and record-dependent generation counters
    per_record = {str(p.relative_to(root)): found for p in files if p.suffix in (".parquet", ".json")
                  if (found := _per_record_problems(p))}
    assert per_record == {}
    assert {"predictions.parquet", "mia_scores.parquet"} <= {p.name for p in private_dir.iterdir()}
    # ... and exact timings of work on private records: whole seconds at most in every public file (the run
    # folders' metrics and audit tables, the stages' persisted results, the summaries) and in --json
    timed = {str(p.relative_to(root)): found for p in files if (found := _fractional_file_times(p))}
    assert timed == {}
    assert pd.read_parquet(Path(result["run_dir"]) / "metrics.parquet")["seconds"].notna().all()  # it was checked
    assert _fractional_times(json.loads(json.dumps(result, default=str))) == []
    assert _fractional_times(json.loads(json.dumps(pate, default=str))) == []
    manifest = json.loads((Path(result["run_dir"]) / "manifest.json").read_text())
    assert not {"predictions.parquet", "mia_scores.parquet"} & set(manifest["files"])

    with get_client(sync_client=True) as client:
        flow_filter = FlowRunFilter(id=FlowRunFilterId(any_=[result["flow_run_id"]]))
        artifacts = client.read_artifacts(flow_run_filter=flow_filter)
        task_runs = client.read_task_runs(flow_run_filter=flow_filter)
        flow_run = client.read_flow_run(result["flow_run_id"])
    assert artifacts and task_runs
    texts = [json.dumps(a.data, default=str) if not isinstance(a.data, str) else a.data for a in artifacts]
    texts += [t.state.message or "" for t in task_runs] + [json.dumps(flow_run.parameters, default=str)]
    assert _fractional_times([a.data for a in artifacts]) == []
    assert _leaks("\n".join(texts), needles) == []
    assert _id_leaks("\n".join(texts), ids) == []

    client = mlflow_client()
    for run_id in (result["mlflow_run_id"], pate["mlflow_run_id"]):
        run = client.get_run(run_id)
        logged = json.dumps([run.data.params, run.data.tags, run.data.metrics])
        assert _fractional_times(run.data.metrics) == []
        assert _leaks(logged, needles) == [] and _id_leaks(logged, ids) == []
    assert _leaks(json.dumps(pate, default=str), needles) == [] and _id_leaks(json.dumps(pate, default=str), ids) == []
    run = client.get_run(result["mlflow_run_id"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts and not artifacts & {"predictions.parquet", "mia_scores.parquet", "generation_stats.json"}


def test_the_scan_finds_planted_ids_scores_and_counters(tmp_path):
    """The id, column and counter checks themselves: planted in public-looking files, they are found."""
    ids = {"agnews-1234", "77"}
    path = tmp_path / "planted.parquet"
    pd.DataFrame({"test_id": [1234, 77], "score": [0.1, 0.2]}).to_parquet(path)
    assert _id_leaks(_file_text(path), ids) == ["77"]
    assert _per_record_problems(path) == ["score", "test_id"]
    assert _id_leaks("evaluated agnews-1234/0 and agnews-12345", ids) == ["agnews-1234"]
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"result": json.dumps({"stats": {"prompt_tokens": 1582}})}))
    assert _per_record_problems(result) == ["prompt_tokens"]
    assert _per_record_problems(tmp_path / "planted.parquet") and not _id_leaks("agnews-mini 2.0", ids)


def test_the_scan_finds_fractional_seconds(tmp_path):
    """The timing check itself: exact seconds in a public table or nested JSON are found, whole ones pass."""
    path = tmp_path / "metrics.parquet"
    pd.DataFrame({"seconds": [3, 4], "wall_seconds": [1.0, 2.0], "accuracy": [0.25, 0.5]}).to_parquet(path)
    assert _fractional_file_times(path) == []
    pd.DataFrame({"seconds": [3.0, 4.27], "accuracy": [0.25, 0.5]}).to_parquet(path)
    assert _fractional_file_times(path) == ["seconds=4.27"]
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"result": json.dumps({"rows": [{"elapsed_seconds": 0.5, "n": 2.5}]}),
                                  "seconds_per_100_items": 12.5, "wall_seconds": 7}))
    assert _fractional_file_times(result) == ["elapsed_seconds=0.5"]


def test_the_scan_finds_a_planted_leak(tmp_path):
    """The scanner itself: a private text written into a public Parquet cell (a list) is found."""
    needle = _needles()[0]
    path = tmp_path / "planted.parquet"
    pd.DataFrame({"demo_ids": [["a", needle]], "n": [1]}).to_parquet(path)
    assert _leaks(_file_text(path), [needle]) == [needle[:12] + "..."]
    nested = tmp_path / "result.json"
    nested.write_text(json.dumps({"result": json.dumps({"text": needle.replace('"', "'") + "\u00e9"})}))
    assert _leaks(_file_text(nested), [needle.replace('"', "'")])
