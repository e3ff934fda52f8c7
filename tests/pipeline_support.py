"""Shared set-up of the pipeline tests (test_pipeline, test_dask_runner, test_privacy_boundary).

- one Prefect server per `make test` (`prefect_test_server`: the xdist controller starts it, every worker uses
  it) or, when pytest runs in one process, a `prefect_test_harness` (started on first use, stopped at exit);
- `subprocess_env`: the environment of a `dpicl` subprocess on a fresh home;
- `mini_agnews`: a small user-format AG News dataset (CSV + task YAML), so runs exercise
  the user-data path and stay fast (400 private records, 40 test items);
- `write_hub_task`: a local hub-type source (a folder of Parquet files) and its task YAML;
- `tiny_config`: a RunConfig on the tiny random model sized for seconds per run;
- `standard_run`: one seeded pipeline run with audit, shared by the test files that only read it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import mlflow_store
import pandas as pd
import prefect_test_server
import pytest
import yaml

from dpcore.config import RunConfig
from dpcore.data.taskspec import TASKS_DIR
from dpcore.names import ALL_BASELINES

# tests/conftest.py sets PREFECT_FLOWS_HEARTBEAT_FREQUENCY="" (meant as "off"), which Prefect 3.8.8 cannot
# parse (an int >= 30 or unset): drop it before Prefect builds its settings; heartbeats are switched off below.
if os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") == "":
    del os.environ["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]

_HARNESS = {}
_LOCK = threading.Lock()

PER_LABEL_TRAIN = 100
TEST_ITEMS = 40


def ensure_harness() -> bool:
    """Use the shared harness, or start `prefect_test_harness` for this process (about 20 s); heartbeats
    off either way. True if this call entered it."""
    with _LOCK:
        if "cm" in _HARNESS:
            return False
        from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        stack = contextlib.ExitStack()
        if os.environ.get(prefect_test_server.URL):  # under xdist: the controller's server (conftest)
            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: prefect_test_server.wait_until_ready()}))
        else:
            # imported only here: it imports Prefect's whole server (about 4 s of CPU), which an xdist worker,
            # using the controller's server, never needs
            from prefect.testing.utilities import prefect_test_harness

            stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        _HARNESS["cm"] = stack
        return True


def stop_harness() -> None:
    with _LOCK:
        stack = _HARNESS.pop("cm", None)
    if stack is not None:
        stack.close()


@pytest.fixture(scope="session")
def prefect_harness(request):
    """The shared harness; stopped at the end of the session (while pytest's output capture still works)."""
    if ensure_harness():
        request.addfinalizer(stop_harness)


REPO = Path(__file__).resolve().parent.parent


def subprocess_env(home: Path, *, temporary_prefect_server: bool = False,
                   migrated_prefect_database: bool = False) -> dict:
    """The environment of a `dpicl` subprocess on a fresh `$DPICL_HOME`, the way a user's shell has it (no
    test-session paths). The home gets the session's converted models (conftest: one folder per
    environment), so `tiny-random` or the embedded model is not converted again, and the environment's
    accounting cache (conftest). Flow runs go to the shared test server, or, with `temporary_prefect_server`, to the
    one the CLI starts itself (a fresh machine). With `migrated_prefect_database` that server finds its database
    migrated, as on a machine that has run before (the shared server's, as it started: about 6 s less of
    server start-up; none outside the shared server's session, or when it could not be copied)."""
    home.mkdir(parents=True, exist_ok=True)
    if migrated_prefect_database:
        copy_migrated_prefect_database(home / "prefect" / "prefect.db")
    for shared in ("models", "cache/accounting"):  # conftest: one folder of each per environment
        source = Path(os.environ["DPICL_HOME"]) / shared
        if source.is_dir() and not (home / shared).exists():
            (home / shared).parent.mkdir(parents=True, exist_ok=True)
            (home / shared).symlink_to(source.resolve(), target_is_directory=True)
    mlflow_store.seed(home, Path(sys.prefix) / "dpicl-test-cache")  # conftest: one migrated store per environment
    env = dict(os.environ, DPICL_HOME=str(home), PYTHONPATH=str(REPO))
    dropped = ("PREFECT_HOME", "HF_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "PREFECT_LOGGING_SETTINGS_PATH")
    for key in dropped + (("PREFECT_API_URL",) if temporary_prefect_server else ()):
        env.pop(key, None)
    return env


def ended_task_runs(flow_run_ids, until: Callable[[list], bool] | None = None, timeout: float = 30.0) -> list:
    """The task runs of a flow run (or of a list of them) once there are some, each has ended and `until` holds of
    them, or as they are at `timeout`. Their states reach the server as events after the flow returns, one by one:
    some may be recorded and ended while others are not recorded yet, so a test that looks for a particular task
    run names it in `until`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    ids = list(flow_run_ids) if isinstance(flow_run_ids, list | tuple) else [flow_run_ids]
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
            ended = task_runs and all(t.state is not None and t.state.is_final() for t in task_runs)
            if (ended and (until is None or until(task_runs))) or time.monotonic() > deadline:
                return task_runs
            time.sleep(0.2)


def copy_migrated_prefect_database(target: Path) -> None:
    """Put the shared server's database, as it started (migrated, no run), at `target`; nothing outside the
    shared server's session or when it could not be copied (the server then migrates its own)."""
    if not os.environ.get(prefect_test_server.URL):
        return
    migrated = prefect_test_server.migrated_database()
    if migrated is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated, target)


def share_tiny_model(tiny_lm) -> None:
    """Let the pipeline's model cache reuse the session's tiny model (same weights: seed 0)."""
    from tasks import common

    with common._MODELS_LOCK:
        for device in ("auto", "cpu"):
            common._MODELS[("tiny-random", device, "auto")] = tiny_lm


def write_hub_task(folder: Path, frame: pd.DataFrame, name: str = "hubtask",
                   test_frame: pd.DataFrame | None = None) -> Path:
    """A local hub-type source and its task spec; returns the spec's path (`dpicl run --task-spec SPEC
    --dataset NAME` runs on it, offline, with no --data-path).

    `frame` (columns `text`, `label`, and `id` when the records have ids) is written as the dataset's
    `train` split under `folder/NAME-data/` (a folder of Parquet files `datasets.load_dataset` reads);
    `test_frame`, when given, as its `test` split (the loader merges the splits). The spec is AG News's
    prompts with the frame's labels, each its own verbalizer, and a 0.2 seeded test split."""
    data = folder / f"{name}-data"
    data.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(data / "train.parquet", index=False)
    splits = ["train"]
    if test_frame is not None:
        test_frame.to_parquet(data / "test.parquet", index=False)
        splits.append("test")
    labels = sorted(set(frame["label"]) | (set(test_frame["label"]) if test_frame is not None else set()))
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name=name, description=f"{len(frame)} records from a local hub-type folder (tests)",
                source={"type": "hub", "path": str(data), "splits": splits, "text_column": "text",
                        "label_column": "label", **({"id_column": "id"} if "id" in frame.columns else {})},
                split={"test_size": 0.2, "seed": 0}, labels={str(label): str(label) for label in labels})
    spec_path = folder / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec_path


