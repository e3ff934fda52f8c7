"""Audited release: gate a finished run, then register its DP demonstrations as `production`.

    release gate (audit passed, no seeded noise, ledger entry, cross-check agreed)
      -> release folder + manifest -> MLflow registry version, alias moved

A refused release raises `ReleaseRefusedError` listing every failed condition.
"""

from __future__ import annotations

from prefect import flow

from tasks import release as release_stage


@flow(name="audited-release", retries=0,
      description="Release a run's DP demonstrations after the membership-inference audit gate.")
def release(run_id: str, epsilon: float | None = None, alias: str = release_stage.DEFAULT_ALIAS) -> dict:
    """Release run `run_id` (its smallest DP epsilon unless `epsilon` is given) under `alias`."""
    checked = release_stage.check_gate(run_id, epsilon)
    return release_stage.register(run_id, checked["epsilon"], alias)
