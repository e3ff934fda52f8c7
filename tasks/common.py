"""Plumbing shared by the pipeline's Prefect tasks: run folders, cache keys, seeds, the model cache.

Rules every task follows (the privacy boundary):
- a task RESULT (what Prefect persists, `RESULT_RECORD` in the public stage folder) holds only paths,
  ids, public configuration, DP outputs and aggregates, never a private record;
- private tables are written only under `$DPICL_HOME/private/`;
- log lines carry counts, hashes and parameters, never a record's text.

Cached tasks write their outputs once into a content-addressed stage folder
(`$DPICL_HOME/cache/stages/<stage>/<key>/`, or `$DPICL_HOME/private/cache/stages/...`
for private outputs) whose name is the task's cache key; the flow then copies them
into the run folder with `publish`. So a cache hit (a retried flow, an unchanged
re-run with the same seed) costs a file copy, and never draws new noise. Prefect
keeps the cached result (`RESULT_RECORD`) inside that same public folder: removing a
stage's folder removes its cache entry, and Prefect's own caching runs the stage again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache, wraps
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from dpcore.data.artifacts import write_bytes_atomic
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import DpiclError, RunStopped
from dpcore.home import dpicl_home, is_private_path, private_dir

# Bump to invalidate every cached stage result (a change of the stage-folder layout).
CACHE_LAYOUT_VERSION = "3"  # 3: typed stage results (Shard, FewShotPlan); 2: per-record tables moved to private folders
# Model names resolved here (not in dpcore.lm.model): a tiny randomly initialised Llama for tests and smoke runs.
TINY_MODEL_NAMES = frozenset({"tiny-random", "tiny-random-llama"})
REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- run folders


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(text)) or "_"


@dataclass(frozen=True)
class RunPaths:
    """Where one run's files live: public tables and the private store's counterpart."""

    dataset: str
    data_hash: str
    run_id: str
    public: Path
    private: Path


def run_paths(dataset: str, data_hash: str, run_id: str) -> RunPaths:
    """`$DPICL_HOME/runs/<dataset>/<hash12>/<run-id>/` and `$DPICL_HOME/private/runs/<same>/`."""
    relative = Path(safe_name(dataset)) / data_hash[:12] / safe_name(run_id)
    public = dpicl_home() / "runs" / relative
    private = private_dir() / "runs" / relative
    public.mkdir(parents=True, exist_ok=True)
    private.mkdir(parents=True, exist_ok=True)
    return RunPaths(dataset, data_hash, run_id, public, private)


class Ingested(BaseModel):
    """A run's ingested data as every flow and stage reads it (`tasks.ingest.ingest`): the dataset's public
    identity and counts, the private `records` table's path and the run's folders, never a record.

    A pydantic model: subflows take it as a parameter, which Prefect validates against the type hint and
    records JSON-encoded; frozen, so a subflow reads what its pipeline ingested."""

    model_config = ConfigDict(frozen=True)

    dataset: str
    task_spec: str  # the task spec as the run named it (a shipped task's name or a YAML path)
    kind: str
    data_hash: str
    source: str
    labels: tuple[str, ...]
    num_private_records: int
    num_test: int
    records_path: str
    paths: RunPaths


def stages_root(private: bool = False) -> Path:
    """Where the cached stages' folders live (public, or in the private store)."""
    return (private_dir() if private else dpicl_home()) / "cache" / "stages"


def stage_path(stage: str, key: str, private: bool = False) -> Path:
    """The content-addressed folder of one cached stage result (not created)."""
    return stages_root(private) / safe_name(stage) / key


def stage_dir(stage: str, key: str, private: bool = False) -> Path:
    """The content-addressed folder of one cached stage result, created."""
    path = stage_path(stage, key, private)
    path.mkdir(parents=True, exist_ok=True)
    return path


def publish(source: str | Path, folder: Path, name: str | None = None) -> Path:
    """Copy a stage output into a run folder (atomically). A private file only goes to a private folder."""
    source = Path(source)
    if is_private_path(source) and not is_private_path(folder):
        raise PermissionError(f"{source.name}: a private stage output may only be published into the private store")
    return write_bytes_atomic(Path(folder) / (name or source.name), source.read_bytes())


