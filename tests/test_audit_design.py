"""The audit planned before it runs (`dpcore.audit.design`), checked against simulated audits.

- the predicted half-width is the one `audit_statistics.auc_mean_ci` gives no-leak trials;
- the predicted probability of concluding is a lower bound of the simulated rate;
- the independent trials of a small pool are those `trial_samples` and `independent_trials` make;
- the cheapest conclusive design and the pool a conclusive audit needs are consistent;
- a run's audit is sized, said or skipped from public counts; a release audit that cannot
  conclude is refused before any model loads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpcore.audit import design as audit_design
from dpcore.audit.procedures import trial_samples
from dpcore.audit.statistics import auc_mean_ci, family_confidence, independent_trials, roc_auc
from dpcore.config import AuditConfig, RunConfig
from dpcore.errors import ReleaseRefusedError

CONFIDENCE, TOLERANCE = 0.95, 0.05


def _simulated(design: audit_design.AuditDesign, audits: int, seed: int = 0) -> tuple[float, float]:
    """(mean realised half-width, share of audits concluded) of no-leak audits of `design`, attacks independent."""
    rng = np.random.default_rng(seed)
    level = family_confidence(design.confidence, design.attacks)
    halves, concluded = [], 0
    for _ in range(audits):
        inside = True
        for _ in range(design.attacks):
            aucs = [roc_auc(rng.normal(size=design.members), rng.normal(size=design.non_members))
                    for _ in range(design.independent_trials)]
            low, high = auc_mean_ci(aucs, design.members, design.non_members, level)
            halves.append((high - low) / 2)
            inside &= 0.5 - design.tolerance <= low and high <= 0.5 + design.tolerance
        concluded += inside
    return float(np.mean(halves)), concluded / audits


def test_the_predicted_interval_is_the_one_no_leak_trials_get():
    design = audit_design.plan(400, 400, members=20, non_members=20, trials=20, attacks=3, confidence=CONFIDENCE,
                               tolerance=TOLERANCE)
    half, _ = _simulated(design, audits=60)
    # realised variance is floored at the predicted (null) one and scatters just above it
    assert design.half_width <= half <= 1.15 * design.half_width


@pytest.mark.parametrize("members", [30, 12])
def test_the_predicted_probability_of_concluding_is_a_lower_bound(members):
    design = audit_design.plan(5000, 5000, members=members, non_members=members, trials=50, attacks=3,
                               confidence=CONFIDENCE, tolerance=TOLERANCE)
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
                               tolerance=TOLERANCE)
    assert design.independent_trials == independent_trials(pd.DataFrame(rows)) == 120 // 25


def test_no_trial_fits_a_pool_smaller_than_a_trial():
    design = audit_design.plan(10, 300, members=25, non_members=25, trials=20, attacks=5, confidence=CONFIDENCE,
                               tolerance=TOLERANCE)
    assert design.independent_trials == 0 and design.conclusive_probability == 0.0


def test_the_pool_needed_is_where_a_conclusive_design_begins():
    needed = audit_design.pool_needed(attacks=5, confidence=CONFIDENCE, tolerance=TOLERANCE)
    assert audit_design.cheapest_conclusive(needed, needed, attacks=5, confidence=CONFIDENCE,
                                            tolerance=TOLERANCE).conclusive
    short = int(needed * 0.9)
    assert not audit_design.cheapest_conclusive(short, short, attacks=5, confidence=CONFIDENCE,
                                                tolerance=TOLERANCE).conclusive
    assert audit_design.pool_needed(attacks=5, confidence=CONFIDENCE, tolerance=0.1) < needed / 3
    assert audit_design.pool_needed(attacks=3, confidence=CONFIDENCE, tolerance=TOLERANCE) < needed


def test_the_cheapest_conclusive_design_is_conclusive_and_cheaper_than_the_default():
    chosen = audit_design.cheapest_conclusive(4000, 4000, attacks=5, confidence=CONFIDENCE, tolerance=TOLERANCE)
    default = audit_design.plan(4000, 4000, members=50, non_members=50, trials=20, attacks=5, confidence=CONFIDENCE,
                                tolerance=TOLERANCE)
    assert chosen.conclusive and not default.conclusive
    assert chosen.scored_records < 4000


def test_the_line_names_the_pool_that_falls_short_and_a_band_that_would_do():
    chosen = audit_design.cheapest_conclusive(20, 3000, attacks=5, confidence=CONFIDENCE, tolerance=TOLERANCE)
    line = audit_design.cannot_conclude(chosen, 20, 3000, members_are="the records the mechanism read",
                                        non_members_are="the held-out records")
    assert "the records the mechanism read (20)" in line and "held-out records (3000)" not in line
    reach = audit_design.tolerance_reachable(20, 3000, attacks=5, confidence=CONFIDENCE)
    assert f"--auc-tolerance {reach:g}" in line and reach > TOLERANCE
    assert audit_design.cheapest_conclusive(20, 3000, attacks=5, confidence=CONFIDENCE, tolerance=reach).conclusive
    held_out_short = audit_design.cheapest_conclusive(3000, 296, attacks=5, confidence=CONFIDENCE,
                                                      tolerance=TOLERANCE)
    line = audit_design.cannot_conclude(held_out_short, 3000, 296, members_are="members", non_members_are="held-out")
    assert "held-out (296)" in line and "members (3000)" not in line


# --------------------------------------------------------------------------- where the plan is used


def test_a_runs_audit_is_sized_said_or_skipped_from_public_counts():
    from tasks.audit import run_audit_design

    sized, design, note = run_audit_design(RunConfig(dataset="sst2"), {"a": 2000, "b": 2000}, 300)
    assert note is None and design.conclusive
    assert (sized.members, sized.trials * 3) == (design.members, design.trials)  # 3 demo sets
    skipped, _, note = run_audit_design(RunConfig(dataset="sst2"), {"a": 300, "b": 300}, 300)
    assert skipped is None and note.startswith("audit skipped") and "--auc-tolerance" in note
    asked, _, note = run_audit_design(RunConfig(dataset="sst2", audit_trials=2, audit_members=5),
                                      {"a": 300, "b": 300}, 300)
    assert (asked.trials, asked.members) == (2, 5) and "running it as asked" in note


def test_a_release_audit_that_cannot_conclude_is_refused_before_the_model():
    from tasks.release import planned_audit

    with pytest.raises(ReleaseRefusedError, match=r"the records the mechanism read \(20\)"):
        planned_audit(AuditConfig(), 20, 2300, size_to_pools=True)
    sized = planned_audit(AuditConfig(), 4000, 4004, size_to_pools=True)
    assert sized.members * sized.trials <= 4000 and (sized.members, sized.trials) != (50, 20)
