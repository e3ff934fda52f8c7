"""The audit planned before it runs (`dpcore.audit.design`), checked against simulated audits.

The detect gate (the default):
- simulated no-leak audits (scores drawn, the real `auc_mean_ci` and `gate`) fail at most 1 - confidence of
  the time, and at most the design's predicted false-alarm rate;
- simulated audits where one attack reaches the leak AUC fail at least the design's predicted power;
- at defaults the designs are tens of records per side; a design that cannot reach the power is said
  in one line naming what would.

The equivalence band (`--audit-test equivalence`):
- the predicted half-width is the one `audit_statistics.auc_mean_ci` gives no-leak trials;
- the predicted probability of concluding is a lower bound of the simulated rate;
- the independent trials of a small pool are those `trial_samples` and `independent_trials` make;
- the cheapest conclusive design and the pool a conclusive audit needs are consistent;
- a run's audit is sized, said or skipped from public counts; a release audit that cannot
  conclude is refused before any model loads.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpcore.audit import design as audit_design
from dpcore.audit.config import AuditConfig
from dpcore.audit.gate import GateThresholds, gate
from dpcore.audit.procedures import trial_samples
from dpcore.audit.statistics import AttackMetrics, auc_mean_ci, family_confidence, independent_trials, roc_auc
from dpcore.config import RunConfig
from dpcore.errors import ReleaseRefusedError

CONFIDENCE, TOLERANCE = 0.95, 0.05
BAND = {"test": "equivalence"}  # the equivalence band's designs (`--audit-test equivalence`)
DETECT = {"test": "detect", "leak_auc": 0.75, "power": 0.95}  # the default gate's


def _simulated(design: audit_design.AuditDesign, audits: int, seed: int = 0) -> tuple[float, float]:
    """(mean realised half-width, share of audits concluded) of no-leak audits of `design`, attacks independent:
    every trial's AUC at once (pairwise counts; no ties, so each equals `roc_auc`), then the real `auc_mean_ci`."""
    rng = np.random.default_rng(seed)
    m, k, n = design.members, design.non_members, design.independent_trials
    members = rng.normal(size=(audits, design.attacks, n, m))
    non_members = rng.normal(size=(audits, design.attacks, n, k))
    aucs = (members[..., :, None] > non_members[..., None, :]).mean(axis=(-1, -2))
    assert aucs[0, 0, 0] == pytest.approx(roc_auc(members[0, 0, 0], non_members[0, 0, 0]), abs=1e-12)
    level = family_confidence(design.confidence, design.attacks)
    halves, concluded = [], 0
    for audit in aucs:
        inside = True
        for trials in audit:
            low, high = auc_mean_ci(trials, m, k, level)
            halves.append((high - low) / 2)
            inside &= 0.5 - design.tolerance <= low and high <= 0.5 + design.tolerance
        concluded += inside
    return float(np.mean(halves)), concluded / audits


def test_the_predicted_interval_is_the_one_no_leak_trials_get():
    design = audit_design.plan(400, 400, members=20, non_members=20, trials=20, attacks=3, confidence=CONFIDENCE,
                               tolerance=TOLERANCE, **BAND)
    half, _ = _simulated(design, audits=60)
    # realised variance is floored at the predicted (null) one and scatters just above it
    assert design.half_width <= half <= 1.15 * design.half_width


@pytest.mark.parametrize("members", [30, 12])
def test_the_predicted_probability_of_concluding_is_a_lower_bound(members):
    design = audit_design.plan(5000, 5000, members=members, non_members=members, trials=50, attacks=3,
                               confidence=CONFIDENCE, tolerance=TOLERANCE, **BAND)
    _, rate = _simulated(design, audits=150, seed=members)
    assert rate >= design.conclusive_probability - 0.06  # Monte Carlo slack of 150 audits
    assert rate <= design.conclusive_probability + 0.35  # and not a vacuous bound