# --------------------------------------------------------------------------- hashing, keys, seeds


def canonical(value: Any) -> Any:
    """JSON-ready canonical form (pydantic models dumped, floats made exact, inf spelled out)."""
    if hasattr(value, "model_dump"):
        return canonical(value.model_dump(mode="python"))
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple | set | frozenset):
        items = [canonical(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return value.hex()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):
        return canonical(value.item())
    return value


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(canonical(value), sort_keys=True).encode("utf-8")).hexdigest()


@cache
def module_fingerprint(*module_names: str) -> str:
    """sha256 over the source of the dpcore modules a stage runs: a code change invalidates its cache."""
    hasher = hashlib.sha256(CACHE_LAYOUT_VERSION.encode())
    for name in module_names:
        path = REPO_ROOT / (name.replace(".", "/") + ".py")
        hasher.update(name.encode())
        hasher.update(path.read_bytes() if path.exists() else b"<missing>")
    return hasher.hexdigest()[:16]


def stage_key(stage: str, fields: dict[str, Any], modules: tuple[str, ...] = ()) -> str:
    """The cache key of a stage: its name, the code it runs and its public inputs (data hash, stage config)."""
    return f"{safe_name(stage)}-{digest({'stage': stage, 'code': module_fingerprint(*modules), 'fields': fields})[:32]}"


# Prefect's persisted result of a cached stage, inside the stage's public folder (see the module docstring).
RESULT_RECORD = "prefect-result.json"


def result_record(stage: str, key: str) -> Path:
    return stage_path(stage, key) / RESULT_RECORD


def cache_key_on(stage: str, names: tuple[str, ...], modules: tuple[str, ...] = (), private_outputs: bool = False):
    """A Prefect `cache_key_fn` hashing the named task parameters (nothing else) with the stage code.

    The key it returns is the path of the result record inside the stage's folder (relative to
    `stages_root()`, the tasks' result storage), so the record goes wherever the stage's public
    outputs go. A stage with `private_outputs` also writes to its private folder: when that folder
    is gone (the private store was cleared) the record is dropped too, so the cache misses and the
    stage runs again rather than answering with paths to files that no longer exist.
    The parameters named here must be public: paths, hashes, configuration, seeds, run ids.
    """

    def key_fn(context, parameters: dict[str, Any]) -> str:
        key = stage_key(stage, {name: parameters.get(name) for name in names}, modules)
        record = result_record(stage, key)
        if private_outputs and not stage_path(stage, key, private=True).exists():
            record.unlink(missing_ok=True)
        return record.relative_to(stages_root()).as_posix()

    key_fn.__name__ = f"cache_key_{safe_name(stage)}"
    return key_fn


def derive_seed(run_seed: int | None, *parts: Any) -> int | None:
    """A per-task seed from the run seed: the same (label, epsilon) gets the same stream on any runner.

    None stays None: the noise is then drawn from a cryptographically seeded generator.
    """
    if run_seed is None:
        return None
    raw = hashlib.sha256(json.dumps(canonical([int(run_seed), *parts])).encode()).digest()
    return int.from_bytes(raw[:8], "little") >> 1  # 63 bits: fits numpy, torch and SQLite integers


def noise_scope(run_seed: int | None, run_id: str) -> str:
    """What a noise-drawing stage's cache is scoped to.

    With a fixed seed the noise is a function of the inputs, so any run may reuse it
    (an unchanged re-run is cheap). With cryptographic noise only the same run (a retry
    of the same flow run) may reuse what it already drew; a new run draws fresh noise.
    """
    return f"seed:{run_seed}" if run_seed is not None else f"run:{run_id}"


# --------------------------------------------------------------------------- progress and stopping

# (what, done, total): a stage's progress, public counters only. The CLI of this process installs
# its progress display here; a remote worker has none (its log lines remain).
ProgressSink = Callable[[str, int, int, str], None]  # (what, done, total, detail)
_PROGRESS_SINKS: list[ProgressSink] = []
# Set by the CLI on Ctrl-C / SIGTERM: every stage stops at its next progress report.
STOP_REQUESTED = threading.Event()


