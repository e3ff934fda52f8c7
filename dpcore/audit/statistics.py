"""Statistics of a membership-inference audit: ROC/AUC, empirical epsilon bounds, intervals.

Pure functions over score arrays (members vs non-members; higher score = member), tested
against hand-computed cases:

- `roc_auc` (Mann-Whitney U / (n_1 n_0)), `roc_curve` (every achievable threshold),
  `tpr_at_fpr` (no interpolation);
- `empirical_epsilon_lower_bound`: the auditing view of Jagielski et al. (2020) with the
  hypothesis-test inequalities of Kairouz et al. (2015) and one-sided Clopper-Pearson bounds
  (`epsilon_bounds_at`); the threshold is chosen on one half of the trials and bounded on the
  other ("holdout") or Bonferroni-corrected over all thresholds;
- `auc_mean_ci`: Student-t interval of the mean per-trial AUC, the per-trial variance
  floored at the Hanley & McNeil (1982) null variance, within [0, 1];
- `family_confidence`: Bonferroni over the attacks, so the gate's false-alarm rate stays at
  about 1 - confidence however many attacks it reads;
- `attack_metrics`: all of the above per attack, from an audit's long-format score table
  (`dpcore.audit.procedures.MIA_SCORE_COLUMNS` plus `global_trial`); `strongest_attack` is the one the
  gate reads (largest |AUC - 0.5|).

Inputs and outputs are scores, counts and figures: no record text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from dpcore.errors import ConfigError

# =========================================================================== ROC statistics


def _scores(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float).ravel()
    if array.size == 0:
        raise ConfigError(f"{name}: needs at least one score")
    if not np.all(np.isfinite(array)):
        raise ConfigError(f"{name}: scores must be finite numbers")
    return array


def roc_auc(member_scores, non_member_scores) -> float:
    """ROC AUC of the rule "higher score = member": the Mann-Whitney U statistic / (n_1 n_0).

    AUC = P(S_member > S_non_member) + 1/2 P(S_member = S_non_member) over all
    member/non-member pairs (ties count one half), computed from average ranks.
    """
    members = _scores(member_scores, "member_scores")
    non_members = _scores(non_member_scores, "non_member_scores")
    ranks = stats.rankdata(np.concatenate([members, non_members]))  # ties get their average rank
    n1, n0 = len(members), len(non_members)
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    return float(u / (n1 * n0))


@dataclass(frozen=True)
class RocCurve:
    """Operating points of the rule "member iff score >= threshold", thresholds descending.

    The first threshold is +inf (nothing flagged: TPR = FPR = 0); then every distinct
    observed score, so the last point flags everything (TPR = FPR = 1). Tied scores move
    together (no randomised thresholds), so the curve's points are all achievable tests.
    """

    thresholds: np.ndarray
    true_positives: np.ndarray
    false_positives: np.ndarray
    members: int
    non_members: int

    @property
    def tpr(self) -> np.ndarray:
        return self.true_positives / self.members

    @property
    def fpr(self) -> np.ndarray:
        return self.false_positives / self.non_members

    def auc(self) -> float:
        """Trapezoid area under these points: equals `roc_auc` (ties give the diagonal segment)."""
        return float(np.trapezoid(self.tpr, self.fpr))


def roc_curve(member_scores, non_member_scores) -> RocCurve:
    members = np.sort(_scores(member_scores, "member_scores"))
    non_members = np.sort(_scores(non_member_scores, "non_member_scores"))
    distinct = np.unique(np.concatenate([members, non_members]))[::-1]
    tp = len(members) - np.searchsorted(members, distinct, side="left")  # count of members >= threshold
    fp = len(non_members) - np.searchsorted(non_members, distinct, side="left")
    return RocCurve(
        thresholds=np.concatenate([[np.inf], distinct]),
        true_positives=np.concatenate([[0], tp]).astype(np.int64),
        false_positives=np.concatenate([[0], fp]).astype(np.int64),
        members=len(members),
        non_members=len(non_members),
    )


def tpr_at_fpr(member_scores, non_member_scores, fpr: float) -> float:
    """The largest TPR among the thresholds whose FPR <= `fpr` (no interpolation between points).

    With n_0 non-members the smallest non-zero FPR is 1/n_0: below it only the thresholds
    flagging no non-member count (so TPR@0.1% needs n_0 >= 1000 to mean more than TPR@0).
    """
    if not 0 <= fpr <= 1:
        raise ConfigError(f"fpr: must lie in [0, 1], got {fpr}")
    curve = roc_curve(member_scores, non_member_scores)
    allowed = curve.false_positives <= fpr * curve.non_members + 1e-9
    return float(curve.tpr[allowed].max())  # the +inf threshold (FPR 0) is always allowed


# =========================================================================== empirical epsilon


def clopper_pearson_lower(successes, trials, alpha: float) -> np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson lower bound of a binomial proportion."""
    k = np.asarray(successes, dtype=float)
    n = np.asarray(trials, dtype=float)
    with np.errstate(invalid="ignore"):
        bound = stats.beta.ppf(alpha, k, n - k + 1)
    return np.where(k <= 0, 0.0, bound)


