"""The audit's release gate (dpcore.audit.gate): one reason per failing condition, worst case over the attacks;
the detect test (the default) and the equivalence band (`--audit-test equivalence`)."""

from __future__ import annotations

import math
from types import SimpleNamespace

from dpcore.audit.gate import GateThresholds, gate
from dpcore.audit.statistics import AttackMetrics, strongest_attack

BAND = GateThresholds(test="equivalence")


def _result(**overrides):
    values = dict(auc=0.5, auc_ci=(0.48, 0.52), confidence=0.95, max_overlap_tokens=3, overlapping_records=0,
                  crosscheck_agreed=True)
    values.update(overrides)
    return SimpleNamespace(**values)


def test_gate_passes_a_clean_result():
    assert gate(_result(), BAND) == (True, ())


def test_gate_reasons_one_per_condition():
    passed, reasons = gate(_result(auc=0.81, auc_ci=(0.77, 0.85), max_overlap_tokens=42, overlapping_records=3,
                                   crosscheck_agreed=False), BAND)
    assert not passed and len(reasons) == 3
    assert "an attack's AUC is outside 0.5 +/- 0.05" in reasons[0]
    assert "8 or more consecutive tokens" in reasons[1]
    # the public reasons hold no figure of the private records: no AUC, no overlap length, no count
    assert not any(figure in " ".join(reasons) for figure in ("0.81", "0.77", "0.85", "42", "3 record"))
    assert "cross-check disagreed" in reasons[2]
    assert all("\n" not in reason for reason in reasons)
    # a score ranking members LOWER is a distinguisher too
    assert not gate(_result(auc=0.4, auc_ci=(0.38, 0.42)), BAND)[0]
    # an audit too small to resolve the band is inconclusive, not a pass
    passed, reasons = gate(_result(auc=0.52, auc_ci=(0.40, 0.64)), BAND)
    assert not passed and reasons[0].startswith("audit inconclusive")
    passed, reasons = gate(_result(auc_ci=(math.nan, math.nan)), BAND)
    assert not passed and reasons[0].startswith("audit inconclusive")
    # two-sided: the mean inside the band is not enough, the interval must lie inside it too
    passed, reasons = gate(_result(auc=0.54, auc_ci=(0.496, 0.589)), BAND)
    assert not passed and reasons[0].startswith("audit inconclusive")
    assert gate(_result(auc=0.53, auc_ci=(0.51, 0.549)), BAND)[0]
    # no accountant (real records in the prompt)
    passed, reasons = gate(_result(crosscheck_agreed=None), BAND)
    assert not passed and "not differentially private" in reasons[0]
    assert gate(_result(crosscheck_agreed=None), GateThresholds(require_crosscheck=False, test="equivalence"))[0]
    # configurable thresholds
    assert gate(_result(auc=0.56, auc_ci=(0.54, 0.58)), GateThresholds(auc_tolerance=0.1, test="equivalence"))[0]
    assert not gate(_result(max_overlap_tokens=5), GateThresholds(overlap_threshold=5, test="equivalence"))[0]


def _metrics(name, auc, ci):
    return AttackMetrics(name, auc, ci, (), auc, 0.0, 0.0, 0.0)


def test_gate_reads_the_strongest_attack():
    attacks = (_metrics("duan", 0.52, (0.49, 0.55)), _metrics("text-calibrated", 0.93, (0.90, 0.96)),
               _metrics("lira-text", 0.61, (0.58, 0.64)))
    assert strongest_attack(attacks).attack == "text-calibrated"
    # a score that ranks members LOWER is as strong
    assert strongest_attack((_metrics("a", 0.6, (0, 1)), _metrics("b", 0.35, (0, 1)))).attack == "b"
    def result(attacks):
        return SimpleNamespace(auc=0.52, auc_ci=(0.49, 0.55), confidence=0.95, max_overlap_tokens=0,
                               overlapping_records=0, crosscheck_agreed=True, attacks=attacks)

    passed, reasons = gate(result(attacks), BAND)
    assert not passed and len(reasons) == 1
    assert "outside 0.5 +/- 0.05" in reasons[0]
    assert "0.93" not in reasons[0] and "text-calibrated" not in reasons[0]  # which attack won is private too
    # every attack must be conclusive: one wide interval makes the audit inconclusive
    calm = (_metrics("duan", 0.5, (0.48, 0.52)), _metrics("lira-text", 0.51, (0.40, 0.62)))
    passed, reasons = gate(result(calm), BAND)
    assert not passed and reasons[0].startswith("audit inconclusive")
    fine = (_metrics("duan", 0.5, (0.48, 0.52)), _metrics("lira-text", 0.51, (0.47, 0.55)))
    assert gate(result(fine), BAND)[0]


