"""The audited-release gate and the release manifest.

A run's synthetic demonstrations may be released to production only when every
condition holds:
  1. its membership-inference audit ran and passed,
  2. its noise was cryptographically seeded (a fixed-seed experiment is never released),
  3. its privacy spend is recorded in the ledger: an entry of that run holds the released
     demos' calibration row (mechanism, sigma, q, T, delta), not merely any entry of the run id,
  4. the accountant cross-check agreed for every epsilon it released,
  5. its demos were drawn with a sampler the accountant's bound covers
     (`dpcore.sampling.ACCOUNTED_SAMPLERS`: Poisson, and the fixed-size sampler under
     add/remove neighbours, proof in `dpcore.sampling`).
A refusal lists every failed condition, not only the first. Demos released here are
DP outputs: answering queries with them later is post-processing (no privacy cost).

The release manifest states the guarantee of the demos themselves (their epsilon at their
delta) and the ledger's composed spend of the dataset when they were released (every entry
of the dataset id: other runs, audits, baselines), with what the guarantee assumes:
per-label record counts are treated as public, and delta = 1/|D| (the default) is the
paper's choice, weak for a real deployment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class ReleaseEvidence:
    """What the gate looks at, read from a finished run's public tables and the ledger."""

    run_id: str
    audit_ran: bool
    audit_passed: bool
    audit_reasons: tuple[str, ...]
    seeded_noise: bool
    ledger_entry_present: bool
    crosscheck_agreed: bool
    dp_demos: int
    epsilons: tuple[float, ...] = field(default_factory=tuple)
    samplers: tuple[str, ...] = field(default_factory=tuple)  # of the DP demos; "unrecorded" when absent


def release_failures(evidence: ReleaseEvidence) -> list[str]:
    """Every failed release condition, one human-readable line each (empty: releasable)."""
    failures = []
    if evidence.dp_demos == 0:
        failures.append("the run produced no DP demonstrations (only baselines)")
    if any(math.isinf(eps) for eps in evidence.epsilons):
        failures.append("the run includes epsilon = inf (sigma = 0) demonstrations, which are not private")
    if not evidence.audit_ran:
        failures.append("the run has no membership-inference audit (run with --audit)")
    elif not evidence.audit_passed:
        reasons = "; ".join(evidence.audit_reasons) or "no reason recorded"
        failures.append(f"the membership-inference audit failed: {reasons}")
    if evidence.seeded_noise:
        failures.append("the noise was drawn from a fixed seed (an experiment); rerun without --seed")
    if not evidence.ledger_entry_present:
        failures.append(f"no privacy-ledger entry of run {evidence.run_id} records the released demos' spend "
                        "(their mechanism, sigma, q, T and delta)")
    if not evidence.crosscheck_agreed:
        failures.append("the accountant cross-check (prv-accountant vs dp-accounting PLD) did not agree")
    from dpcore.sampling import ACCOUNTED_SAMPLERS

    uncovered = sorted(set(evidence.samplers) - set(ACCOUNTED_SAMPLERS))
    if uncovered:
        failures.append(f"the demos were drawn with sampler {', '.join(uncovered)}, which the privacy accountant "
                        f"does not cover (covered: {', '.join(ACCOUNTED_SAMPLERS)})")
    return failures


def ledger_covers(entries, run_id: str, calibration_row: dict) -> bool:
    """Whether a ledger entry of `run_id` holds the calibration row's spend (mechanism, sigma, q, T, delta)."""
    from dpcore.ledger import matching_entries

    needed = ("mechanism", "noise_multiplier", "sampling_rate", "steps", "delta")
    if any(calibration_row.get(k) is None for k in needed):
        return False
    try:
        sigma, q = float(calibration_row["noise_multiplier"]), float(calibration_row["sampling_rate"])
        steps, delta = int(calibration_row["steps"]), float(calibration_row["delta"])
    except (TypeError, ValueError):
        return False
    if not (math.isfinite(sigma) and sigma > 0 and 0 < q <= 1 and 0 < delta < 1):
        return False
    return bool(matching_entries(entries, run_id=run_id, mechanism=str(calibration_row["mechanism"]),
                                 noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=delta))


ASSUMPTIONS = (
    "per-label record counts |D_y| are treated as public (they set q = MN/|D_y|), as in Tang et al.",
    "delta = 1/|D| (the default) is the paper's choice for comparability and weak: a mechanism at that delta may "
    "expose about one record; a deployment should set a smaller delta (dpicl run --delta)",
)


