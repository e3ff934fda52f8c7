"""The release stage: the audit gate over a finished run, the release audit, the release manifest and the MLflow
registry; using a release (`dpicl predict`, `dpicl export`). One path for every method: what a method releases is
its registered `ReleaseSpec` (`tasks.methods.release_spec`, declared in the method's dpcore subsystem), loaded into
one `Artifact` (`check.load_artifact`), judged by one gate (`check.check_gate`), registered by one `register`.

- `check.py`: the artifact a release would publish and the gate's conditions on it (`check_gate`);
- `audit.py`: the membership-inference audit of an artifact audited at its release (`audit_artifact`,
  `planned_audit`) and the opt-in single-teacher contrast;
- `registry.py`: the release folder, written whole or not at all, its sealed `release.json` and its MLflow
  registry version (`register`, `load_release`);
- `use.py`: `dpicl predict` (`answer_queries`) and `dpicl export` (`export_release`);
- `sealing.py`: a run folder's public record sealed (`seal_pate_run`) and re-sealed after a release audit.

The flows call these through this package (`from tasks import release as release_stage`).
"""

from __future__ import annotations

from tasks.release.audit import POOL_BOUND_FAILURE, audit_artifact, planned_audit
from tasks.release.check import audited_at_release, check_gate, load_artifact, release_spec
from tasks.release.registry import (
    DEFAULT_ALIAS,
    RELEASE_FILE,
    SEAL_TAG,
    load_release,
    register,
    registered_model_name,
)
from tasks.release.sealing import seal_pate_run
from tasks.release.use import answer_queries, export_release

__all__ = ["DEFAULT_ALIAS", "POOL_BOUND_FAILURE", "RELEASE_FILE", "SEAL_TAG", "answer_queries", "audit_artifact",
           "audited_at_release", "check_gate", "export_release", "load_artifact", "load_release", "planned_audit",
           "register", "registered_model_name", "release_spec", "seal_pate_run"]
