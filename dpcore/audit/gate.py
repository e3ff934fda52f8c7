"""The membership audit's release gate: pass/fail with one reason per failing condition.

Two tests of the attacks' AUCs (`AuditConfig.test`; each attack's interval of the mean per-trial AUC is
family-wise over the attacks, `dpcore.audit.statistics`):

- detect (the default): H0 "no leak" (AUC 0.5). The gate fails when some attack's interval excludes
  0.5, on either side (a score ranking members lower is a distinguisher too): when nothing leaks that
  happens with probability <= 1 - confidence, and the audit is sized (`dpcore.audit.design`) so that a
  leak of `leak_auc` makes it happen with probability >= `power`. A pass says: no leak of that size
  was detected, at that power; it is no proof of epsilon.
- equivalence: the gate passes only when every attack's interval lies inside 0.5 +/- tolerance; an
  interval that straddles the band cannot tell (inconclusive).

Both also require that no demonstration copies `overlap_threshold` consecutive tokens of a private
record (`dpcore.audit.overlap`) and that the two accountants agreed (`dpcore.privacy.composition`'s
cross-check). The reasons name no figure: the AUCs, intervals, TPRs, overlap lengths and even which attack
was strongest are non-DP statistics of the private records, so they stay in the private audit table (an
operator's diagnostic). What reaches the public side is the verdict, these figure-free reasons and the
configuration's own numbers (the leak, the power, the confidence).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpcore.audit.config import AuditConfig
from dpcore.audit.statistics import AttackMetrics


@dataclass(frozen=True)
class GateThresholds:
    """Release-gate thresholds (the audit gate's defaults)."""

    auc_tolerance: float = 0.05  # equivalence: |AUC - 0.5| must stay within this
    overlap_threshold: int = 8  # a shared run of this many tokens is a verbatim leak
    require_crosscheck: bool = True  # the accountant cross-check must have agreed
    test: str = "detect"  # detect | equivalence (`AuditConfig.test`)
    leak_auc: float = 0.75  # detect: the leak the audit was sized to detect (what a pass speaks of)
    power: float = 0.95  # detect: the power asked

    @classmethod
    def from_config(cls, config: AuditConfig) -> GateThresholds:
        return cls(auc_tolerance=config.auc_tolerance, overlap_threshold=config.overlap_threshold, test=config.test,
                   leak_auc=config.leak_auc, power=config.power)


def pass_statement(test: str, leak_auc: float, power: float, confidence: float) -> str:
    """What a passed audit says, from configuration and public sizes only (detect: `power` is the design's)."""
    if test == "detect":
        return (f"no leak of AUC >= {leak_auc:g} detected (power {power:.2f}, false alarm <= "
                f"{1 - confidence:.2g})")
    return f"every attack's AUC lies within the band at {100 * confidence:g}% confidence"


def gate(result, thresholds: GateThresholds | None = None) -> tuple[bool, tuple[str, ...]]:
    """Pass/fail of an audit and every failing reason (one line each; empty when it passes).

    `result` needs: auc, auc_ci, confidence, max_overlap_tokens, overlapping_records and
    crosscheck_agreed (True/False, or None when no accountant applies: a non-private prompt);
    `attacks` (AttackMetrics, one per attack) when several attacks ran, otherwise its own
    auc/auc_ci is the one attack. Conditions, over EVERY attack (the worst case):
    1. detect: no attack's CI (`auc_mean_ci`, at the family-wise level) excludes 0.5 (two-sided: a
       score that ranks members LOWER is a distinguisher too); under no leakage each interval
       excludes 0.5 with probability <= (1 - confidence) / attacks, so the false-alarm rate stays
       <= 1 - confidence. An attack without an interval (fewer than two independent trials) fails:
       the audit detects nothing it was sized for. Sizes whose power against `leak_auc` is under the
       power asked (a user's own trial and member counts) make the audit inconclusive, never a pass.
       equivalence: each attack's averaged AUC lies within 0.5 +/- auc_tolerance, and its CI lies
       inside the band [0.5 - tolerance, 0.5 + tolerance]; otherwise the audit cannot tell
       (inconclusive). Under no leakage each AUC estimate then leaves the band with probability
       <= (1 - confidence) / attacks (about), so the gate's false-alarm rate stays <= 1 - confidence;
    2. no demo shares `overlap_threshold` or more consecutive tokens with a private record;
    3. the accountant cross-check agreed.
    """
    thresholds = thresholds or GateThresholds()
    attacks = tuple(getattr(result, "attacks", ()) or ())
    if not attacks:
        attacks = (AttackMetrics(getattr(result, "attack", "duan"), result.auc, tuple(result.auc_ci), (), math.nan,
                                 math.nan, math.nan, math.nan),)
    level = f"{100 * result.confidence:g}%" + (f" simultaneous over {len(attacks)} attacks" if len(attacks) > 1 else "")
    if thresholds.test == "equivalence":
        reasons = _equivalence(attacks, thresholds.auc_tolerance, level)
    else:
        reasons = _detect(attacks, level)
        power = getattr(result, "power", None)  # of the sizes run: a function of public counts
        if not reasons and power is not None and power < thresholds.power:
            # a pass must speak of the leak size asked: sizes a user set below it cannot say "no leak" at that power
            reasons.append(f"audit inconclusive: the sizes run detect a leak of AUC >= {thresholds.leak_auc:g} with "
                           f"less than the power asked ({thresholds.power:g}); a design sized to the pools (leave the "
                           "trial and member counts unset) or more trials")
    if result.max_overlap_tokens >= thresholds.overlap_threshold:
        reasons.append(f"verbatim overlap: a demonstration shares {thresholds.overlap_threshold} or more "
                       "consecutive tokens with a private record")
    if thresholds.require_crosscheck:
        if result.crosscheck_agreed is None:
            reasons.append("no privacy accountant: the prompt is not differentially private (real records)")
        elif not result.crosscheck_agreed:
            reasons.append("the accountant cross-check disagreed (prv-accountant vs dp-accounting PLD)")
    return (not reasons, tuple(reasons))


def _detect(attacks, level: str) -> list[str]:
    reasons = []
    if any(a.auc_ci[0] > 0.5 or a.auc_ci[1] < 0.5 for a in attacks):
        reasons.append(f"membership inference: an attack distinguishes members from non-members (its {level} "
                       "interval of the AUC excludes 0.5; the figures are in the private audit table)")
    if any(math.isnan(a.auc_ci[0]) for a in attacks):
        reasons.append("membership audit too small: fewer than two independent trials give no interval of the "
                       "AUC, so no leak could be detected; a design sized to the pools (leave the trial and member "
                       "counts unset) or more records")
    return reasons


def _equivalence(attacks, tol: float, level: str) -> list[str]:
    reasons = []
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
    return reasons
