"""The privacy boundary: after pipeline runs, no private training text appears anywhere under $DPICL_HOME
outside the private store (except the Prefect and MLflow databases), nor in the run's logs, Prefect
artifacts, task-run state messages or MLflow params/tags.

Files are decoded before the search: Parquet cells (strings and lists of strings), JSON strings
(recursively, also JSON inside JSON: Prefect's persisted results), other files as UTF-8 bytes. The
converted model's weight files (public, written before any private record is read) are skipped.
"""

from __future__ import annotations

import json
import logging
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
            continue  # public model weights, converted before any private data is read
        out.append(path)
    return out


def _leaks(text: str, needles: list[str]) -> list[str]:
    return [n[:12] + "..." for n in needles if n in text]  # report a prefix only


def test_no_private_text_outside_the_private_store(tiny_lm, capfd, caplog):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.pipeline import run_pipeline
    from tasks.record import mlflow_client

    share_tiny_model(tiny_lm)
    caplog.set_level(logging.DEBUG)
    # A fresh (uncached) run with every stage: its logs are part of what is checked.
    result = run_pipeline(tiny_config(seed=4242))
    out, err = capfd.readouterr()
    needles = _needles()
    assert len(needles) > 300  # the check has teeth: the mini dataset's private texts

    private_dir = Path(result["private_run_dir"])
    private_records = pd.read_parquet(private_dir / "records.parquet")
    assert set(needles) <= set(private_records["text"])  # ... and they are in the private store

    root = home()
    files = _scanned_files(root)
    assert any(p.suffix == ".parquet" for p in files) and any("storage" in p.parts for p in files)
    leaks = {str(p.relative_to(root)): found for p in files if (found := _leaks(_file_text(p), needles))}
    assert leaks == {}

    assert _leaks(out + err, needles) == []
    assert _leaks(caplog.text, needles) == []

    with get_client(sync_client=True) as client:
        flow_filter = FlowRunFilter(id=FlowRunFilterId(any_=[result["flow_run_id"]]))
        artifacts = client.read_artifacts(flow_run_filter=flow_filter)
        task_runs = client.read_task_runs(flow_run_filter=flow_filter)
        flow_run = client.read_flow_run(result["flow_run_id"])
    assert artifacts and task_runs
    texts = [json.dumps(a.data, default=str) if not isinstance(a.data, str) else a.data for a in artifacts]
    texts += [t.state.message or "" for t in task_runs] + [json.dumps(flow_run.parameters, default=str)]
    assert _leaks("\n".join(texts), needles) == []

    run = mlflow_client().get_run(result["mlflow_run_id"])
    assert _leaks(json.dumps([run.data.params, run.data.tags]), needles) == []


def test_the_scan_finds_a_planted_leak(tmp_path):
    """The scanner itself: a private text written into a public Parquet cell (a list) is found."""
    needle = _needles()[0]
    path = tmp_path / "planted.parquet"
    pd.DataFrame({"demo_ids": [["a", needle]], "n": [1]}).to_parquet(path)
    assert _leaks(_file_text(path), [needle]) == [needle[:12] + "..."]
    nested = tmp_path / "result.json"
    nested.write_text(json.dumps({"result": json.dumps({"text": needle.replace('"', "'") + "\u00e9"})}))
    assert _leaks(_file_text(nested), [needle.replace('"', "'")])
