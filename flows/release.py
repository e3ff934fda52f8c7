"""Audited release: gate a finished run, then register its DP demonstrations as `production`.

    release gate (audit passed, no seeded noise, ledger entry, cross-check agreed)
      -> release folder + manifest -> MLflow registry version, alias moved

A refused release raises `ReleaseRefusedError` listing every failed condition.
"""

from __future__ import annotations

from prefect import flow
from prefect.states import Failed

from dpcore.errors import ReleaseRefusedError
from tasks import release as release_stage

REFUSED = "Refused"


@flow(name="audited-release", retries=0, persist_result=False,
      description="Release a run's DP demonstrations after the membership-inference audit gate.")
def audited_release(run_id: str, epsilon: float | None = None, alias: str = release_stage.DEFAULT_ALIAS):
    """Release run `run_id` (its smallest DP epsilon unless `epsilon` is given) under `alias`.

    A refusal ends the flow run Failed, in a state named "Refused" whose message
    lists the gate's reasons (shown in the UI), with no stored result to clutter the artifacts."""
    checked = release_stage.check_gate(run_id, epsilon)
    if checked["refused"]:
        return Failed(name=REFUSED, message=checked["refused"])
    return release_stage.register(run_id, checked["epsilon"], alias)


def release(run_id: str, epsilon: float | None = None, alias: str = release_stage.DEFAULT_ALIAS) -> dict:
    """Run the release flow; a refusal raises `ReleaseRefusedError` listing every failed condition."""
    state = audited_release(run_id=run_id, epsilon=epsilon, alias=alias, return_state=True)
    if state.name == REFUSED:
        raise ReleaseRefusedError(state.message or f"release of run {run_id} refused")
    return state.result()