def add_progress_sink(sink: ProgressSink) -> None:
    _PROGRESS_SINKS.append(sink)


def remove_progress_sink(sink: ProgressSink) -> None:
    if sink in _PROGRESS_SINKS:
        _PROGRESS_SINKS.remove(sink)


def stop_requested() -> bool:
    """Whether a stop was asked for (the `should_stop` that dpcore's long loops, the audit's forward passes,
    ask between steps): they end with `RunStopped` as `report_progress` does."""
    return STOP_REQUESTED.is_set()


def report_progress(what: str, done: int, total: int, detail: str = "") -> None:
    """A stage's progress (steps, items, trials: public counts, and an optional `detail` of public
    aggregates such as a validation loss), and the point where it stops when asked."""
    if STOP_REQUESTED.is_set():
        raise RunStopped(f"{what}: stopped on request at {done}/{total}")
    for sink in list(_PROGRESS_SINKS):
        sink(what, int(done), int(total), detail)


# --------------------------------------------------------------------------- retries


def transient_only(task, task_run, state) -> bool:
    """Prefect `retry_condition_fn`: retry unexpected failures, not user errors (bad config/data/budget)."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # the result itself could not be read: treat as transient
        return True
    return not isinstance(exc, DpiclError | PermissionError)


RETRIES = 2
RETRY_DELAY_SECONDS = 1


# --------------------------------------------------------------------------- stopped runs

STOPPED = "stopped on request"  # how a stopped run's Cancelled state begins


def sigterm_stop() -> RunStopped:
    """The stop that SIGTERM asks for (Prefect raises it as `TerminationSignal` in the thread running a flow)."""
    return RunStopped("SIGTERM: the running stages ended at their next step")


def stopped_state(stop: RunStopped):
    """Prefect's Cancelled state for a run a stop request ended, with the stop's message; the stop itself is its
    data, so that a caller's `.result()` raises it again."""
    from prefect.states import Cancelled

    return Cancelled(message=f"{STOPPED}: {stop}", data=stop)


def stop_of(exc: BaseException) -> RunStopped | None:
    """The stop request `exc` stands for (a stage's `RunStopped`; SIGTERM's `TerminationSignal`; the
    `CancelledRun` of a cancelled run whose state carries no exception), else None."""
    if isinstance(exc, RunStopped):
        return exc
    from prefect.exceptions import CancelledRun, TerminationSignal

    if isinstance(exc, TerminationSignal):
        return sigterm_stop()
    if isinstance(exc, CancelledRun):
        return RunStopped(str(exc).removeprefix(f"{STOPPED}: ") or STOPPED)
    return None


def _ends_cancelled_on_stop(fn):
    """`fn` as a task's function: a stop request that ends it (its `RunStopped`, or SIGTERM's `TerminationSignal`
    when it runs in the flow's thread), or that came before it began, ends its task run Cancelled instead of
    Failed or Crashed, and leaves no cached result (a resumed run runs it again); a genuine error still
    raises (Failed). Called as a plain function (`task.fn(...)`), it raises the stop as it is."""

    @wraps(fn)
    def stage(*args, **kwargs):
        from prefect.context import TaskRunContext
        from prefect.exceptions import TerminationSignal
        from prefect.transactions import get_transaction

        context = TaskRunContext.get()
        if context is None or context.task.fn is not stage:
            return fn(*args, **kwargs)
        try:
            if stop_requested():  # (not the Event itself: a Dask runner pickles this function, not its module)
                raise RunStopped(f"{context.task.name}: {STOPPED} before it began")
            return fn(*args, **kwargs)
        except (RunStopped, TerminationSignal) as exc:
            transaction = get_transaction()
            if transaction is not None:
                transaction.write_on_commit = False
            return stopped_state(stop_of(exc))

    return stage


@cache
def _stoppable_task_class():
    from prefect import Task
    from prefect.states import State, get_state_exception

    class StoppableTask(Task):
        """A Prefect task (`stoppable_task`) whose run a stop request ends Cancelled: called directly, it raises
        the stop (`RunStopped`) as its function did; a mapped call's `.result()` does too."""

        def __call__(self, *args, return_state: bool = False, wait_for=None, **kwargs):
            out = super().__call__(*args, return_state=return_state, wait_for=wait_for, **kwargs)
            if not return_state and isinstance(out, State) and out.is_cancelled():
                exc = get_state_exception(out)
                raise stop_of(exc) or exc
            return out

    return StoppableTask


