"""The membership audit's release gate: pass/fail with one reason per failing condition.

An audit passes when every attack's mean AUC stays within 0.5 +/- tolerance with an
interval narrow enough to tell (family-wise over the attacks, `dpcore.audit_statistics`),
no demonstration copies `overlap_threshold` consecutive tokens of a private record
(`dpcore.overlap`), and the two accountants agreed (`dpcore.composition`'s cross-check).
The reasons name figures and counts only, never a record's text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcore.audit_statistics import AttackMetrics, strongest_attack
from dpcore.config import AuditConfig


@dataclass(frozen=True)
class GateThresholds:
    """Release-gate thresholds (the audit gate's defaults)."""

    auc_tolerance: float = 0.05  # |AUC - 0.5| must stay within this
    overlap_threshold: int = 8  # a shared run of this many tokens is a verbatim leak
    require_crosscheck: bool = True  # the accountant cross-check must have agreed

    @classmethod
    def from_config(cls, config: AuditConfig) -> GateThresholds:
        return cls(auc_tolerance=config.auc_tolerance, overlap_threshold=config.overlap_threshold)


def _ci_text(ci) -> str:
    low, high = ci
    return "undefined" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]"


def gate(result, thresholds: GateThresholds | None = None) -> tuple[bool, tuple[str, ...]]:
    """Pass/fail of an audit and every failing reason (one line each; empty when it passes).

    `result` needs: auc, auc_ci, confidence, max_overlap_tokens, overlapping_records and
    crosscheck_agreed (True/False, or None when no accountant applies: a non-private prompt);
    `attacks` (AttackMetrics, one per attack) when several attacks ran, otherwise its own
    auc/auc_ci is the one attack. Conditions, over EVERY attack (the worst case):
    1. each attack's averaged AUC lies within 0.5 +/- auc_tolerance (two-sided: a score that
       ranks members LOWER is a distinguisher too); the reason names the strongest attack
       (largest |AUC - 0.5|) with its CI, and the others outside the band;
    2. each attack's CI (`auc_mean_ci`, at the family-wise level) is no wider than the band
       (hi - lo <= 2 tolerance); otherwise the audit is too small to tell (inconclusive).
       Under no leakage each AUC estimate then leaves the band with probability <= (1 -
       confidence) / attacks (about), so the gate's false-alarm rate stays <= 1 - confidence;
    3. no demo shares `overlap_threshold` or more consecutive tokens with a private record;
    4. the accountant cross-check agreed.
    """
    thresholds = thresholds or GateThresholds()
    reasons = []
    tol = thresholds.auc_tolerance
    attacks = tuple(getattr(result, "attacks", ()) or ())
    if not attacks:
        attacks = (AttackMetrics(getattr(result, "attack", "duan"), result.auc, tuple(result.auc_ci), (), math.nan,
                                 math.nan, math.nan, math.nan),)
    level = f"{100 * result.confidence:g}%" + (f" simultaneous over {len(attacks)} attacks" if len(attacks) > 1 else "")
    outside = [a for a in attacks if not abs(a.auc - 0.5) <= tol]
    if outside:
        worst = strongest_attack(outside)
        others = [a for a in outside if a is not worst]
        reasons.append(f"membership-inference AUC {worst.auc:.3f} ({level} CI {_ci_text(worst.auc_ci)}) of the "
                       f"{worst.attack} attack is outside 0.5 +/- {tol:g}"
                       + (f" (also outside: {', '.join(f'{a.attack} {a.auc:.3f}' for a in others)})" if others else ""))
    wide = [a for a in attacks if math.isnan(a.auc_ci[0]) or a.auc_ci[1] - a.auc_ci[0] > 2 * tol]
    if wide:
        widest = max(wide, key=lambda a: math.inf if math.isnan(a.auc_ci[0]) else a.auc_ci[1] - a.auc_ci[0])
        recurring = widest.independent_trials is not None and widest.independent_trials < len(widest.trial_aucs)
        remedy = (f"its {len(widest.trial_aucs)} trials re-score the same records (only "
                  f"{widest.independent_trials} independent trial(s)): the prompt's mechanism read too few records "
                  "to audit with this many members per trial" if recurring else "run more trials or demo sets")
        reasons.append(f"audit inconclusive: the {level} CI of the AUC {_ci_text(widest.auc_ci)} ({widest.attack} "
                       f"attack) is wider than the band 0.5 +/- {tol:g}; {remedy}")
    if result.max_overlap_tokens >= thresholds.overlap_threshold:
        reasons.append(f"verbatim overlap: a demonstration shares {result.max_overlap_tokens} consecutive tokens "
                       f"with a private record ({result.overlapping_records} record(s) at >= "
                       f"{thresholds.overlap_threshold} tokens)")
    if thresholds.require_crosscheck:
        if result.crosscheck_agreed is None:
            reasons.append("no privacy accountant: the prompt is not differentially private (real records)")
        elif not result.crosscheck_agreed:
            reasons.append("the accountant cross-check disagreed (prv-accountant vs dp-accounting PLD)")
    return (not reasons, tuple(reasons))