def test_a_small_pool_caps_the_independent_trials_as_the_audit_does():
    rng = np.random.default_rng(1)
    members = trial_samples(rng, 120, 25, 20)
    non_members = trial_samples(rng, 300, 25, 20)
    rows = [{"global_trial": t, "member": True, "record_id": f"m{i}"} for t, ids in enumerate(members) for i in ids]
    rows += [{"global_trial": t, "member": False, "record_id": f"n{i}"} for t, ids in enumerate(non_members)
             for i in ids]
    design = audit_design.plan(120, 300, members=25, non_members=25, trials=20, attacks=5, confidence=CONFIDENCE,
                               tolerance=TOLERANCE, **BAND)
    assert design.independent_trials == independent_trials(pd.DataFrame(rows)) == 120 // 25


def test_no_trial_fits_a_pool_smaller_than_a_trial():
    design = audit_design.plan(10, 300, members=25, non_members=25, trials=20, attacks=5, confidence=CONFIDENCE,
                               tolerance=TOLERANCE, **BAND)
    assert design.independent_trials == 0 and design.conclusive_probability == 0.0


def test_the_pool_needed_is_where_a_conclusive_design_begins():
    needed = audit_design.pool_needed(attacks=5, confidence=CONFIDENCE, tolerance=TOLERANCE, **BAND)
    assert audit_design.cheapest_conclusive(needed, needed, attacks=5, confidence=CONFIDENCE,
                                            tolerance=TOLERANCE, **BAND).conclusive
    short = int(needed * 0.9)
    assert not audit_design.cheapest_conclusive(short, short, attacks=5, confidence=CONFIDENCE,
                                                tolerance=TOLERANCE, **BAND).conclusive
    assert audit_design.pool_needed(attacks=5, confidence=CONFIDENCE, tolerance=0.1, **BAND) < needed / 3
    assert audit_design.pool_needed(attacks=3, confidence=CONFIDENCE, tolerance=TOLERANCE, **BAND) < needed


def test_the_cheapest_conclusive_design_is_conclusive_and_cheaper_than_the_default():
    chosen = audit_design.cheapest_conclusive(4000, 4000, attacks=5, confidence=CONFIDENCE, tolerance=TOLERANCE, **BAND)
    default = audit_design.plan(4000, 4000, members=50, non_members=50, trials=20, attacks=5, confidence=CONFIDENCE,
                                tolerance=TOLERANCE, **BAND)
    assert chosen.conclusive and not default.conclusive
    assert chosen.scored_records < 4000


def test_the_line_names_the_pool_that_falls_short_and_a_band_that_would_do():
    chosen = audit_design.cheapest_conclusive(20, 3000, attacks=5, confidence=CONFIDENCE, tolerance=TOLERANCE, **BAND)
    line = audit_design.cannot_conclude(chosen, 20, 3000, members_are="the records the mechanism read",
                                        non_members_are="the held-out records")
    assert "the records the mechanism read (20)" in line and "held-out records (3000)" not in line
    reach = audit_design.tolerance_reachable(20, 3000, attacks=5, confidence=CONFIDENCE)
    assert f"--auc-tolerance {reach:g}" in line and reach > TOLERANCE
    assert audit_design.cheapest_conclusive(20, 3000, attacks=5, confidence=CONFIDENCE, tolerance=reach, **BAND).conclusive
    held_out_short = audit_design.cheapest_conclusive(3000, 296, attacks=5, confidence=CONFIDENCE,
                                                      tolerance=TOLERANCE, **BAND)
    line = audit_design.cannot_conclude(held_out_short, 3000, 296, members_are="members", non_members_are="held-out")
    assert "held-out (296)" in line and "members (3000)" not in line


# --------------------------------------------------------------------------- the detect gate