def stoppable_task(**options):
    """`prefect.task(**options)`, except that a stop request (Ctrl-C, SIGTERM: `STOP_REQUESTED`, which the stage
    sees as `RunStopped` at its next step) ends the task run in Prefect's Cancelled state with the stop's message
    rather than Failed or Crashed; its caller still gets the `RunStopped`."""

    def decorate(fn):
        return _stoppable_task_class()(fn=_ends_cancelled_on_stop(fn), **options)

    return decorate


def cached_task(name: str, key_fields: tuple[str, ...], modules: tuple[str, ...] = (), *,
                private_outputs: bool = False, **options):
    """A Prefect task whose JSON result is persisted under its cache key (`cache_key_on(name, key_fields,
    modules)`: public parameters and the dpcore code it runs), in its stage folder, retried on transient
    failures only. `private_outputs`: the stage also writes to its private folder (`stage_dir(...,
    private=True)`) on every run. A stop request ends it Cancelled (`stoppable_task`), with no cached result.

    The result storage is `stages_root()` as this process starts, like Prefect's own PREFECT_HOME.
    """
    return stoppable_task(name=name, cache_key_fn=cache_key_on(name, key_fields, modules, private_outputs),
                          persist_result=True, result_storage=stages_root(), result_serializer="json",
                          retries=RETRIES, retry_delay_seconds=RETRY_DELAY_SECONDS, retry_condition_fn=transient_only,
                          **options)


def uncached_task(name: str, **options):
    """A Prefect task that runs every time (its result is not persisted), retried on transient failures only; a stop
    request ends it Cancelled (`stoppable_task`)."""
    from prefect.cache_policies import NO_CACHE

    return stoppable_task(name=name, cache_policy=NO_CACHE, persist_result=False, retries=RETRIES,
                          retry_delay_seconds=RETRY_DELAY_SECONDS, retry_condition_fn=transient_only, **options)


def stage_logger():
    """The running Prefect task's logger; outside a task run (a CLI command calling a stage's function
    directly), the `dpicl` logger."""
    from prefect.exceptions import MissingContextError

    try:
        from prefect import get_run_logger

        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("dpicl.stage")


# --------------------------------------------------------------------------- versions


@lru_cache(maxsize=1)
def code_version() -> str:
    """`git describe --always --dirty` of the checkout, else the installed dpicl version."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"], cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=10, check=True,
        )
        if out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"dpicl-{metadata.version('dpicl')}"
    except metadata.PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- the model cache


_MODELS: dict[tuple[str, str, str], Any] = {}
_MODELS_LOCK = threading.Lock()


def language_model(name: str, device: str = "auto", dtype: str = "auto"):
    """One `LanguageModel` per (name, device, dtype) per process (threads share it; Dask workers load their own).

    `tiny-random` selects `LanguageModel.tiny_random(seed=0)`: a randomly initialised tiny Llama
    on the embedded tokenizer cut to its first words (`dpcore.lm.models.TINY_VOCABULARY`), for tests and smoke runs.
    """
    from dpcore.lm.model import LanguageModel

    key = (name, device, dtype)
    with _MODELS_LOCK:
        if key not in _MODELS:
            if name in TINY_MODEL_NAMES:
                _MODELS[key] = LanguageModel.tiny_random(seed=0, device="cpu" if device == "auto" else device)
            else:
                _MODELS[key] = LanguageModel.load(name, device=device, dtype=dtype)
        return _MODELS[key]


def open_stage(stage: str, parameters: dict[str, Any], key_fields: tuple[str, ...], modules: tuple[str, ...],
               *, task_spec: str, model: str, device: str = "auto", dtype: str = "auto") -> tuple[str, Any, Any]:
    """What every model stage starts with: (its cache key from the named `parameters`, the task spec,
    the language model)."""
    key = stage_key(stage, {name: value for name, value in parameters.items() if name in key_fields}, modules)
    return key, load_task_spec(task_spec), language_model(model, device, dtype)
