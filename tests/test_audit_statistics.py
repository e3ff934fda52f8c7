"""Audit statistics (dpcore.audit.statistics): ROC/AUC, empirical epsilon bounds, AUC intervals, hand-computed."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpcore.audit.statistics import (
    auc_mean_ci,
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_epsilon_lower_bound,
    epsilon_bounds_at,
    family_confidence,
    independent_trials,
    null_auc_variance,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
from dpcore.errors import ConfigError

# --------------------------------------------------------------------------- AUC and ROC


def brute_auc(members, non_members):
    wins = sum(1.0 if m > n else 0.5 if m == n else 0.0 for m, n in product(members, non_members))
    return wins / (len(members) * len(non_members))


def test_auc_hand_computed():
    # pairs (3,1) (3,2) (2,1) win, (2,2) ties: 3.5 / 4
    assert roc_auc([3, 2], [1, 2]) == pytest.approx(0.875)
    assert roc_auc([5, 6], [1, 2, 3]) == 1.0
    assert roc_auc([1, 2], [5, 6, 7]) == 0.0
    assert roc_auc([1, 1, 1], [1, 1]) == 0.5
    # one member against 50 non-members (Duan et al.'s trial): the fraction ranked below it
    assert roc_auc([0.7], list(np.linspace(0, 1, 50))) == pytest.approx(35 / 50)


def test_auc_matches_pairwise_count_with_ties():
    rng = np.random.default_rng(1)
    for _ in range(20):
        members = rng.integers(0, 6, size=rng.integers(1, 12))
        non_members = rng.integers(0, 6, size=rng.integers(1, 12))
        assert roc_auc(members, non_members) == pytest.approx(brute_auc(members, non_members))
        assert roc_curve(members, non_members).auc() == pytest.approx(brute_auc(members, non_members))


def test_roc_curve_points():
    curve = roc_curve([3, 2], [1, 2])
    assert curve.thresholds.tolist() == [math.inf, 3, 2, 1]
    assert curve.tpr.tolist() == [0, 0.5, 1, 1]
    assert curve.fpr.tolist() == [0, 0, 0.5, 1]


def test_tpr_at_fpr_hand_computed():
    members, non_members = [3, 2, 1.5], [1, 2, 0, 0.5]
    # threshold 3: TPR 1/3 at FPR 0; threshold 1.5: TPR 1 at FPR 1/4; threshold 1: FPR 1/2
    assert tpr_at_fpr(members, non_members, 0.0) == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, non_members, 0.2) == pytest.approx(1 / 3)
    assert tpr_at_fpr(members, non_members, 0.25) == pytest.approx(1.0)
    # a tie at the top: no threshold separates it, so FPR 0 gives TPR 0
    assert tpr_at_fpr([5, 1], [5, 0], 0.0) == 0.0
    assert tpr_at_fpr([5, 1], [5, 0], 0.5) == 1.0  # threshold 1: both members, one non-member
    with pytest.raises(ConfigError, match="fpr"):
        tpr_at_fpr([1], [0], 1.5)


def test_scores_must_be_finite_and_present():
    with pytest.raises(ConfigError, match="member_scores"):
        roc_auc([], [1.0])
    with pytest.raises(ConfigError, match="non_member_scores"):
        roc_auc([1.0], [np.nan])


# --------------------------------------------------------------------------- epsilon lower bound


def test_clopper_pearson_closed_forms():
    alpha = 0.025
    assert clopper_pearson_lower(10, 10, alpha) == pytest.approx(alpha ** (1 / 10))
    assert clopper_pearson_upper(0, 100, alpha) == pytest.approx(1 - alpha ** (1 / 100))
    assert clopper_pearson_lower(0, 10, alpha) == 0.0
    assert clopper_pearson_upper(10, 10, alpha) == 1.0
    lo, hi = clopper_pearson_lower(30, 100, alpha), clopper_pearson_upper(30, 100, alpha)
    assert lo < 0.3 < hi and hi - lo < 0.2


def test_epsilon_bound_formula_hand_computed():
    alpha = 0.025
    tpr_lo = alpha ** (1 / 10)  # all 10 members flagged
    fpr_hi = 1 - alpha ** (1 / 100)  # no non-member of 100 flagged
    expected = max(math.log(tpr_lo / fpr_hi), math.log((1 - fpr_hi) / (1 - tpr_lo)))
    assert epsilon_bounds_at(10, 10, 0, 100, 0.0, alpha) == pytest.approx(expected)
    delta = 0.1
    expected_delta = max(math.log((tpr_lo - delta) / fpr_hi), math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    assert epsilon_bounds_at(10, 10, 0, 100, delta, alpha) == pytest.approx(expected_delta)
    # TPR_lo below delta and 1 - FPR_hi below delta: no bound at all
    assert epsilon_bounds_at(1, 100, 99, 100, 0.5, alpha) == -math.inf


def test_epsilon_bound_zero_for_identical_distributions():
    positives = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        members, non_members = rng.normal(size=500), rng.normal(size=500)
        bound = empirical_epsilon_lower_bound(members, non_members, delta=1e-3, confidence=0.95)
        assert bound.method == "holdout" and bound.epsilon >= 0
        positives += bound.epsilon > 0
    assert positives <= 6  # at 95% confidence about 2 of 40 may exceed 0 by chance
    rng = np.random.default_rng(0)
    bonferroni = empirical_epsilon_lower_bound(rng.normal(size=2000), rng.normal(size=2000), 0.0, 0.95,
                                               method="bonferroni")
    assert bonferroni.epsilon == pytest.approx(0.0, abs=0.05)


def test_epsilon_bound_large_for_separated_scores():
    members, non_members = np.linspace(1, 2, 1000), np.linspace(-1, 0, 1000)
    bound = empirical_epsilon_lower_bound(members, non_members, delta=0.0, confidence=0.95)
    # each holdout half: 500 vs 500, all separated; two orientations at alpha/2 each, two Clopper-Pearson
    # bounds at alpha/4 each: log(0.0125^(1/500) / (1 - 0.0125^(1/500)))
    q = 0.0125 ** (1 / 500)
    assert bound.epsilon == pytest.approx(math.log(q / (1 - q)), rel=1e-6)
    # two-sided: an attack that ranks members LOWER gets the same bound, not 0
    reversed_ = empirical_epsilon_lower_bound(-members, -non_members, delta=0.0, confidence=0.95)
    assert reversed_.epsilon == pytest.approx(bound.epsilon, rel=1e-9)
    bonferroni = empirical_epsilon_lower_bound(members, non_members, 0.0, 0.95, method="bonferroni")
    assert 3.5 < bonferroni.epsilon < bound.epsilon + 1
    # higher confidence, lower bound
    assert empirical_epsilon_lower_bound(members, non_members, 0.0, 0.999).epsilon < bound.epsilon


def test_epsilon_bound_groups_and_fallback():
    members, non_members = np.linspace(1, 2, 40), np.linspace(-1, 0, 40)
    grouped = empirical_epsilon_lower_bound(members, non_members, member_groups=np.arange(40) // 2,
                                            non_member_groups=np.arange(40) // 2)
    assert grouped.method == "holdout" and grouped.epsilon > 0
    single = empirical_epsilon_lower_bound(members, non_members, member_groups=np.zeros(40, int),
                                           non_member_groups=np.zeros(40, int))
    assert single.method == "bonferroni"
    with pytest.raises(ConfigError, match="confidence"):
        empirical_epsilon_lower_bound(members, non_members, confidence=1.0)


# --------------------------------------------------------------------------- AUC interval


def test_auc_interval():
    assert null_auc_variance(50, 50) == pytest.approx(101 / 30000)
    # agreeing trials cannot shrink the interval below the no-leakage spread (Hanley-McNeil floor)
    low, high = auc_mean_ci([0.5] * 20, 30, 30, 0.95)
    half = stats.t.ppf(0.975, 19) * math.sqrt(61 / (12 * 900) / 20)
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    # spread-out trials: the sample variance, Student t with n - 1 degrees of freedom
    values = np.array([0.2, 0.9, 0.4, 0.8, 0.6])
    low, high = auc_mean_ci(values, 50, 50, 0.9)
    half = stats.t.ppf(0.95, 4) * values.std(ddof=1) / math.sqrt(5)
    assert (low, high) == (pytest.approx(0.58 - half), pytest.approx(0.58 + half))
    assert all(math.isnan(v) for v in auc_mean_ci([0.5], 50, 50))
    # coverage under no leakage: simulated trials of 30 vs 30 from one distribution (200 audits of 10 trials)
    rng = np.random.default_rng(0)
    covered = 0
    for aucs in _pairwise_aucs(rng.normal(size=(200, 10, 30)), rng.normal(size=(200, 10, 30))):
        low, high = auc_mean_ci(aucs, 30, 30, 0.95)
        covered += low <= 0.5 <= high
    assert covered >= 0.92 * 200


def _pairwise_aucs(members: np.ndarray, non_members: np.ndarray) -> np.ndarray:
    """Every trial's AUC at once (the last axis holds a trial's scores): the share of member/non-member pairs
    the member wins; continuous scores have no ties, so each is `roc_auc`'s (checked on the first)."""
    aucs = (members[..., :, None] > non_members[..., None, :]).mean(axis=(-1, -2))
    first = (0,) * (members.ndim - 1)
    assert aucs[first] == pytest.approx(roc_auc(members[first], non_members[first]), abs=1e-12)
    return aucs