@functools.cache
def mini_agnews() -> tuple[str, str, frozenset[str], frozenset[str]]:
    """(data_path, task_spec path, private train texts, public test texts) of a 440-record AG News sample."""
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    data = load_dataset(load_task_spec("agnews"))
    parts = [data.train[data.train["label"] == label].head(PER_LABEL_TRAIN) for label in data.labels]
    parts.append(data.test.head(TEST_ITEMS))
    frame = pd.concat(parts, ignore_index=True)[["id", "text", "label"]]
    folder = Path(tempfile.mkdtemp(prefix="dpicl-mini-agnews-"))  # outside $DPICL_HOME
    csv_path = folder / "agnews_mini.csv"
    frame.to_csv(csv_path, index=False)
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="agnews-mini", description="400 AG News records for tests",
                source={"type": "file", "path": str(csv_path), "text_column": "text", "label_column": "label",
                        "id_column": "id"},
                split={"test_size": 0.1, "seed": 0})
    spec_path = folder / "agnews-mini.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    # The split of the CSV is re-drawn by the loader: read it back to know which texts are private.
    loaded = load_dataset(load_task_spec(str(spec_path)), str(csv_path))
    return (str(csv_path), str(spec_path), frozenset(loaded.train["text"]), frozenset(loaded.test["text"]))


def tiny_config(**overrides) -> RunConfig:
    data_path, spec_path, _, _ = mini_agnews()
    values = dict(
        dataset="agnews-mini", data_path=data_path, task_spec=spec_path, model="tiny-random",
        epsilons=[2.0], num_subsets=2, subset_size=1, top_k=20, max_tokens=4, shots=4, seeds=2, test_size=12,
        # the audit scores each record's first 8 tokens: these runs check the pipeline, not the audit's power
        audit=True, audit_trials=2, audit_demo_sets=1, audit_members=5, audit_max_record_tokens=8, seed=123,
        baselines=list(ALL_BASELINES),  # every comparison row (the non-private ones are opt-in, charged as inf)
        audit_reference=True,  # the non-private reference audit too (opt-in, charged as inf)
    )
    values.update(overrides)
    return RunConfig(**values)


@functools.cache
def standard_run() -> dict:
    """One seeded run with the audit on (shared by the test files that only inspect its outputs)."""
    from flows.pipeline import run_pipeline

    return run_pipeline(tiny_config())


def home() -> Path:
    return Path(os.environ["DPICL_HOME"])
