"""The audited-release gate and the release manifest, for every private-prompting method.

What a method releases is its `ReleaseSpec` (`dpcore.release.spec`, declared in the method's subsystem and handed
here by its caller from the method registry): demonstrations, an instruction or a trained prompt, read from a
finished run's public files by the spec's loader into one `Artifact`. An artifact may be released to production
only when every condition holds:
  1. its membership-inference audit ran and passed,
  2. its noise was cryptographically seeded (a fixed-seed experiment is never released),
  3. its privacy spend is recorded in the ledger: an entry of that run holds every spend the artifact names
     (mechanism, sigma, q, T, delta, under the method's purposes), not merely any entry of the run id,
  4. the accountant cross-check agreed for every epsilon it released,
  5. its demos were drawn with a sampler the accountant's bound covers (its spec's `accounted_samplers`;
     DP few-shot generation's: Poisson, and the fixed-size sampler under add/remove neighbours, proof in
     `dpcore.fewshot.sampling`).
A refusal lists every failed condition, not only the first. One path for every method: `load_artifact` (the
spec's loader) reads what the release publishes into an `Artifact` carrying the method's facts (the spends the
ledger must hold, under which purposes; the samplers to cover; a recorded cross-check or none, then recomputed
on the spends; the audit table), and `evidence`, `release_failures` and `release_manifest` read only that.
Artifacts released here are DP outputs: answering queries with them later is post-processing (no privacy cost).

The release manifest states the guarantee of the artifact itself (its epsilon at its delta) and the ledger's
composed spend of the dataset when it was released (every entry of the dataset id: other runs, audits,
baselines), with what the guarantee assumes (the spec's assumptions) and the delta the run used, with where it
came from (`delta_assumption`: the run's --delta, its ledger budget's delta, or 1/|D|, the default: the paper's
choice, weak for a real deployment). The task spec it states is the one the run kept
(`dpcore.data.artifacts.RUN_INPUTS_FILE`), so a release reads the same from any working directory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dpcore.display import fmt_delta
from dpcore.errors import ConfigError
from dpcore.privacy import composition
from dpcore.privacy.events import event_from_dict, sampled_steps_event
from dpcore.release.spec import DELTA_ASSUMPTION, Artifact, ReleaseSpec

# What a release folder holds beside `release.json`, by the artifact's kind.
DEMOS_FILE = "demos.parquet"  # released demonstrations (text, label)
INSTRUCTION_FILE = "instruction.json"  # a released instruction ({"instruction": ...})
TRAINED_PROMPT_FILE = "prompt.safetensors"  # a released trained prompt (and its `prompt.json`)
# The refusal of a run with nothing to release when the evidence names no method's spec.
NOTHING_RELEASED = "the run produced no DP demonstrations or prompt to release"


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
    dp_demos: int  # what the artifact holds: demonstrations, or 1 for an instruction or a trained prompt
    epsilons: tuple[float, ...] = field(default_factory=tuple)
    samplers: tuple[str, ...] = field(default_factory=tuple)  # of the DP demos; "unrecorded" when absent
    method: str = "tang"
    spec: ReleaseSpec | None = field(default=None, compare=False, repr=False)  # the method's release (its texts)


def release_failures(evidence: ReleaseEvidence) -> list[str]:
    """Every failed release condition, one human-readable line each (empty: releasable)."""
    failures = []
    spec = evidence.spec
    if evidence.dp_demos == 0:
        failures.append(spec.nothing_releasable if spec is not None else NOTHING_RELEASED)
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
        what = spec.spend_owner if spec is not None else f"{evidence.method} prompt's"
        failures.append(f"no privacy-ledger entry of run {evidence.run_id} records the released {what} spend "
                        "(their mechanism, sigma, q, T and delta)")
    if not evidence.crosscheck_agreed:
        failures.append("the accountant cross-check (prv-accountant vs dp-accounting PLD) did not agree")
    covered = spec.accounted_samplers if spec is not None else ReleaseSpec.accounted_samplers
    uncovered = sorted(set(evidence.samplers) - set(covered))
    if uncovered:
        failures.append(f"the demos were drawn with sampler {', '.join(uncovered)}, which the privacy accountant "
                        f"does not cover (covered: {', '.join(covered)})")
    return failures


def delta_assumption(delta: float, source: str | None, dataset_id: str) -> str:
    """What a release's guarantee assumes of its delta, by where the run took it from (`source`: one of
    `tasks.run_plans.DELTA_SOURCES`; None for a run that did not record it)."""
    shown = f"delta = {fmt_delta(delta)}"
    if source == "1/|D|":
        return (f"{shown} is 1/|D|, the default when a run is given no delta: the paper's choice for comparability, "
                "and weak (a mechanism at that delta may expose about one record); a deployment should set a "
                "smaller delta (dpicl run --delta, or a ledger budget's delta)")
    if source == "budget":
        return f"{shown} is the delta of the ledger budget of dataset id '{dataset_id}', which the run took"
    if source == "flag":
        return f"{shown} was given to the run (--delta)"
    return f"{shown} was given to the run (--delta, or its ledger budget's delta)"


def audit_verdict(audit: pd.DataFrame | None) -> tuple[bool, bool, tuple[str, ...]]:
    """(ran, passed, every failing reason) of an audit table (one row per audited prompt or epsilon)."""
    ran = audit is not None and len(audit) > 0
    passed = bool(ran and audit["passed"].astype(bool).all())
    reasons: tuple[str, ...] = ()
    if ran and "reasons" in audit.columns:
        reasons = tuple(line for value in audit.loc[~audit["passed"].astype(bool), "reasons"]
                        for line in str(value).splitlines() if line)
    return ran, passed, reasons


def load_artifact(spec: ReleaseSpec, run_id: str, home: Path, epsilon: float | None = None, training: int = 0,
                  repeat: int | None = None) -> Artifact:
    """What releasing `spec`'s method of run `run_id` would publish (its loader, on public files only)."""
    return spec.load(spec, run_id, home, epsilon=epsilon, training=training, repeat=repeat)