def _null_trials(rng, member_ids, non_member_pool: int, per_trial: int, trials: int) -> pd.DataFrame:
    """Scores with no leakage (one distribution per record): `member_ids` in every trial, fresh non-members."""
    score = dict(enumerate(rng.normal(size=len(member_ids) + non_member_pool)))
    rows = []
    for trial in range(trials):
        others = rng.choice(non_member_pool, size=per_trial, replace=False) + len(member_ids)
        rows += [(trial, True, int(i), score[int(i)]) for i in member_ids]
        rows += [(trial, False, int(i), score[int(i)]) for i in others]
    return pd.DataFrame(rows, columns=["global_trial", "member", "record_id", "score"]).assign(attack="a")


def test_trials_that_reuse_the_same_members_count_once():
    """A prompt that read 10 records, audited with 10 members in each of 20 trials: the trials are not
    independent samples. Counted as 20 the interval covers no-leakage far too rarely; counted as the one
    sample they are, it covers at the stated level."""
    rng = np.random.default_rng(11)
    covered = {"as 20": 0, "independent": 0}
    assert independent_trials(_null_trials(rng, np.arange(10), 200, 10, 20)) == 1
    # the same draws as `_null_trials` (the 10 members in every trial, 10 fresh non-members of 200), in arrays:
    # 300 audits of 20 trials
    score = rng.normal(size=(300, 210))
    others = 10 + np.argsort(rng.random(size=(300, 20, 200)), axis=-1)[..., :10]  # 10 of 200, no repeats
    members = np.broadcast_to(score[:, None, :10], (300, 20, 10))
    for aucs in _pairwise_aucs(members, np.take_along_axis(score[:, None, :], others, axis=-1)):
        low, high = auc_mean_ci(aucs, 10, 10, 0.95)
        covered["as 20"] += low <= 0.5 <= high
        low, high = auc_mean_ci(aucs, 10, 10, 0.95, independent=1)
        covered["independent"] += low <= 0.5 <= high
    assert covered["independent"] >= 0.93 * 300
    assert covered["as 20"] <= 0.85 * 300
    # disjoint trials count in full; a pool that fills 3 disjoint trials counts 3
    fresh = _null_trials(rng, np.arange(10), 200, 10, 1)
    disjoint = pd.concat([fresh.assign(global_trial=t, record_id=fresh.record_id + 1000 * t) for t in range(5)])
    assert independent_trials(disjoint) == 5
    cycled = pd.concat([_null_trials(rng, np.arange(10) + 10 * (t % 3), 200, 10, 1).assign(global_trial=t)
                        for t in range(8)])  # 8 trials cycling through 3 disjoint member sets
    assert independent_trials(cycled) == 3
    with pytest.raises(ConfigError, match="independent"):
        auc_mean_ci([0.5, 0.6], 10, 10, independent=3)


