"""What every flow runs its stages with: the task runner a run names (`RunConfig.task_runner`), entered
so that a stop reaches every running stage; mapped calls of a task; a run id stable across retries; and
`cancelled_on_stop`, which ends a flow run that a stop request (Ctrl-C, SIGTERM) cut short in Prefect's
Cancelled state rather than Failed or Crashed, as `tasks.common.stoppable_task` does its stages' task runs.

The pipeline (`flows.pipeline`) and every method's subflow (`flows.tang`, `flows.pate`, `flows.tune`, ...: the
registry's `MethodFlow`s) share them, so that a subflow runs the way the pipeline does.
"""

from __future__ import annotations

import functools
import inspect
import os
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime

from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from dpcore.errors import ConfigError, RunStopped
from dpcore.flags import flag
from tasks.common import STOP_REQUESTED, stop_of, stopped_state


def make_task_runner(spec: str = "threads"):
    """`threads` | `threads:N` | `dask` | `dask:N` (a LocalCluster of N worker processes) | a scheduler address."""
    spec = (spec or "threads").strip()
    if spec == "threads" or spec.startswith("threads:"):
        workers = int(spec.split(":", 1)[1]) if ":" in spec else None
        if workers is None and not os.environ.get("PREFECT_TASK_RUNNER_THREAD_POOL_MAX_WORKERS"):
            # Model forwards already use every core: more threads than cores only contend.
            workers = max(2, min(8, os.cpu_count() or 2))
        return ThreadPoolTaskRunner(max_workers=workers)
    from prefect_dask import DaskTaskRunner  # the optional dask extra: loaded only when a run asks for Dask

    if spec == "dask" or spec.startswith("dask:"):
        workers = int(spec.split(":", 1)[1]) if ":" in spec else 2
        return DaskTaskRunner(
            cluster_class="distributed.LocalCluster",
            cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                            "dashboard_address": None},
        )
    if "://" in spec or ":" in spec:
        return DaskTaskRunner(address=spec)
    raise ConfigError(f"{flag('task_runner')}: {spec!r} is not threads, dask, dask:N or a Dask scheduler address")


@contextmanager
def running(spec: str = "threads"):
    """`make_task_runner(spec)`, entered. A flow body cut short by a stop (SIGTERM, which Prefect turns into
    `TerminationSignal`; Ctrl-C's `KeyboardInterrupt`; a stage's `RunStopped`) asks every stage still running
    to stop at its next step (`tasks.common.STOP_REQUESTED`) before the runner waits for them on the way out:
    otherwise it would wait for the longest of them (the audit's scoring) to finish. The stages already started
    end there, Cancelled (`tasks.common.stoppable_task`); those not started yet never start. A flag set here is
    cleared once they have stopped (a later run in this process starts afresh)."""
    runner = make_task_runner(spec)
    entered = runner.__enter__()
    try:
        yield entered
    except BaseException as exc:
        stop = isinstance(exc, RunStopped) or not isinstance(exc, Exception)
        ours = stop and not STOP_REQUESTED.is_set()
        if ours:
            STOP_REQUESTED.set()
        try:
            if stop:
                _let_started_stages_stop(runner)
            if not runner.__exit__(type(exc), exc, exc.__traceback__):
                raise
        finally:
            if ours:
                STOP_REQUESTED.clear()
    else:
        runner.__exit__(None, None, None)


def _let_started_stages_stop(runner) -> None:
    """Wait for the thread runner's started stages to stop (at their next step), the ones not started yet
    dropped, before the runner's own exit: that exit cancels every stage in flight, and Prefect marks one that
    was starting just then Crashed. (A Dask runner's stages run elsewhere; its exit waits for them.)"""
    executor = getattr(runner, "_executor", None) if isinstance(runner, ThreadPoolTaskRunner) else None
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)


def cancelled_on_stop(body):
    """Decorate a flow's body (under `@flow`): a stop request that ends it (a stage's `RunStopped`; SIGTERM,
    which Prefect raises in the flow as `TerminationSignal`) ends the flow run in Prefect's Cancelled state,
    with the stop's message, instead of Failed or Crashed; the caller (the CLI, a parent flow) still gets the
    `RunStopped` (exit 130). A subflow stopped this way stops its parent the same way, and so does a stage
    (`tasks.common.stoppable_task`) whose run the stop ended Cancelled."""

    @functools.wraps(body)
    def stoppable(*args, **kwargs):
        from prefect.exceptions import CancelledRun, TerminationSignal

        try:
            return body(*args, **kwargs)
        except (RunStopped, TerminationSignal, CancelledRun) as exc:
            return stopped_state(stop_of(exc))

    # the body's signature with its annotations resolved in its own module (Prefect validates the flow's
    # parameters by them, in the namespace of the function it is given)
    stoppable.__signature__ = inspect.signature(body, eval_str=True)
    return stoppable


def map_calls(runner, task, calls: list[dict]) -> list:
    """One run of `task` per call (each a dict of its parameters), through the runner's mapping.

    Prefect's cache decides what runs: a stage whose folder is gone took its cached result with it
    (`tasks.common.cache_key_on`). Returns the futures, in the order of `calls`.
    """
    if not calls:
        return []
    names = list(calls[0])
    if any(list(call) != names for call in calls):
        raise ValueError(f"{task.name}: every mapped call must name the same parameters")
    return list(runner.map(task, {name: [call[name] for call in calls] for name in names}))


def results(futures: list) -> list:
    return [future.result() for future in futures]


def default_run_id() -> str:
    """`<UTC start>-<flow run id prefix>`: stable across retries of the same flow run."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    run = ctx.flow_run
    start = run.expected_start_time or run.start_time or datetime.now(UTC)
    return f"{start.astimezone(UTC):%Y%m%dT%H%M%SZ}-{run.id.hex[:8]}"