# --------------------------------------------------------------------------- the gate, the manifest


def plan_crosscheck(spends: tuple[dict, ...], delta: float) -> bool:
    """The accountant cross-check (PRV vs PLD, `dpcore.privacy.composition.compose`) on a plan's spends."""
    if not spends or any(s.get("noise_multiplier") is not None and float(s["noise_multiplier"]) <= 0 for s in spends):
        return False
    events = [_spend_event(s) for s in spends]
    return None not in events and bool(composition.compose(events, delta).crosscheck_agreed)


def _spend_event(spend: dict):
    """A plan spend's event: its stored form (plans sealed since events were kept), else its parameters; None
    when it has neither (nothing to check: the gate refuses)."""
    if spend.get("event") is not None:
        return event_from_dict(spend["event"])
    if any(spend.get(k) is None for k in ("mechanism", "noise_multiplier", "sampling_rate", "steps")):
        return None
    return sampled_steps_event(str(spend["mechanism"]), float(spend["noise_multiplier"]),
                               float(spend["sampling_rate"]), int(spend["steps"]))


LEDGER_ENTRY_KEYS = ("id", "run_id", "purpose", "mechanism", "noise_multiplier", "sampling_rate", "steps", "delta",
                     "created_at")


def _recorded(entries: list, run_id: str, spend: dict, delta: float, purposes: tuple[str, ...]) -> list:
    """The entries of `run_id` (of one of `purposes`) holding `spend` (mechanism, sigma, q, T) at `delta`."""
    # dp-accounting loads here, not when the module is imported
    from dpcore.privacy.ledger import entries_holding, matching_entries

    if spend.get("noise_multiplier") is None and spend.get("event") is not None:  # an event of no steps' shape
        return entries_holding(entries, run_id=run_id, event=event_from_dict(spend["event"]), delta=float(delta),
                               purposes=purposes)
    if any(spend.get(k) is None for k in ("mechanism", "noise_multiplier", "sampling_rate", "steps")):
        return []
    try:
        sigma, q = float(spend["noise_multiplier"]), float(spend["sampling_rate"])
        steps, delta = int(spend["steps"]), float(delta)
    except (TypeError, ValueError):
        return []
    if not (math.isfinite(sigma) and sigma > 0 and 0 < q <= 1 and 0 < delta < 1):
        return []
    return matching_entries(entries, run_id=run_id, mechanism=str(spend["mechanism"]), noise_multiplier=sigma,
                            sampling_rate=q, steps=steps, delta=delta, purposes=purposes)


def covering_entries(entries, artifact: Artifact) -> list:
    """For every spend of the artifact, a ledger entry of its run recording it (mechanism, sigma, q, T, delta,
    purpose), in spend order; empty when any spend is unrecorded. Another epsilon of the same run, or the
    same spend under another purpose (an audit, a baseline), does not cover it."""
    entries = list(entries)
    found = []
    for spend in artifact.spends:
        purposes = artifact.ledger_purposes or (str(spend["purpose"]),)
        match = _recorded(entries, artifact.run_id, spend, artifact.delta, purposes)
        if not match:
            return []
        found.append(match[0])
    return found


def audit_rows(artifact: Artifact) -> pd.DataFrame | None:
    """The rows of the artifact's audit table that audit it (a table keyed by `artifact`: that name's rows)."""
    audit = artifact.audit
    if audit is not None and "artifact" in audit.columns:
        return audit[audit["artifact"] == artifact.name]
    return audit