def test_auc_interval_stays_within_bounds():
    # two trials of 1 member vs 50 (a step function): the t interval alone is about [-3.9, 5.0]
    low, high = auc_mean_ci([0.2, 0.9], 1, 50, 0.95)
    assert (low, high) == (0.0, 1.0)
    low, high = auc_mean_ci([1.0, 1.0, 1.0, 0.96], 1, 50, 0.95)
    assert 0 <= low < high == 1.0
    rng = np.random.default_rng(3)
    for _ in range(200):
        values = rng.uniform(0, 1, size=rng.integers(2, 6))
        low, high = auc_mean_ci(values, 1, int(rng.integers(1, 60)), float(rng.uniform(0.5, 0.999)))
        assert 0.0 <= low <= values.mean() <= high <= 1.0
    # inside the bounds nothing changes (the gate's band never reaches them)
    values = np.array([0.48, 0.52, 0.5, 0.49])
    half = stats.t.ppf(0.975, 3) * math.sqrt(max(values.var(ddof=1), 101 / 30000) / 4)
    assert auc_mean_ci(values, 50, 50) == (pytest.approx(0.4975 - half), pytest.approx(0.4975 + half))


def test_family_confidence_is_bonferroni():
    assert family_confidence(0.95, 5) == pytest.approx(0.99)
    assert family_confidence(0.9, 1) == pytest.approx(0.9)
    with pytest.raises(ConfigError):
        family_confidence(0.95, 0)
