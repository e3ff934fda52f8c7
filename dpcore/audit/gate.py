"""The membership audit's release gate: pass/fail with one reason per failing condition.

An audit passes when every attack's mean AUC stays within 0.5 +/- tolerance with an
interval narrow enough to tell (family-wise over the attacks, `dpcore.audit.statistics`),
no demonstration copies `overlap_threshold` consecutive tokens of a private record
(`dpcore.audit.overlap`), and the two accountants agreed (`dpcore.privacy.composition`'s cross-check).
The reasons name no figure: the AUCs, intervals, TPRs, overlap lengths and even which attack was
strongest are non-DP statistics of the private records, so they stay in the private audit table (an
operator's diagnostic). What reaches the public side is the verdict and these figure-free reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcore.audit.statistics import AttackMetrics
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


def gate(result, thresholds: GateThresholds | None = None) -> tuple[bool, tuple[str, ...]]:
    """Pass/fail of an audit and every failing reason (one line each; empty when it passes).

    `result` needs: auc, auc_ci, confidence, max_overlap_tokens, overlapping_records and
    crosscheck_agreed (True/False, or None when no accountant applies: a non-private prompt);
    `attacks` (AttackMetrics, one per attack) when several attacks ran, otherwise its own
    auc/auc_ci is the one attack. Conditions, over EVERY attack (the worst case):
    1. each attack's averaged AUC lies within 0.5 +/- auc_tolerance (two-sided: a score that
       ranks members LOWER is a distinguisher too);
    2. each attack's CI (`auc_mean_ci`, at the family-wise level) lies inside the band
       [0.5 - tolerance, 0.5 + tolerance]; otherwise the audit cannot tell (inconclusive).
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
        reasons.append(f"membership inference: an attack's AUC is outside 0.5 +/- {tol:g} (the figures are in "
                       "the private audit table)")
    wide = [a for a in attacks if math.isnan(a.auc_ci[0]) or a.auc_ci[1] - a.auc_ci[0] > 2 * tol]
    # Two-sided: the interval itself must lie inside the band, not only the mean (an interval that
    # straddles the band's edge cannot tell a leak from chance).
    straddling = [a for a in attacks if a not in wide and abs(a.auc - 0.5) <= tol
                  and not (0.5 - tol <= a.auc_ci[0] and a.auc_ci[1] <= 0.5 + tol)]
    if wide or straddling:
        recurring = any(a.independent_trials is not None and a.independent_trials < len(a.trial_aucs)
                        for a in wide + straddling)
        # which pool ran short is the planner's to say (`dpcore.audit.design`); the gate only knows records recurred
        remedy = ("its trials re-score the same records (a member or non-member pool holds fewer records than its "
                  "trials draw); a design sized to the pools (`dpcore.audit.design`: leave the trial and member "
                  "counts unset) or more records narrow it" if recurring else "run more trials or demo sets")
        reasons.append(f"audit inconclusive: the {level} interval of the AUC does not lie inside the band "
                       f"0.5 +/- {tol:g}; {remedy}")
    if result.max_overlap_tokens >= thresholds.overlap_threshold:
        reasons.append(f"verbatim overlap: a demonstration shares {thresholds.overlap_threshold} or more "
                       "consecutive tokens with a private record")
    if thresholds.require_crosscheck:
        if result.crosscheck_agreed is None:
            reasons.append("no privacy accountant: the prompt is not differentially private (real records)")
        elif not result.crosscheck_agreed:
            reasons.append("the accountant cross-check disagreed (prv-accountant vs dp-accounting PLD)")
    return (not reasons, tuple(reasons))