def _gate_failures(design: audit_design.AuditDesign, audits: int, leak: float, seed: int) -> float:
    """Share of simulated audits of `design` that the detect gate fails: binormal scores, the first attack's
    members shifted to AUC `leak` (the others no-leak), per-trial AUCs, then the real `auc_mean_ci` at the
    family-wise level and the real `gate`."""
    rng = np.random.default_rng(seed)
    m, k, n, attacks = design.members, design.non_members, design.independent_trials, design.attacks
    members = rng.normal(size=(audits, attacks, n, m))
    members[:, 0] += math.sqrt(2) * stats.norm.ppf(leak)  # P(member > non-member) = leak
    non_members = rng.normal(size=(audits, attacks, n, k))
    aucs = (members[..., :, None] > non_members[..., None, :]).mean(axis=(-1, -2))  # no ties: = roc_auc
    assert aucs[0, 0, 0] == roc_auc(members[0, 0, 0], non_members[0, 0, 0])
    level = family_confidence(design.confidence, attacks)
    failed = 0
    for audit in aucs:
        metrics = tuple(AttackMetrics(f"attack{i}", float(trials.mean()), auc_mean_ci(trials, m, k, level),
                                      tuple(trials), math.nan, 0.0, 0.0, 0.0) for i, trials in enumerate(audit))
        result = SimpleNamespace(auc=metrics[0].auc, auc_ci=metrics[0].auc_ci, confidence=design.confidence,
                                 max_overlap_tokens=0, overlapping_records=0, crosscheck_agreed=True,
                                 attacks=metrics)
        failed += not gate(result, GateThresholds(test="detect"))[0]
    return failed / audits


def _sd(rate: float, audits: int) -> float:
    return math.sqrt(rate * (1 - rate) / audits)


# the designs the default audit runs: a released prompt's on pools of 300 and 40 members, and a default
# run-demos audit's (20 demo sets of a Tang run, 2 trials each)
DEFAULT_DESIGNS = {"pools of 300": (300, 300), "40 members": (40, 300)}


@pytest.mark.parametrize("pools", DEFAULT_DESIGNS.values(), ids=DEFAULT_DESIGNS.keys())
def test_the_detect_design_is_tens_of_records_and_its_rates_hold_in_simulated_audits(pools):
    design = audit_design.cheapest_conclusive(*pools, attacks=3, confidence=CONFIDENCE, **DETECT)
    assert design.conclusive and design.power >= 0.95 and design.false_alarm <= 1 - CONFIDENCE
    assert design.members * design.trials <= 60 and design.non_members * design.trials <= 200
    audits = 800
    alarms = _gate_failures(design, audits, leak=0.5, seed=1)
    assert alarms <= (1 - CONFIDENCE) + 3 * _sd(1 - CONFIDENCE, audits)
    assert alarms <= design.false_alarm + 3 * _sd(design.false_alarm, audits)
    detected = _gate_failures(design, audits, leak=0.75, seed=2)
    assert detected >= design.power - 3 * _sd(design.power, audits)


def test_a_runs_default_audit_is_run_demos_and_detects_with_a_few_records_per_demo():
    from tasks.audit import run_audit_design

    audit_config, design, note = run_audit_design(RunConfig(dataset="sst2"), {"a": 1000, "b": 1000}, 300)
    assert note is None and audit_config.mode == "run-demos" and audit_config.test == "detect"
    assert design.trials == 4 * audit_config.trials  # 2 labels x 2 demos per label (the seeds choose among them)
    assert design.conclusive and design.scored_records <= 200
    alarms = _gate_failures(design, 600, leak=0.5, seed=3)
    assert alarms <= (1 - CONFIDENCE) + 3 * _sd(1 - CONFIDENCE, 600)
    # a separate test file need not share the private records' distribution: a tenth of the private file is held
    # out as the non-members instead, and nothing more is charged
    with_test_file = RunConfig(dataset="sst2", test_path="test.csv")
    assert with_test_file.audit_config().mode == "run-demos" and with_test_file.audit_holdout_fraction == 0.1
    assert RunConfig(dataset="sst2", test_path="test.csv", audit_holdout=0.25).audit_holdout_fraction == 0.25
    assert RunConfig(dataset="sst2").audit_holdout_fraction is None  # the test split is held out already
    for unread in ({"audit": False}, {"audit_mode": "regenerate"}):  # no run-demos audit: every record is read
        assert RunConfig(dataset="sst2", test_path="test.csv", **unread).audit_holdout_fraction is None