def evidence_from_tables(
    run_id: str,
    demos: pd.DataFrame,
    calibration: pd.DataFrame,
    audit: pd.DataFrame | None,
    ledger_entry_present: bool,
    epsilon: float | None = None,
) -> ReleaseEvidence:
    """Collect the gate's evidence for the DP demos of a run (optionally one epsilon of it)."""
    dp = demos[demos["method"] == "dp"]
    if epsilon is not None and "epsilon" in dp.columns:
        dp = dp[dp["epsilon"] == epsilon]
    calib = calibration
    if epsilon is not None and "epsilon" in calib.columns:
        calib = calib[calib["epsilon"] == epsilon]
    audit_ran = audit is not None and len(audit) > 0
    audit_passed = bool(audit_ran and audit["passed"].all())
    reasons: tuple[str, ...] = ()
    if audit_ran and "reasons" in audit.columns:
        reasons = tuple(
            line for value in audit.loc[~audit["passed"].astype(bool), "reasons"] for line in str(value).splitlines() if line
        )
    agreed = bool(len(calib) == 0 or calib["crosscheck_agreed"].astype(bool).all())
    return ReleaseEvidence(
        run_id=run_id,
        audit_ran=audit_ran,
        audit_passed=audit_passed,
        audit_reasons=reasons,
        seeded_noise=bool(dp["seeded_noise"].astype(bool).any()) if len(dp) else False,
        ledger_entry_present=ledger_entry_present,
        crosscheck_agreed=agreed,
        dp_demos=len(dp),
        epsilons=tuple(sorted(set(float(e) for e in dp["epsilon"]))) if "epsilon" in dp.columns else (),
        samplers=(tuple(sorted(set(dp["sampler"].astype(str)))) if "sampler" in dp.columns else ("unrecorded",))
        if len(dp) else (),
    )


def release_manifest(
    *,
    run_id: str,
    dataset: str,
    dataset_id: str,
    demos_sha256: str,
    demos: pd.DataFrame,
    calibration_row: dict,
    audit_summary: dict,
    model: str,
    code_version: str,
    accountant_versions: dict,
    version: int,
    ledger_spend: dict | None = None,
) -> dict:
    """The release record: what was released, its guarantee, and the evidence behind it."""
    return {
        "release_version": version,
        "run_id": run_id,
        "dataset": dataset,
        "dataset_id": dataset_id,
        "demos_sha256": demos_sha256,
        "demos": [{"label": str(r.label), "text": str(r.text)} for r in demos.itertuples(index=False)],
        "epsilon": calibration_row.get("epsilon"),
        "delta": calibration_row.get("delta"),
        "noise_multiplier": calibration_row.get("noise_multiplier"),
        "sampling_rate": calibration_row.get("sampling_rate"),
        "steps": calibration_row.get("steps"),
        "mechanism": calibration_row.get("mechanism"),
        "accountant_versions": accountant_versions,
        "model": model,
        "code_version": code_version,
        "audit": audit_summary,
        # The dataset's whole composed spend at release (every run, audit and baseline of the dataset id),
        # not only the released demos' own epsilon above.
        "ledger": ledger_spend,
        "assumptions": list(ASSUMPTIONS),
    }


# --------------------------------------------------------------------------- finished runs on disk


@dataclass(frozen=True)
class RunFolder:
    """The public tables of a finished pipeline run (`$DPICL_HOME/runs/<dataset>/<hash12>/<run-id>/`)."""

    path: Path
    manifest: dict
    demos: pd.DataFrame
    calibration: pd.DataFrame
    audit: pd.DataFrame | None
    changed_files: tuple[str, ...]

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", self.path.name))


def find_run_dir(run_id: str, home: Path) -> Path:
    """The public folder of `run_id`; a clear error when it is missing or ambiguous."""
    from dpcore.errors import ConfigError

    matches = [p for p in (home / "runs").glob(f"*/*/{run_id}") if p.is_dir()]
    if not matches:
        raise ConfigError(f"run {run_id!r}: no run folder under {home / 'runs'} (see `dpicl run` output)")
    if len(matches) > 1:
        raise ConfigError(f"run {run_id!r}: several run folders match: {', '.join(str(m) for m in matches)}")
    return matches[0]


def load_run(run_id: str, home: Path) -> RunFolder:
    """Read the tables the release gate needs; files changed since the manifest are reported, not trusted."""
    import json

    from dpcore.artifacts import read_table, verify_manifest
    from dpcore.errors import ConfigError

    path = find_run_dir(run_id, home)
    if not (path / "manifest.json").exists():
        raise ConfigError(f"run {run_id!r}: {path} has no manifest.json (the run did not finish)")
    for name in ("demos", "calibration"):
        if not (path / f"{name}.parquet").exists():
            raise ConfigError(f"run {run_id!r}: {path / (name + '.parquet')} is missing")
    audit_path = path / "audit.parquet"
    return RunFolder(
        path=path,
        manifest=json.loads((path / "manifest.json").read_text()),
        demos=read_table(path / "demos.parquet"),
        calibration=read_table(path / "calibration.parquet"),
        audit=read_table(audit_path) if audit_path.exists() else None,
        changed_files=tuple(verify_manifest(path)),
    )


def choose_release_epsilon(run: RunFolder, epsilon: float | None) -> float:
    """The epsilon to release: the one asked for, else the smallest DP epsilon of the run (the strongest guarantee)."""
    from dpcore.errors import ConfigError

    dp = run.demos[run.demos["method"] == "dp"]
    available = sorted(set(float(e) for e in dp["epsilon"])) if "epsilon" in dp.columns else []
    if epsilon is None:
        if not available:
            raise ConfigError(f"run {run.run_id}: no DP demonstrations to release")
        return available[0]
    if float(epsilon) not in available:
        raise ConfigError(f"--epsilon {epsilon}: run {run.run_id} has DP demos at {available or 'no epsilon'}")
    return float(epsilon)
