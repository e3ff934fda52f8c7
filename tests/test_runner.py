"""flows/runner.py and the stage decorators (tasks/common.py) on Prefect: a stop request ends the flow runs and
the task runs it cut short Cancelled, with the stop's message, never Failed or Crashed (a mapped stage, a stage
called directly, a subflow and its parent), while the caller still gets the `RunStopped`; a stopped cached stage
leaves no cached result (a resumed run runs it again); a genuine error still ends Failed. Tiny flows on the
suite's Prefect server: a few seconds."""

from __future__ import annotations

import time
import uuid

import pytest
from pipeline_support import (
    ended_task_runs,
    prefect_harness,  # noqa: F401  (the shared harness fixture)
)
from prefect import flow

from dpcore.errors import ConfigError, RunStopped
from flows.runner import cancelled_on_stop, map_calls, results, running
from tasks import common

pytestmark = pytest.mark.usefixtures("prefect_harness")

CALLS: list[str] = []


@common.uncached_task("stage-steps", task_run_name="stage-steps-{item}")
def steps(item: int) -> int:
    """Item 1 asks for the stop (as Ctrl-C does) at its first step; the others stop at their next step."""
    for done in range(200):
        if item == 1 and done == 1:
            common.STOP_REQUESTED.set()
        common.report_progress(f"stage {item}", done, 200)
        time.sleep(0.005)
    return item


@common.cached_task("stage-once", ("key",))
def once(key: str, stop: bool) -> str:
    CALLS.append(key)
    if stop:
        raise RunStopped(f"stage-once {key}: stopped on request at 0/1")
    return key


@common.uncached_task("stage-broken")
def broken() -> None:
    raise ConfigError("stage-broken: a genuine error")  # a user error: not retried


@flow(name="test-runner-mapped", retries=0)
@cancelled_on_stop
def mapped() -> list[int]:
    with running("threads:2") as runner:
        return results(map_calls(runner, steps, [{"item": item} for item in range(4)]))


@flow(name="test-runner-inner", retries=0)
@cancelled_on_stop
def inner(key: str, stop: bool) -> str:
    return once(key=key, stop=stop)


@flow(name="test-runner-parent", retries=0)
@cancelled_on_stop
def parent(key: str, stop: bool) -> str:
    return inner(key=key, stop=stop)


@flow(name="test-runner-broken", retries=0)
@cancelled_on_stop
def failing() -> None:
    broken()


def _flow_runs(parent_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        return [client.read_flow_run(parent_id), *client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])))]


def _stopped(state) -> bool:
    return state.is_cancelled() and state.message.startswith("stopped on request: ")


def test_a_stop_ends_the_mapped_stages_cancelled_and_the_caller_gets_it():
    try:
        state = mapped(return_state=True)
    finally:
        common.STOP_REQUESTED.clear()
    assert _stopped(state), state
    with pytest.raises(RunStopped, match="stopped on request"):  # the CLI's exit 130
        state.result()
    task_runs = ended_task_runs(state.state_details.flow_run_id,
                                until=lambda runs: any(t.name == "stage-steps-1" for t in runs))
    assert not [t for t in task_runs if not (t.state.is_completed() or _stopped(t.state))], task_runs
    # the stage that asked, at its step; the others at their next step, or before they began
    assert [t.state.message for t in task_runs if t.name == "stage-steps-1"] == [
        "stopped on request: stage 1: stopped on request at 1/200"], task_runs


def test_a_stopped_subflow_stops_its_parent_and_its_stage_runs_again_on_resume():
    key = uuid.uuid4().hex
    state = parent(key=key, stop=True, return_state=True)
    assert _stopped(state) and "stage-once" in state.message, state
    with pytest.raises(RunStopped, match="stage-once"):  # the CLI's exit 130
        state.result()
    flow_runs = _flow_runs(state.state_details.flow_run_id)
    assert len(flow_runs) == 2 and all(_stopped(r.state) for r in flow_runs), flow_runs
    for run in flow_runs:  # the subflow's stage, and the parent's task run standing for the subflow
        task_runs = ended_task_runs(run.id)
        assert len(task_runs) == 1 and _stopped(task_runs[0].state), task_runs

    assert parent(key=key, stop=False) == key  # the stopped stage left no cached result: it runs again
    assert CALLS.count(key) == 2
    assert parent(key=key, stop=False) == key and CALLS.count(key) == 2  # now it is cached


def test_a_genuine_error_still_fails_its_stage_and_the_flow():
    state = failing(return_state=True)
    assert state.is_failed(), state
    with pytest.raises(ConfigError, match="a genuine error"):
        state.result()
    task_runs = ended_task_runs(state.state_details.flow_run_id)
    assert len(task_runs) == 1 and task_runs[0].state.is_failed() and task_runs[0].run_count == 1, task_runs