def test_a_detect_design_that_cannot_reach_the_power_names_what_would():
    chosen = audit_design.cheapest_conclusive(20, 3000, attacks=5, confidence=CONFIDENCE, **DETECT)
    assert not chosen.conclusive and chosen.power < 0.95
    line = audit_design.cannot_conclude(chosen, 20, 3000, members_are="the records the mechanism read",
                                        non_members_are="the held-out records")
    assert line.startswith("the membership audit cannot detect a leak of AUC 0.75 with power 0.95")
    assert "the records the mechanism read (20)" in line and "held-out records (3000)" not in line
    reach = audit_design.leak_reachable(20, 3000, attacks=5, confidence=CONFIDENCE, power=0.95)
    assert f"--leak-auc {reach:g}" in line and reach > 0.75
    assert audit_design.cheapest_conclusive(20, 3000, attacks=5, confidence=CONFIDENCE,
                                            **{**DETECT, "leak_auc": reach}).conclusive
    assert "--audit-power" in line  # (three attacks would not reach it either: not offered)
    assert "--audit-reference-prompts 0" not in line
    # the line's numbers are sizes and configuration: declared public counts
    from dpcore.public_outputs import declared_lines
    assert any(__import__("re").search(pattern, line) for pattern in declared_lines())
    assert audit_design.pool_needed(attacks=3, confidence=CONFIDENCE, **DETECT) < 100


# --------------------------------------------------------------------------- where the plan is used


def test_a_runs_audit_is_sized_said_or_skipped_from_public_counts():
    from tasks.audit import run_audit_design

    # the band needs several regenerated demo sets on these pools (a run's default is one)
    band = dict(dataset="sst2", audit_test="equivalence", audit_mode="regenerate", audit_demo_sets=3)
    sized, design, note = run_audit_design(RunConfig(**band), {"a": 2000, "b": 2000}, 300)
    assert note is None and design.conclusive
    assert (sized.members, sized.trials * 3) == (design.members, design.trials)  # 3 demo sets
    skipped, _, note = run_audit_design(RunConfig(**band), {"a": 300, "b": 300}, 300)
    assert skipped is None and note.startswith("audit skipped") and "--auc-tolerance" in note
    asked, _, note = run_audit_design(RunConfig(**band, audit_trials=2, audit_members=5),
                                      {"a": 300, "b": 300}, 300)
    assert (asked.trials, asked.members) == (2, 5) and "running it as asked" in note


def test_a_release_audit_that_cannot_conclude_is_refused_before_the_model():
    from tasks.release import planned_audit

    with pytest.raises(ReleaseRefusedError, match=r"the records the mechanism read \(20\)"):
        planned_audit(AuditConfig(test="equivalence"), 20, 2300, size_to_pools=True)
    sized = planned_audit(AuditConfig(test="equivalence"), 4000, 4004, size_to_pools=True)
    assert sized.members * sized.trials <= 4000 and (sized.members, sized.trials) != (50, 20)


def test_the_non_private_reference_is_sized_for_the_gate_and_refuses_a_copied_record():
    """Real records as 1-shot demos (one member per trial): the fewest trials that detect the default leak,
    drawn disjointly from the split; a prompt that leaks as a copied record does (AUC near 1) is refused by
    practically every audit of that size, and a sound one passes at the design's false-alarm rate."""
    from tasks.audit import reference_design

    sized, design = reference_design(AuditConfig(), 2000)
    assert design.conclusive and design.members == 1 and design.power >= 0.95
    assert (sized.trials, sized.non_members) == (design.trials, design.non_members)
    assert design.trials * (1 + design.non_members) <= 2000 and design.scored_records <= 200
    audits = 800
    assert _gate_failures(design, audits, leak=0.5, seed=3) <= design.false_alarm + 3 * _sd(design.false_alarm, audits)
    assert _gate_failures(design, audits, leak=0.75, seed=4) >= design.power - 3 * _sd(design.power, audits)
    assert _gate_failures(design, audits, leak=0.98, seed=5) >= 0.99
    # a split too small for the trials the power needs: the strongest design it holds, not conclusive
    small, design = reference_design(AuditConfig(), 40)
    assert not design.conclusive and small.trials * (1 + small.non_members) <= 40