def released_count(artifact: Artifact) -> int:
    """What the artifact holds to release: its demonstrations, or 1 for an instruction (a non-empty one) or a
    trained prompt (its file present); 0: nothing."""
    if artifact.instruction is not None:
        return int(bool(artifact.instruction))
    return len(artifact.demos) if artifact.prompt_path is None else int(artifact.prompt_path.exists())


def evidence(artifact: Artifact, entries) -> ReleaseEvidence:
    """The gate's evidence for one artifact: its audit rows, every spend charged to its run (`covering_entries`),
    the cross-check (as calibrated, or recomputed on its spends), its seeded flag and its samplers."""
    ran, passed, reasons = audit_verdict(audit_rows(artifact))
    present = released_count(artifact)
    agreed = artifact.crosscheck_agreed
    if agreed is None:
        agreed = math.isfinite(artifact.epsilon) and plan_crosscheck(artifact.spends, artifact.delta)
    return ReleaseEvidence(
        run_id=artifact.run_id, audit_ran=ran, audit_passed=passed, audit_reasons=reasons,
        seeded_noise=artifact.seeded_noise, ledger_entry_present=bool(covering_entries(entries, artifact)),
        crosscheck_agreed=bool(agreed), dp_demos=present, epsilons=(artifact.epsilon,) if present else (),
        samplers=artifact.samplers if present else (), method=artifact.method, spec=artifact.spec,
    )


def audit_members(artifact: Artifact, train: pd.DataFrame, read_ids: list[str] | None = None) -> pd.DataFrame:
    """The private records the artifact's mechanism actually read (the audit's members): PromptPATE, the
    teachers' records (from the private teacher assignment); PromptDPSGD, the records some Poisson batch
    drew (from the training's private record). Auditing with every training record would dilute the
    attack: at a CPU preset only 1 - (1 - q)^T of them (about 1%) are ever read, so the AUC would sit near
    0.5 whatever the prompt."""
    if read_ids is None:
        raise ConfigError(f"run {artifact.run_id}: the private record of which records {artifact.name} read is "
                          "missing; the audit needs it (rerun the training)")
    wanted = set(map(str, read_ids))
    return train[train["id"].astype(str).isin(wanted)].reset_index(drop=True)


def release_manifest(artifact: Artifact, *, artifact_file: str, artifact_sha256: str, audit_summary: dict,
                     code_version: str, accountant_versions: dict, version: int, ledger_spend: dict | None,
                     task_spec: dict, ledger_entries: list | None = None) -> dict:
    """The release record (`release.json`) of any method: what was released (the file and its hash, the
    demos when it is a text prompt), its guarantee (epsilon at delta, the spends and the ledger entries
    recording them), public parameters, the audit verdict, the ledger's composed spend of the dataset at
    release (every run, audit and baseline of the dataset id, not only this epsilon) and what the guarantee
    assumes. A single-spend release (tang, dpsgd) also states its mechanism, sigma, q and T at the top level."""
    manifest = {
        "release_version": version, "method": artifact.method, "run_id": artifact.run_id,
        "artifact_name": artifact.name, "dataset": artifact.info.get("dataset"), "dataset_id": artifact.dataset_id,
        "artifact": {"file": artifact_file, "sha256": artifact_sha256},
        "epsilon": artifact.epsilon, "delta": artifact.delta, "spends": [dict(s) for s in artifact.spends],
        "ledger_entries": [{k: getattr(e, k) for k in LEDGER_ENTRY_KEYS} for e in ledger_entries or []],
        "parameters": dict(artifact.info.get("parameters") or {}), "model": artifact.info.get("model"),
        "accountant_versions": accountant_versions, "code_version": code_version, "audit": audit_summary,
        "ledger": ledger_spend, "assumptions": list(artifact.assumptions),
        "task_spec": task_spec,
        "demos": [{"label": y, "text": t} for t, y in artifact.demos],
    }
    # the delta the run used and where it came from, in place of DELTA_ASSUMPTION
    manifest["assumptions"] = [delta_assumption(artifact.delta, artifact.delta_source, artifact.dataset_id)
                               if line == DELTA_ASSUMPTION else line for line in manifest["assumptions"]]
    manifest["delta_source"] = artifact.delta_source
    if artifact_file == DEMOS_FILE:
        manifest["demos_sha256"] = artifact_sha256
    if artifact.instruction is not None:
        manifest["instruction"] = artifact.instruction
    if len(artifact.spends) == 1:
        manifest.update({k: artifact.spends[0].get(k) for k in ("mechanism", "noise_multiplier", "sampling_rate",
                                                                "steps")})
    if "model_weights_sha256" in artifact.info:
        manifest["model_weights_sha256"] = artifact.info["model_weights_sha256"]
    return manifest