def test_an_audit_that_re_scores_the_same_records_says_so():
    """A prompt whose mechanism read 10 records, audited with 10 members in each of 20 trials: one
    independent trial's worth, so more trials cannot make it conclusive, and the reason says why."""
    def result(attack):
        return SimpleNamespace(auc=attack.auc, auc_ci=attack.auc_ci, confidence=0.95, max_overlap_tokens=0,
                               overlapping_records=0, crosscheck_agreed=True, attacks=(attack,))

    recurring = AttackMetrics("duan", 0.55, (0.29, 0.81), (0.55,) * 20, 0.55, 0.0, 0.0, 0.0, independent_trials=1)
    passed, reasons = gate(result(recurring), BAND)
    assert not passed and reasons[-1].startswith("audit inconclusive")
    assert "its trials re-score the same records" in reasons[-1]
    assert recurring.summary()["independent_trials"] == 1
    fresh = AttackMetrics("duan", 0.52, (0.40, 0.64), (0.52,) * 20, 0.52, 0.0, 0.0, 0.0, independent_trials=20)
    assert gate(result(fresh), BAND)[1][-1].endswith("run more trials or demo sets")
    assert fresh.summary()["independent_trials"] == 20


def test_the_detect_gate_fails_an_attack_whose_interval_excludes_one_half():
    """detect (the default): an attack distinguishes members when its interval excludes 0.5, on either side; an
    interval that contains 0.5 passes however wide; the reasons and the pass statement hold no figure."""
    from dpcore.audit.gate import pass_statement

    assert gate(_result()) == (True, ())
    assert gate(_result(auc=0.52, auc_ci=(0.40, 0.64)))[0]  # wide, but no leak seen: a pass (the power says how much)
    for leaking in (_result(auc=0.81, auc_ci=(0.7, 0.92)), _result(auc=0.3, auc_ci=(0.2, 0.4))):
        passed, reasons = gate(leaking)
        assert not passed and len(reasons) == 1
        assert reasons[0].startswith("membership inference: an attack distinguishes members from non-members")
        assert not any(figure in reasons[0] for figure in ("0.81", "0.7", "0.92", "0.3", "0.2", "0.4"))
    attacks = (_metrics("duan", 0.5, (0.45, 0.55)), _metrics("text-calibrated", 0.7, (0.56, 0.84)))
    passed, reasons = gate(_result(attacks=attacks))
    assert not passed and "text-calibrated" not in reasons[0]
    passed, reasons = gate(_result(auc_ci=(math.nan, math.nan)))  # no interval: nothing could be detected
    assert not passed and reasons[0].startswith("membership audit too small")
    # the other conditions as in the band
    passed, reasons = gate(_result(max_overlap_tokens=42, crosscheck_agreed=None))
    assert not passed and len(reasons) == 2
    assert pass_statement("detect", 0.75, 0.953, 0.95) == ("no leak of AUC >= 0.75 detected (power 0.95, false "
                                                            "alarm <= 0.05)")


def test_sizes_below_the_power_asked_make_the_detect_audit_inconclusive_never_a_pass():
    """A user's own trial and member counts may be too few to detect the leak size asked: their audit's
    interval covers 0.5 whatever leaks, so it says inconclusive (figure-free), never "no leak detected"."""
    from dpcore.audit.procedures import verdict_word

    asked = GateThresholds(leak_auc=0.75, power=0.95)
    assert gate(_result(auc_ci=(0.1, 0.9), power=0.96), asked) == (True, ())
    passed, reasons = gate(_result(auc_ci=(0.1, 0.9), power=0.30), asked)
    assert not passed and len(reasons) == 1 and verdict_word(passed, reasons) == "inconclusive"
    assert "AUC >= 0.75" in reasons[0] and "0.3" not in reasons[0]
    # a detected leak is a failure whatever the power
    passed, reasons = gate(_result(auc=0.9, auc_ci=(0.8, 0.95), power=0.30), asked)
    assert not passed and verdict_word(passed, reasons) == "failed"
