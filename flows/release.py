"""Audited release: gate a finished run, then register its DP artifact as `production`.

    every method:  [pate, dpsgd: the gate's conditions the audit cannot change (a refusal here runs no audit),
                   then the membership-inference audit of the artifact (and, opt-in, the single-teacher
                   contrast); tang's demos were audited by their run] -> release gate (`tasks.release.check_gate`:
                   audit passed, no seeded noise, ledger entries, cross-check agreed) -> release folder + manifest
                   -> MLflow registry version (`tasks.release.register`)

A refused release raises `ReleaseRefusedError` listing every failed condition.
"""

from __future__ import annotations

from prefect import flow
from prefect.exceptions import FailedRun
from prefect.states import Failed

from dpcore.audit.config import AuditConfig
from dpcore.errors import ReleaseRefusedError
from flows.runner import cancelled_on_stop
from tasks import release as release_stage

REFUSED = "Refused"


@flow(name="audited-release", retries=0, persist_result=False,
      description="Release a run's DP demonstrations, PromptPATE student prompt or PromptDPSGD prompt after the "
                  "membership-inference audit gate.")
@cancelled_on_stop
def audited_release(run_id: str, epsilon: float | None = None, alias: str = release_stage.DEFAULT_ALIAS,
                    method: str = "tang", audit_config: AuditConfig | None = None, teacher_reference: bool = False,
                    audit_only: bool = False, training: int = 0, repeat: int | None = None,
                    device: str = "auto", dtype: str = "auto", size_to_pools: bool = False, seed: int | None = None):
    """Release run `run_id` under `alias`: `method` tang (its smallest DP epsilon unless `epsilon` is given),
    pate (the student prompt of `repeat`, default the run's chosen one) or dpsgd (the prompt of `epsilon`,
    default the smallest, and `training`). For pate and dpsgd the artifact's audit runs first
    (`audit_only`: and nothing more; the flow returns the audit), sized to the pools when `size_to_pools`
    (`tasks.release.planned_audit`); `seed` fixes the audit's member draws and trials (default: derived from
    the data's content hash), as `RunConfig.seed` does for the pipeline's audit of the same artifacts. A
    release the gate refuses whatever the audit finds (seeded noise, a missing ledger entry, no agreed
    guarantee, changed files) is refused before the audit: no forward pass, no spend of the contrast.

    A refusal ends the flow run Failed, in a state named "Refused" whose message
    lists the gate's reasons (shown in the UI), with no stored result to clutter the artifacts."""
    selector = dict(epsilon=epsilon, training=training, repeat=repeat)
    audited = {}
    if release_stage.audited_at_release(method):  # else its artifact was audited by its own run (tang's demos)
        if not audit_only:  # what refuses the release whatever the audit finds refuses it before the audit
            early = release_stage.check_gate(run_id, method, **selector, before_audit=True)
            if early["refused"]:
                return Failed(name=REFUSED, message=early["refused"])
        audited = release_stage.audit_artifact(run_id, method, audit_config or AuditConfig(), **selector,
                                               teacher_reference=teacher_reference, device=device, dtype=dtype,
                                               size_to_pools=size_to_pools, seed=seed)
        if audit_only:
            return {"run_id": run_id, "method": method, **audited}
    checked = release_stage.check_gate(run_id, method, **selector)
    if checked["refused"]:
        return Failed(name=REFUSED, message=checked["refused"])
    return {**release_stage.register(run_id, method, **checked["selector"], alias=alias),
            **({"teacher_reference": audited["teacher_reference"]} if "teacher_reference" in audited else {})}


def release(run_id: str, epsilon: float | None = None, alias: str = release_stage.DEFAULT_ALIAS,
            method: str = "tang", **options) -> dict:
    """Run the release flow; a refusal raises `ReleaseRefusedError` listing every failed condition.

    The flow's return value comes from the engine's memory, not from its final state: when the server rejects
    a state proposal (a busy SQLite server's retry of one it had already recorded), the engine holds the
    server's copy of the state, which lacks the flow's unpersisted result."""
    try:
        return audited_release(run_id=run_id, epsilon=epsilon, alias=alias, method=method, **options)
    except FailedRun as refused:  # the one Failed state the flow returns is its refusal (REFUSED)
        raise ReleaseRefusedError(str(refused) or f"release of run {run_id} refused") from None