def clopper_pearson_upper(successes, trials, alpha: float) -> np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson upper bound of a binomial proportion."""
    k = np.asarray(successes, dtype=float)
    n = np.asarray(trials, dtype=float)
    with np.errstate(invalid="ignore"):
        bound = stats.beta.ppf(1 - alpha, k + 1, n - k)
    return np.where(k >= n, 1.0, bound)


def epsilon_bounds_at(true_positives, members: int, false_positives, non_members: int, delta: float,
                      alpha: float) -> np.ndarray:
    """Per-threshold epsilon lower bound from the (epsilon, delta)-DP hypothesis-test inequalities.

    (epsilon, delta)-DP forces, for every test: TPR <= e^eps FPR + delta and
    1 - FPR <= e^eps (1 - TPR) + delta (Kairouz et al. 2015). With TPR_lo and FPR_hi
    one-sided Clopper-Pearson bounds at level `alpha` each (so both hold with
    probability >= 1 - 2 alpha):

        eps >= max( log((TPR_lo - delta) / FPR_hi),  log((1 - FPR_hi - delta) / (1 - TPR_lo)) ).

    Both terms use TPR_lo and FPR_hi: a lower bound of (1 - FPR - delta)/(1 - TPR) needs
    the largest plausible FPR and the smallest plausible TPR. Terms whose numerator is
    <= 0 give no bound (-inf). Not clipped at 0 here.
    """
    tpr_lo = clopper_pearson_lower(true_positives, members, alpha)
    fpr_hi = clopper_pearson_upper(false_positives, non_members, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(tpr_lo - delta > 0, np.log(np.maximum(tpr_lo - delta, 1e-300) / fpr_hi), -np.inf)
        numerator = 1.0 - fpr_hi - delta
        second = np.where(numerator > 0, np.log(np.maximum(numerator, 1e-300) / (1.0 - tpr_lo)), -np.inf)
    return np.maximum(first, second)


@dataclass(frozen=True)
class EpsilonLowerBound:
    epsilon: float  # >= 0; 0 means no evidence of leakage beyond the inequalities
    confidence: float
    delta: float
    method: str  # "holdout" | "bonferroni"
    threshold: float  # the chosen threshold (nan when none gives a positive bound)
    thresholds_tried: int


def _counts_at(threshold: float, members: np.ndarray, non_members: np.ndarray) -> tuple[int, int]:
    return int((members >= threshold).sum()), int((non_members >= threshold).sum())


def empirical_epsilon_lower_bound(member_scores, non_member_scores, delta: float = 0.0,
                                  confidence: float = 0.95, method: str = "holdout",
                                  member_groups=None, non_member_groups=None) -> EpsilonLowerBound:
    """An empirical lower bound on epsilon from the pooled ROC (the auditing view of Jagielski et al. 2020).

    The claim: with probability >= `confidence`, the scores' mechanism is not
    (eps, delta)-DP for any eps below the returned value. Maximising over thresholds is a
    multiple comparison, accounted for by one of:

    - "holdout" (default, used by the audits): the scores are split by group parity
      (`*_groups`, e.g. the trial number; by position when not given). The threshold is
      the one maximising the bound on the even half; the bound is then computed on the
      odd half at that single threshold, with each of its two Clopper-Pearson bounds at
      level alpha/2 (alpha = 1 - confidence; union bound). The threshold never sees the
      half it is evaluated on, so no further correction is needed.
    - "bonferroni": every distinct observed score is a threshold (T of them); each of
      the 2T one-sided bounds at level alpha/(2T). Uses all the data but the thresholds
      are data-dependent, so this is the customary approximation, not a strict bound.

    Both orientations are tried (members scoring higher, or lower), each at half the error level.

    The Clopper-Pearson intervals assume independent outcomes. Scores of one trial share
    a prompt (and the trials of a DP demo set share its demos), so read the bound as an
    estimate at the stated confidence, not as a certificate. Returned epsilon is >= 0.
    """
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence: must lie in (0, 1), got {confidence}")
    if not 0 <= delta < 1:
        raise ConfigError(f"delta: must lie in [0, 1), got {delta}")
    members = _scores(member_scores, "member_scores")
    non_members = _scores(non_member_scores, "non_member_scores")
    # Two-sided: a score that ranks members LOWER distinguishes them as well (DP's inequalities hold for
    # every test, the reversed one too). Each orientation at half the error level (a union bound).
    level = 1.0 - (1.0 - confidence) / 2
    bounds = [(sign, _one_orientation_bound(sign * members, sign * non_members, delta, level, method,
                                            member_groups, non_member_groups)) for sign in (1.0, -1.0)]
    sign, best = max(bounds, key=lambda pair: pair[1].epsilon)
    return EpsilonLowerBound(best.epsilon, confidence, delta, best.method, sign * best.threshold,
                             best.thresholds_tried)


def _one_orientation_bound(members, non_members, delta: float, confidence: float, method: str,
                           member_groups, non_member_groups) -> EpsilonLowerBound:
    """`empirical_epsilon_lower_bound` for the tests "member when the score is at least a threshold"."""
    alpha = 1.0 - confidence
    if method == "holdout":
        m_groups = np.arange(len(members)) if member_groups is None else np.asarray(member_groups)
        n_groups = np.arange(len(non_members)) if non_member_groups is None else np.asarray(non_member_groups)
        if len(m_groups) != len(members) or len(n_groups) != len(non_members):
            raise ConfigError("member_groups/non_member_groups: one group per score")
        m_even, n_even = (m_groups % 2) == 0, (n_groups % 2) == 0
        halves_ok = m_even.any() and (~m_even).any() and n_even.any() and (~n_even).any()
        if halves_ok:
            curve = roc_curve(members[m_even], non_members[n_even])
            bounds = epsilon_bounds_at(curve.true_positives[1:], curve.members, curve.false_positives[1:],
                                       curve.non_members, delta, alpha / 2)
            if not np.any(bounds > 0):
                return EpsilonLowerBound(0.0, confidence, delta, "holdout", math.nan, len(bounds))
            threshold = float(curve.thresholds[1:][int(np.argmax(bounds))])
            tp, fp = _counts_at(threshold, members[~m_even], non_members[~n_even])
            value = float(epsilon_bounds_at(tp, int((~m_even).sum()), fp, int((~n_even).sum()), delta,
                                            alpha / 2))
            return EpsilonLowerBound(max(0.0, value), confidence, delta, "holdout", threshold, len(bounds))
        method = "bonferroni"  # too few groups to split: fall back, and say so in `method`
    if method != "bonferroni":
        raise ConfigError(f"method: {method!r} is not 'holdout' or 'bonferroni'")
    curve = roc_curve(members, non_members)
    tried = len(curve.thresholds) - 1
    bounds = epsilon_bounds_at(curve.true_positives[1:], curve.members, curve.false_positives[1:],
                               curve.non_members, delta, alpha / (2 * tried))
    best = int(np.argmax(bounds))
    value = float(bounds[best])
    threshold = float(curve.thresholds[1:][best]) if value > 0 else math.nan
    return EpsilonLowerBound(max(0.0, value), confidence, delta, "bonferroni", threshold, tried)


# =========================================================================== AUC confidence interval


def null_auc_variance(members: int, non_members: int) -> float:
    """Variance of the AUC of `members` vs `non_members` scores from one distribution (no ties):
    (n_1 + n_0 + 1) / (12 n_1 n_0), Hanley & McNeil (1982) at AUC = 0.5 (Mann-Whitney null)."""
    return (members + non_members + 1) / (12.0 * members * non_members)


def auc_mean_ci(trial_aucs, members: int, non_members: int, confidence: float = 0.95,
                independent: int | None = None) -> tuple[float, float]:
    """Two-sided Student-t interval for the mean of per-trial AUCs.

    The per-trial variance is the sample variance, floored at the Hanley-McNeil variance of
    an AUC under no leakage for the trial's sizes (`null_auc_variance`): a handful of
    trials that happen to agree cannot make the interval falsely narrow. Trials are
    independent given the prompt when they use disjoint records; when records recur across
    trials (a pool too small to fill them disjointly) only `independent` trials' worth of
    records was drawn (`independent_trials`), and the interval counts that many samples
    (n - 1 degrees of freedom; with one, the normal interval of a single trial's AUC), so
    trials re-scoring the same few members cannot make it narrow either. Fewer than two
    trials: (nan, nan).

    An AUC lies in [0, 1], so the interval is intersected with [0, 1] (with few trials the
    t interval can reach far outside it). The intersection never changes the gate: an
    interval no wider than 0.5 +/- tolerance around a mean inside that band cannot reach 0 or 1.
    """
    values = np.asarray(trial_aucs, dtype=float)
    if len(values) < 2:
        return (math.nan, math.nan)
    samples = len(values) if independent is None else int(independent)
    if not 1 <= samples <= len(values):
        raise ConfigError(f"independent: must be between 1 and the {len(values)} trials, got {independent}")
    variance = max(float(values.var(ddof=1)), null_auc_variance(members, non_members))
    quantile = (stats.t.ppf(0.5 + confidence / 2, samples - 1) if samples >= 2
                else stats.norm.ppf(0.5 + confidence / 2))
    half = float(quantile) * math.sqrt(variance / samples)
    mean = float(values.mean())
    return (max(0.0, mean - half), min(1.0, mean + half))


def independent_trials(scores: pd.DataFrame) -> int:
    """How many disjoint trials the scored records could fill: min(trials, distinct members //
    members per trial, distinct non-members // non-members per trial), at least 1. Equal to the
    number of trials when every trial drew fresh records (`dpcore.audit.procedures.trial_samples` does when
    the pool allows); smaller when records recur (a prompt whose mechanism read few records)."""
    trials = int(scores["global_trial"].nunique())
    counts = []
    for is_member in (True, False):
        side = scores.loc[scores["member"].to_numpy(dtype=bool) == is_member]
        per_trial = int(side.groupby("global_trial")["record_id"].nunique().max())
        counts.append(int(side["record_id"].nunique()) // per_trial)
    return max(1, min(trials, *counts))


def family_confidence(confidence: float, tests: int) -> float:
    """Bonferroni: the level of each of `tests` intervals so that all hold together with `confidence`."""
    if tests < 1:
        raise ConfigError(f"tests: must be >= 1, got {tests}")
    return 1.0 - (1.0 - confidence) / tests


# =========================================================================== per attack


@dataclass(frozen=True)
class AttackMetrics:
    """One attack's figures in one audit (`auc_ci` at the family-wise level: Bonferroni over the attacks)."""

    attack: str
    auc: float  # mean of the per-trial AUCs
    auc_ci: tuple[float, float]
    trial_aucs: tuple[float, ...]
    pooled_auc: float
    tpr_at_1pct_fpr: float  # pooled over trials
    tpr_at_01pct_fpr: float
    epsilon_lower_bound: float
    independent_trials: int | None = None  # the samples `auc_ci` counts (None: every trial)

    def summary(self) -> dict:
        return {"attack": self.attack, "auc": self.auc, "auc_ci": list(self.auc_ci), "pooled_auc": self.pooled_auc,
                "tpr_at_1pct_fpr": self.tpr_at_1pct_fpr, "tpr_at_01pct_fpr": self.tpr_at_01pct_fpr,
                "epsilon_lower_bound": self.epsilon_lower_bound,
                "independent_trials": self.independent_trials or len(self.trial_aucs)}


def strongest_attack(attacks: Sequence):
    """The attack the gate reads: the largest |AUC - 0.5| (a score ranking members LOWER distinguishes
    too); ties go to the first in the given order."""
    if not attacks:
        raise ConfigError("attacks: needs at least one attack")
    return max(attacks, key=lambda a: abs(a.auc - 0.5))


def attack_metrics(scores: pd.DataFrame, members: int, non_members: int, confidence: float,
                   delta: float) -> tuple[AttackMetrics, ...]:
    """Per attack (in order of appearance): per-trial AUCs (`global_trial` groups), their mean and
    interval (over `independent_trials` samples when records recur across trials), pooled TPR at 1% / 0.1% FPR, pooled AUC and the empirical epsilon bound. Intervals and
    bounds are at the Bonferroni level over the attacks (`family_confidence`)."""
    names = list(dict.fromkeys(scores["attack"].tolist()))
    level = family_confidence(confidence, len(names))
    out = []
    for name in names:
        sub = scores.loc[scores["attack"] == name]
        aucs, independent = [], independent_trials(sub)
        for _, trial in sub.groupby("global_trial", sort=True):
            member = trial["member"].to_numpy(dtype=bool)
            values = trial["score"].to_numpy(dtype=float)
            aucs.append(roc_auc(values[member], values[~member]))
        pooled = _pooled_metrics(sub, level, delta)
        out.append(AttackMetrics(
            attack=name, auc=float(np.mean(aucs)),
            auc_ci=auc_mean_ci(aucs, members, non_members, level, min(independent, len(aucs))),
            trial_aucs=tuple(float(a) for a in aucs), pooled_auc=pooled["pooled_auc"],
            tpr_at_1pct_fpr=pooled["tpr_at_1pct_fpr"], tpr_at_01pct_fpr=pooled["tpr_at_01pct_fpr"],
            epsilon_lower_bound=pooled["epsilon_lower_bound"], independent_trials=min(independent, len(aucs)),
        ))
    return tuple(out)


def _pooled_metrics(scores: pd.DataFrame, confidence: float, delta: float) -> dict:
    member = scores["member"].to_numpy(dtype=bool)
    values = scores["score"].to_numpy(dtype=float)
    groups = scores["global_trial"].to_numpy()
    bound = empirical_epsilon_lower_bound(values[member], values[~member], delta=delta, confidence=confidence,
                                          method="holdout", member_groups=groups[member],
                                          non_member_groups=groups[~member])
    return {
        "tpr_at_1pct_fpr": tpr_at_fpr(values[member], values[~member], 0.01),
        "tpr_at_01pct_fpr": tpr_at_fpr(values[member], values[~member], 0.001),
        "pooled_auc": roc_auc(values[member], values[~member]),
        "epsilon_lower_bound": bound.epsilon,
        "epsilon_lower_bound_method": f"{bound.method} (trial parity)",
    }
