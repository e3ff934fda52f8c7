"""The release gate over a finished run: the artifact a release of a method would publish (its registered
`ReleaseSpec`'s loader, `dpcore.release.gate.load_artifact`) and every release condition it meets or fails
(`check_gate`; the conditions live in `dpcore.release.gate`)."""

from __future__ import annotations

from dataclasses import replace

from prefect import get_run_logger

from dpcore.display import fmt_eps
from dpcore.home import dpicl_home
from dpcore.release import gate
from dpcore.release.spec import Artifact, ReleaseSpec
from tasks.common import stoppable_task


def release_spec(method: str) -> ReleaseSpec:
    """What releasing `method` publishes (`tasks.methods.release_spec`); ConfigError for a method with none."""
    from tasks.methods import release_spec as registered  # the registry imports every method's stages (torch)

    return registered(method)


def audited_at_release(method: str) -> bool:
    """Whether `dpicl release --method <method>` audits the artifact first (its spec's audit table; a method
    audited by its own run has none)."""
    return release_spec(method).audited_at_release


def load_artifact(run_id: str, method: str, epsilon: float | None = None, training: int = 0,
                  repeat: int | None = None) -> Artifact:
    """What releasing `method` of a finished run would publish (its registered `ReleaseSpec`'s loader,
    `dpcore.release.gate.load_artifact`)."""
    return gate.load_artifact(release_spec(method), run_id, dpicl_home(), epsilon, training, repeat)


@stoppable_task(name="release-gate", retries=0)
def check_gate(run_id: str, method: str = "tang", epsilon: float | None = None, training: int = 0,
               repeat: int | None = None, before_audit: bool = False) -> dict:
    """Evaluate every release condition of what releasing `method` of the run would publish: `refused` lists
    every one that fails (a refusal is an answer, not a task failure: the flow turns it into a Failed state
    with that message and no stored result); `selector` picks the same artifact for `register`.

    `before_audit`: every condition but the audit's verdict (seeded noise, ledger entries, the accountants'
    cross-check, changed files): what refuses the release whatever the audit would find."""
    from dpcore.privacy.ledger import Ledger

    artifact = load_artifact(run_id, method, epsilon, training, repeat)
    evidence = gate.evidence(artifact, Ledger().entries_for_run(run_id))
    if before_audit:
        evidence = replace(evidence, audit_ran=True, audit_passed=True)
    failures = gate.release_failures(evidence)
    if artifact.changed_files:
        failures.append(f"run files changed since the run finished: {', '.join(artifact.changed_files)}")
    when = " before its membership audit, which was not run" if before_audit else ""
    refused = (f"release of run {run_id} ({method} {artifact.name}, epsilon {fmt_eps(artifact.epsilon)}) "
               f"refused{when}:\n" + "\n".join(f"- {line}" for line in failures) if failures else None)
    if refused is None and not before_audit:
        get_run_logger().info("release gate passed for run %s (%s %s, epsilon %s)", run_id, method, artifact.name,
                              fmt_eps(artifact.epsilon))
    return {"run_id": run_id, "method": method, "artifact": artifact.name, "epsilon": artifact.epsilon,
            "run_dir": str(artifact.path), "selector": artifact.selector, "refused": refused}
