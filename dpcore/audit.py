"""Membership-inference audit and verbatim-leakage checks.

The prompt under audit is attacked by several scores (`dpcore.mia_attacks`), all computed
from one forward pass per (prompt, record) with the prompt's prefix KV cache:

- `duan`: Duan et al. (2023), Section 3, as used by Tang et al. (2024), Appendix F: the
  model's probability of the record's true label y for input x, normalised over the labels;
- `label-calibrated`, `text-calibrated`: difficulty calibration (Watson et al. 2022): the
  record's label / text log-probability under the prompt minus the same under the task's
  instruction alone (no demonstration);
- `lira-label`, `lira-text`: offline LiRA (Carlini et al. 2022): a z-score of the record's
  score against a Gaussian fitted to its scores under OUT prompts (1-shot prompts of
  reference records that are not candidates).

The gate takes the worst case over the attacks (the largest |AUC - 0.5|); every attack's
interval is at the family-wise level (Bonferroni over the attacks), so checking all of them
keeps the false-alarm rate of the gate at about 1 - confidence.

- `non_private_audit`: Duan et al.'s setting. Each trial prompts with ONE real record
  (1-shot, the member) and scores it against `non_members` random records of the same
  split; the paper reports AUC 0.84 (dbpedia) / 0.82 (Tang et al. Table 15) on GPT-3.
- `dp_audit`: Tang et al. Appendix F. The private records are split into members and
  non-members; DP demonstrations are generated from the members only (Algorithm 1);
  `members` members and `non_members` non-members are scored against the DP prompt in
  `trials` trials for each of `demo_sets` independently generated demo sets.
- `demos_audit`: a run's own DP demonstrations (generated from the whole private split, so
  every private record is a member) against held-out non-members: nothing regenerated,
  nothing charged.

Statistics (pure functions, tested against hand-computed cases; the verbatim check lives in `dpcore.overlap`): `roc_auc` (Mann-Whitney),
`roc_curve`, `tpr_at_fpr`, `empirical_epsilon_lower_bound` (Clopper-Pearson),
`auc_mean_ci` (Student t, Hanley-McNeil floor, within [0, 1]); `verbatim_overlap` (longest
shared token run between a demo and the private records); `gate` (pass/fail, one reason per line).

Privacy: every output here (AuditResult, the `mia_scores` and `audit` tables, the ROC
plot) holds record ids, scores, counts and public configuration, never a record's text.
Overlap is reported as token counts only; the audited demo texts are not kept either (a
sigma = 0 demo may copy a record). `mia_scores` is a per-record table of private data: it
belongs in the private store.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from dpcore.config import AuditConfig, GenerationConfig
from dpcore.errors import ConfigError, DataValidationError
from dpcore.overlap import (  # noqa: F401  (re-exported: the audit's verbatim check)
    OverlapReport,
    model_tokenize,
    verbatim_overlap,
    verbatim_overlap_tokens,
    whitespace_tokenize,
)
from dpcore.taskspec import TaskSpec

log = logging.getLogger(__name__)

MIA_SCORE_COLUMNS = ["setting", "epsilon", "demo_set", "trial", "role", "member", "record_id", "attack", "score"]
AUC_CI_METHOD = ("Student t over trials, per-trial variance >= Hanley-McNeil null variance, within [0, 1]; "
                 "Bonferroni over the attacks")
EPSILON_LB_METHOD = "holdout"  # threshold chosen on even trials, bounded on odd trials (see below)


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


def auc_mean_ci(trial_aucs, members: int, non_members: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Student-t interval for the mean of per-trial AUCs (n - 1 degrees of freedom).

    The per-trial variance is the sample variance, floored at the Hanley-McNeil variance of
    an AUC under no leakage for the trial's sizes (`null_auc_variance`): a handful of
    trials that happen to agree cannot make the interval falsely narrow. Trials are
    independent given the prompt when they use disjoint records (the audits draw them so);
    under leakage, demo sets differ, and that shows in the sample variance. Fewer than two
    trials: (nan, nan).

    An AUC lies in [0, 1], so the interval is intersected with [0, 1] (with few trials the
    t interval can reach far outside it). The intersection never changes the gate: an
    interval no wider than 0.5 +/- tolerance around a mean inside that band cannot reach 0 or 1.
    """
    values = np.asarray(trial_aucs, dtype=float)
    if len(values) < 2:
        return (math.nan, math.nan)
    variance = max(float(values.var(ddof=1)), null_auc_variance(members, non_members))
    half = float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1)) * math.sqrt(variance / len(values))
    mean = float(values.mean())
    return (max(0.0, mean - half), min(1.0, mean + half))


def family_confidence(confidence: float, tests: int) -> float:
    """Bonferroni: the level of each of `tests` intervals so that all hold together with `confidence`."""
    if tests < 1:
        raise ConfigError(f"tests: must be >= 1, got {tests}")
    return 1.0 - (1.0 - confidence) / tests


# =========================================================================== the gate


@dataclass(frozen=True)
class GateThresholds:
    """Release-gate thresholds (the audit gate's defaults)."""

    auc_tolerance: float = 0.05  # |AUC - 0.5| must stay within this
    overlap_threshold: int = 8  # a shared run of this many tokens is a verbatim leak
    require_crosscheck: bool = True  # the accountant cross-check must have agreed

    @classmethod
    def from_config(cls, config: AuditConfig) -> GateThresholds:
        return cls(auc_tolerance=config.auc_tolerance, overlap_threshold=config.overlap_threshold)


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

    def summary(self) -> dict:
        return {"attack": self.attack, "auc": self.auc, "auc_ci": list(self.auc_ci), "pooled_auc": self.pooled_auc,
                "tpr_at_1pct_fpr": self.tpr_at_1pct_fpr, "tpr_at_01pct_fpr": self.tpr_at_01pct_fpr,
                "epsilon_lower_bound": self.epsilon_lower_bound}


def strongest_attack(attacks: Sequence):
    """The attack the gate reads: the largest |AUC - 0.5| (a score ranking members LOWER distinguishes
    too); ties go to the first in the given order."""
    if not attacks:
        raise ConfigError("attacks: needs at least one attack")
    return max(attacks, key=lambda a: abs(a.auc - 0.5))


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
        reasons.append(f"audit inconclusive: the {level} CI of the AUC {_ci_text(widest.auc_ci)} ({widest.attack} "
                       f"attack) is wider than the band 0.5 +/- {tol:g}; run more trials or demo sets")
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


# =========================================================================== result


@dataclass(frozen=True)
class AuditResult:
    """One audit: metrics, verdict and the per-record scores (`mia_scores`: ids and scores, no text).

    The headline figures (auc, auc_ci, trial_aucs, tpr_*, pooled_auc, epsilon_lower_bound) are
    those of the strongest attack (`attack`); `attacks` holds every attack's.
    """

    setting: str  # "non-private" | "dp" | "instruction-only"
    epsilon: float  # target epsilon of the audited demos (inf: non-private / sigma = 0)
    noise_multiplier: float | None
    delta: float
    auc: float  # mean of the per-trial AUCs (Duan et al.; Tang et al. Table 15)
    auc_ci: tuple[float, float]
    trial_aucs: tuple[float, ...]
    trials: int  # total trials (over all demo sets)
    demo_sets: int
    members_per_trial: int
    non_members_per_trial: int
    tpr_at_1pct_fpr: float  # pooled over trials
    tpr_at_01pct_fpr: float
    pooled_auc: float
    epsilon_lower_bound: float
    confidence: float
    max_overlap_tokens: int
    overlapping_records: int
    overlap_threshold: int
    crosscheck_agreed: bool | None
    model: str
    dataset: str
    seconds: float
    passed: bool = False
    reasons: tuple[str, ...] = ()
    auc_ci_method: str = AUC_CI_METHOD
    epsilon_lower_bound_method: str = EPSILON_LB_METHOD
    overlap_tokenizer: str = "model"
    attack: str = "duan"
    attacks: tuple[AttackMetrics, ...] = ()
    mia_scores: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MIA_SCORE_COLUMNS),
                                     repr=False, compare=False)

    def summary(self) -> dict:
        """Scalars for JSON, logs and MLflow metrics (public: no record text, no per-record data)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("mia_scores", "trial_aucs", "attacks")}
        out["auc_ci"] = list(self.auc_ci)
        out["reasons"] = list(self.reasons)
        out["attacks"] = [a.summary() for a in self.attacks]
        return out

    def audit_frame(self) -> pd.DataFrame:
        """The one-row `audit` table; `reasons` one per line (what dpcore.release reads); each attack's
        AUC, interval, TPR at 1% FPR and epsilon bound as `<figure>_<attack>` columns."""
        row = self.summary()
        low, high = row.pop("auc_ci")
        row.pop("attacks")
        row.update(auc_ci_low=low, auc_ci_high=high, reasons="\n".join(self.reasons),
                   trial_aucs=list(self.trial_aucs),
                   noise_multiplier=math.nan if self.noise_multiplier is None else self.noise_multiplier,
                   crosscheck_agreed=self.crosscheck_agreed)
        for a in self.attacks:
            key = a.attack.replace("-", "_")
            row.update({f"auc_{key}": a.auc, f"auc_ci_low_{key}": a.auc_ci[0], f"auc_ci_high_{key}": a.auc_ci[1],
                        f"tpr_at_1pct_fpr_{key}": a.tpr_at_1pct_fpr,
                        f"epsilon_lower_bound_{key}": a.epsilon_lower_bound})
        frame = pd.DataFrame([row])
        frame["crosscheck_agreed"] = frame["crosscheck_agreed"].astype("boolean")
        return frame


def attack_metrics(scores: pd.DataFrame, members: int, non_members: int, confidence: float,
                   delta: float) -> tuple[AttackMetrics, ...]:
    """Per attack (in order of appearance): per-trial AUCs (`global_trial` groups), their mean and
    interval, pooled TPR at 1% / 0.1% FPR, pooled AUC and the empirical epsilon bound. Intervals and
    bounds are at the Bonferroni level over the attacks (`family_confidence`)."""
    names = list(dict.fromkeys(scores["attack"].tolist()))
    level = family_confidence(confidence, len(names))
    out = []
    for name in names:
        sub = scores.loc[scores["attack"] == name]
        aucs = []
        for _, trial in sub.groupby("global_trial", sort=True):
            member = trial["member"].to_numpy(dtype=bool)
            values = trial["score"].to_numpy(dtype=float)
            aucs.append(roc_auc(values[member], values[~member]))
        pooled = _pooled_metrics(sub, level, delta)
        out.append(AttackMetrics(
            attack=name, auc=float(np.mean(aucs)), auc_ci=auc_mean_ci(aucs, members, non_members, level),
            trial_aucs=tuple(float(a) for a in aucs), pooled_auc=pooled["pooled_auc"],
            tpr_at_1pct_fpr=pooled["tpr_at_1pct_fpr"], tpr_at_01pct_fpr=pooled["tpr_at_01pct_fpr"],
            epsilon_lower_bound=pooled["epsilon_lower_bound"],
        ))
    return tuple(out)


def _finish(thresholds: GateThresholds, scores: pd.DataFrame, *, confidence: float, delta: float,
            members_per_trial: int, non_members_per_trial: int, **fields) -> AuditResult:
    attacks = attack_metrics(scores, members_per_trial, non_members_per_trial, confidence, delta)
    top = strongest_attack(attacks)
    result = AuditResult(
        auc=top.auc, auc_ci=top.auc_ci, trial_aucs=top.trial_aucs, trials=len(top.trial_aucs),
        tpr_at_1pct_fpr=top.tpr_at_1pct_fpr, tpr_at_01pct_fpr=top.tpr_at_01pct_fpr, pooled_auc=top.pooled_auc,
        epsilon_lower_bound=top.epsilon_lower_bound, epsilon_lower_bound_method="holdout (trial parity)",
        confidence=confidence, delta=delta, members_per_trial=members_per_trial,
        non_members_per_trial=non_members_per_trial, attack=top.attack, attacks=attacks,
        mia_scores=scores[MIA_SCORE_COLUMNS].reset_index(drop=True), **fields)
    passed, reasons = gate(result, thresholds)
    return dataclasses.replace(result, passed=passed, reasons=reasons)


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


# =========================================================================== the attack


def membership_scores(lm, spec: TaskSpec, demos: Sequence[tuple[str, str]], texts: Sequence[str],
                      labels: Sequence[str], batch_size: int = 16) -> np.ndarray:
    """Duan et al. Section 3: p(true label | prompt(demos), x), normalised over the task's labels."""
    label_names = spec.label_names
    index = {name: i for i, name in enumerate(label_names)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise DataValidationError(f"audit: label(s) {', '.join(map(str, unknown))} are not labels of task "
                                  f"{spec.name!r}")
    from dpcore.icl import label_logprobs, normalise_probs

    probs = normalise_probs(label_logprobs(lm, spec, list(demos), list(texts), label_names, batch_size=batch_size))
    return probs[np.arange(len(texts)), [index[label] for label in labels]]


def _check_split(frame: pd.DataFrame, name: str) -> None:
    for column in ("id", "text", "label"):
        if column not in frame.columns:
            raise DataValidationError(f"{name}: missing column {column!r}")


def trial_samples(rng: np.random.Generator, pool_size: int, per_trial: int, trials: int) -> list[np.ndarray]:
    """Row indices for each trial: disjoint across trials when the pool allows (one permutation, sliced),
    so trials are independent samples given the prompt and the interval over trials is honest;
    otherwise independent draws per trial (records then recur across trials: the interval is optimistic,
    a warning is logged)."""
    if per_trial > pool_size:
        raise ConfigError(f"audit_members: {per_trial} records per trial but only {pool_size} in the pool")
    if per_trial * trials <= pool_size:
        order = rng.permutation(pool_size)
        return [order[t * per_trial:(t + 1) * per_trial] for t in range(trials)]
    log.warning("audit: %d trials x %d records exceed the pool of %d: records recur across trials, the AUC "
                "interval is optimistic (fewer trials or more records)", trials, per_trial, pool_size)
    return [rng.choice(pool_size, size=per_trial, replace=False) for _ in range(trials)]


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _trial_frame(scores: dict[str, np.ndarray], record_ids, members: int, *, setting: str, epsilon: float,
                 demo_set: int, trial: int, global_trial: int) -> pd.DataFrame:
    """Long-format rows of one trial: every attack's score of its records (members first)."""
    n = len(record_ids)
    member = np.arange(n) < members
    frames = [pd.DataFrame({
        "setting": setting, "epsilon": float(epsilon), "demo_set": demo_set, "trial": trial,
        "role": np.where(member, "member", "non_member"), "member": member, "record_id": list(record_ids),
        "attack": name, "score": np.asarray(values, dtype=float), "global_trial": global_trial,
    }) for name, values in scores.items()]
    return pd.concat(frames, ignore_index=True)


def _out_rows(rng: np.random.Generator, pool: np.ndarray, count: int) -> np.ndarray:
    """OUT-prompt records: `count` rows of `pool` (fewer when the pool is smaller; LiRA needs 2)."""
    count = min(count, len(pool))
    if count < 2:
        return np.zeros(0, dtype=np.int64)
    return np.sort(rng.choice(pool, size=count, replace=False))


def _attack_scores(lm, spec: TaskSpec, prompt, texts: list[str], labels: list[str], refs,
                   batch_size: int) -> dict[str, np.ndarray]:
    from dpcore import mia_attacks

    target = mia_attacks.prompt_scores(lm, spec, prompt, texts, labels, batch_size=batch_size)
    return mia_attacks.attack_scores(target, refs.zero, refs.out)


def non_private_audit(lm, spec: TaskSpec, records: pd.DataFrame, config: AuditConfig, seed=None, *,
                      delta: float | None = None, overlap_records: pd.DataFrame | None = None,
                      thresholds: GateThresholds | None = None, batch_size: int = 16,
                      cache: dict | None = None, progress: Callable[[int, int], None] | None = None) -> AuditResult:
    """Duan et al. Section 3 / Tang et al. Appendix F (eps = inf): real records as 1-shot demos.

    Each of `config.trials` trials draws one member record (the 1-shot demonstration) and
    `config.non_members` other records of `records` (the same private split), scores all
    of them against the 1-shot prompt with every attack (`dpcore.mia_attacks`), and computes
    that trial's AUC per attack (1 member vs the non-members: a step function, Duan et al.
    Figure 2b). Trials use disjoint records when the split is large enough
    (`trial_samples`); the `config.reference_prompts` OUT prompts of the LiRA attacks are
    1-shot prompts of records outside every trial. `seed` (int or Generator) drives all
    sampling. The verbatim check runs on the member demos against `overlap_records`
    (default `records`; the member records are always added), so it reports the demos'
    own lengths: real records ARE verbatim copies. This configuration is leaky by
    design: its gate fails.
    """
    from dpcore import mia_attacks

    began = time.perf_counter()
    _check_split(records, "records")
    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    n = len(records)
    if n < config.non_members + 1:
        raise ConfigError(f"audit_members: {config.non_members} non-members + 1 member need more than the "
                          f"{n} private records")
    rng = _rng(seed)
    texts = records["text"].astype(str).to_numpy()
    labels = records["label"].astype(str).to_numpy()
    ids = records["id"].astype(str).to_numpy()
    delta = 1.0 / n if delta is None else delta
    picks = trial_samples(rng, n, config.non_members + 1, config.trials)
    used = np.unique(np.concatenate(picks))
    out_rows = _out_rows(rng, np.setdiff1d(np.arange(n), used), config.reference_prompts)
    out_demos = [(texts[i], labels[i]) for i in out_rows]
    queries = mia_attacks.truncate_texts(lm, texts[used].tolist(), config.max_record_tokens)
    refs = mia_attacks.reference_scores(lm, spec, queries, labels[used].tolist(), out_demos, batch_size, cache)
    position = {int(row): i for i, row in enumerate(used)}
    frames, member_rows = [], []
    for trial, chosen in enumerate(picks):
        if progress is not None:
            progress(trial, len(picks))
        member = int(chosen[0])
        member_rows.append(member)
        local = [position[int(r)] for r in chosen]
        scores = _attack_scores(lm, spec, [(texts[member], labels[member])], [queries[i] for i in local],
                                labels[chosen].tolist(), refs.take(local), batch_size)
        frames.append(_trial_frame(scores, ids[chosen], 1, setting="non-private", epsilon=math.inf, demo_set=-1,
                                   trial=trial, global_trial=trial))
        log.debug("non-private audit trial %d/%d done", trial + 1, config.trials)
    scores = pd.concat(frames, ignore_index=True)
    pool = records if overlap_records is None else overlap_records
    # The demos themselves are always in the pool: a sample that missed them would hide the copy.
    pool = pd.concat([pool, records.iloc[member_rows]], ignore_index=True).drop_duplicates("id")
    overlap = verbatim_overlap([texts[i] for i in member_rows], pool["text"].astype(str).tolist(),
                               threshold=config.overlap_threshold, tokenize=model_tokenize(lm))
    return _finish(
        thresholds or GateThresholds.from_config(config), scores, confidence=config.confidence, delta=delta,
        members_per_trial=1, non_members_per_trial=config.non_members,
        setting="non-private", epsilon=math.inf, noise_multiplier=None, demo_sets=0,
        max_overlap_tokens=overlap.max_overlap, overlapping_records=overlap.overlapping_records,
        overlap_threshold=config.overlap_threshold, crosscheck_agreed=None, model=lm.name, dataset=spec.name,
        seconds=time.perf_counter() - began, overlap_tokenizer=overlap.tokenizer,
    )


def split_members(records: pd.DataFrame, seed=None, member_fraction: float = 0.5
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tang et al. Appendix F: a seeded random split of the private records into members and non-members.

    Split within each label (stratified), so both halves have the same label mix.
    """
    _check_split(records, "records")
    if not 0 < member_fraction < 1:
        raise ConfigError(f"member_fraction: must lie in (0, 1), got {member_fraction}")
    rng = _rng(seed)
    is_member = np.zeros(len(records), dtype=bool)
    labels = records["label"].astype(str).to_numpy()
    for label in sorted(set(labels)):
        rows = np.flatnonzero(labels == label)
        take = int(round(member_fraction * len(rows)))
        is_member[rng.permutation(rows)[:take]] = True
    return records.loc[is_member].reset_index(drop=True), records.loc[~is_member].reset_index(drop=True)


class _LabelPools:
    """Per label: its members, its OUT-prompt records (non-members reserved for the LiRA references,
    drawn once per label) and the remaining non-members (the candidates)."""

    def __init__(self, members: pd.DataFrame, non_members: pd.DataFrame, config: AuditConfig, rng):
        self.members, self.non_members, self.config, self.rng = members, non_members, config, rng
        self.m_label = members["label"].astype(str).to_numpy()
        self.n_label = non_members["label"].astype(str).to_numpy()
        self._pools: dict[str, tuple] = {}

    def usable(self, label: str) -> bool:
        reserve = self.config.reference_prompts if self.config.reference_prompts >= 2 else 0
        return ((self.m_label == label).sum() >= self.config.members
                and (self.n_label == label).sum() >= self.config.non_members + reserve)

    def get(self, label: str) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple[str, str]]]:
        if label not in self._pools:
            rows = np.flatnonzero(self.n_label == label)
            reserve = self.config.reference_prompts if self.config.reference_prompts >= 2 else 0
            out = _out_rows(self.rng, rows, min(reserve, len(rows) - self.config.non_members))
            label_members = self.members.loc[self.m_label == label].reset_index(drop=True)
            candidates = self.non_members.iloc[np.setdiff1d(rows, out)].reset_index(drop=True)
            out_demos = [(str(t), label) for t in self.non_members["text"].to_numpy()[out]]
            self._pools[label] = (label_members, candidates, out_demos)
        return self._pools[label]


def _audit_prompt(lm, spec: TaskSpec, prompt, label: str, pools: _LabelPools, rng, *, setting: str,
                  epsilon: float, demo_set: int, batch_size: int, cache: dict | None) -> list[pd.DataFrame]:
    """`config.trials` trials of `config.members` members vs `config.non_members` non-members of
    `label` against one prompt; each distinct record is scored once (its prompt is fixed)."""
    from dpcore import mia_attacks

    config = pools.config
    label_members, label_non_members, out_demos = pools.get(label)
    picks = list(zip(trial_samples(rng, len(label_members), config.members, config.trials),
                     trial_samples(rng, len(label_non_members), config.non_members, config.trials), strict=True))
    m_unique = np.unique(np.concatenate([p[0] for p in picks]))
    n_unique = np.unique(np.concatenate([p[1] for p in picks]))
    texts = (label_members["text"].astype(str).to_numpy()[m_unique].tolist()
             + label_non_members["text"].astype(str).to_numpy()[n_unique].tolist())
    texts = mia_attacks.truncate_texts(lm, texts, config.max_record_tokens)
    ids = np.concatenate([label_members["id"].astype(str).to_numpy()[m_unique],
                          label_non_members["id"].astype(str).to_numpy()[n_unique]])
    query_labels = [label] * len(texts)
    refs = mia_attacks.reference_scores(lm, spec, texts, query_labels, out_demos, batch_size, cache)
    scores = _attack_scores(lm, spec, prompt, texts, query_labels, refs, batch_size)
    m_pos = {int(r): i for i, r in enumerate(m_unique)}
    n_pos = {int(r): len(m_unique) + i for i, r in enumerate(n_unique)}
    frames = []
    for trial, (m_rows, n_rows) in enumerate(picks):
        local = [m_pos[int(r)] for r in m_rows] + [n_pos[int(r)] for r in n_rows]
        frames.append(_trial_frame({name: values[local] for name, values in scores.items()}, ids[local],
                                   len(m_rows), setting=setting, epsilon=epsilon, demo_set=demo_set, trial=trial,
                                   global_trial=demo_set * config.trials + trial))
    return frames


def _usable_labels(spec: TaskSpec, pools: _LabelPools, config: AuditConfig) -> list[str]:
    labels = [y for y in spec.label_names if pools.usable(y)]
    if not labels:
        raise ConfigError(f"audit_members: no label has {config.members} members and {config.non_members} "
                          f"non-members (+ {config.reference_prompts} OUT-prompt records) to query")
    return labels


def dp_audit(lm, spec: TaskSpec, members: pd.DataFrame, non_members: pd.DataFrame, config: AuditConfig,
             generation_config: GenerationConfig, noise_multiplier: float, seed=None, *,
             epsilon: float, delta: float, crosscheck_agreed: bool | None,
             noise_seed: int | None = None, charge: Callable[[int], None] | None = None,
             progress: Callable[[int, int], None] | None = None,
             thresholds: GateThresholds | None = None, batch_size: int = 16,
             cache: dict | None = None) -> AuditResult:
    """Tang et al. Appendix F: MIA against 1-shot ICL with DP demonstrations generated from `members` only.

    For each of `config.demo_sets` demo sets: one label y is taken (labels in a seeded
    order, cycling), one DP demonstration of y is generated with Algorithm 1
    (`generation.generate_demos`, sigma = `noise_multiplier`, from the members of label y
    only; sigma = 0 is the non-DP eps = inf demo; `epsilon == 0` uses instruction-only
    demos, which never read the records). Then `config.trials` trials each draw
    `config.members` members and `config.non_members` non-members OF LABEL y (the only
    records that can have influenced the demo; the same label on both sides keeps the
    score's label dependence out of the comparison: stricter than drawing from all
    labels; disjoint across the trials of a demo set when the pools allow) and score them
    against the 1-shot DP prompt with every attack; AUC per trial and attack, averaged.
    The LiRA OUT prompts are 1-shot prompts of `config.reference_prompts` non-members of
    label y kept out of the candidates.

    `noise_multiplier` comes from the caller's calibration (dpcore.accounting) for the
    members' label counts; `epsilon`, `delta` and `crosscheck_agreed` describe it for the
    report and the gate. `noise_seed`: None draws cryptographically seeded noise per demo
    set; an int makes the audit reproducible (seed + demo set index). `charge(demo_set)`
    is called BEFORE each generation touches the members (the privacy-ledger hook).
    """
    from dpcore import generation

    began = time.perf_counter()
    _check_split(members, "members")
    _check_split(non_members, "non_members")
    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    rng = _rng(seed)
    pools = _LabelPools(members, non_members, config, rng)
    labels = _usable_labels(spec, pools, config)
    order = [labels[i] for i in rng.permutation(len(labels))]
    gen_config = generation_config.model_copy(update={"demos_per_label": 1})
    frames, demo_texts, demo_labels = [], [], []
    setting = "instruction-only" if epsilon == 0 else "dp"
    cache = {} if cache is None else cache
    for demo_set in range(config.demo_sets):
        if progress is not None:
            progress(demo_set, config.demo_sets)
        label = order[demo_set % len(order)]
        label_members, _, _ = pools.get(label)
        member_texts = label_members["text"].astype(str).tolist()
        set_seed = None if noise_seed is None else int(noise_seed) + demo_set
        if epsilon == 0:
            produced = generation.instruction_only_demos(lm, spec, [label], gen_config, seed=set_seed)
        else:
            # ---- PRIVACY LEDGER HOOK: this generation reads the members' records. The caller's
            # `charge` records its spend (sigma, q, T) BEFORE the records are touched.
            if charge is not None:
                charge(demo_set)
            produced = generation.generate_demos(lm, spec, {label: member_texts}, gen_config, noise_multiplier,
                                                 seed=set_seed, labels=[label])
        demo = produced.demos[0]
        demo_texts.append(demo.text)
        demo_labels.append(label)
        frames += _audit_prompt(lm, spec, [(demo.text, demo.label)], label, pools, rng, setting=setting,
                                epsilon=float(epsilon), demo_set=demo_set, batch_size=batch_size, cache=cache)
        log.info("DP audit demo set %d/%d (label %s) scored", demo_set + 1, config.demo_sets, label)
    scores = pd.concat(frames, ignore_index=True)
    max_overlap, overlapping = _demo_overlap(lm, demo_texts, demo_labels, members, config.overlap_threshold)
    return _finish(
        thresholds or GateThresholds.from_config(config), scores, confidence=config.confidence, delta=delta,
        members_per_trial=config.members, non_members_per_trial=config.non_members,
        setting=setting, epsilon=float(epsilon), noise_multiplier=float(noise_multiplier),
        demo_sets=config.demo_sets, max_overlap_tokens=max_overlap, overlapping_records=overlapping,
        overlap_threshold=config.overlap_threshold, crosscheck_agreed=crosscheck_agreed, model=lm.name,
        dataset=spec.name, seconds=time.perf_counter() - began, overlap_tokenizer="model",
    )


def demos_audit(lm, spec: TaskSpec, demos: Sequence[tuple[str, str]], members: pd.DataFrame,
                non_members: pd.DataFrame, config: AuditConfig, seed=None, *, epsilon: float,
                noise_multiplier: float | None, delta: float, crosscheck_agreed: bool | None,
                thresholds: GateThresholds | None = None, batch_size: int = 16,
                cache: dict | None = None, progress: Callable[[int, int], None] | None = None) -> AuditResult:
    """The membership audit of DP demonstrations that were already generated (a run's own demos).

    `demos`: (text, label) pairs generated from `members` (for a run's demos: the whole
    private split, so every private record is a member); `non_members`: records the
    generation never read (held-out records of the same distribution). Each demo is one
    "demo set": `config.trials` trials of `config.members` members vs `config.non_members`
    non-members of the demo's label against its 1-shot prompt, every attack, as `dp_audit`
    (whose design this is, minus the regeneration: nothing is generated, nothing is
    charged). Pass the same `seed` and `cache` to audit several epsilons' demos on the same
    candidate records: their reference passes then run once.
    """
    began = time.perf_counter()
    _check_split(members, "members")
    _check_split(non_members, "non_members")
    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    if not demos:
        raise ConfigError("audit: no demonstration to audit")
    rng = _rng(seed)
    pools = _LabelPools(members, non_members, config, rng)
    usable = set(_usable_labels(spec, pools, config))
    skipped = sorted({str(d[1]) for d in demos} - usable)
    if skipped:
        log.warning("audit: label(s) %s lack the members/non-members to query; their demos are not audited",
                    ", ".join(skipped))
    frames, audited = [], []
    todo = [d for d in demos if str(d[1]) in usable]
    for index, demo in enumerate(todo):
        if progress is not None:
            progress(index, len(todo))
        text, label = str(demo[0]), str(demo[1])
        audited.append((text, label))
        frames += _audit_prompt(lm, spec, [(text, label)], label, pools, rng, setting="dp", epsilon=float(epsilon),
                                demo_set=index, batch_size=batch_size, cache=cache)
    if not frames:
        raise ConfigError("audit: none of the demonstrations' labels has enough records to query")
    scores = pd.concat(frames, ignore_index=True)
    max_overlap, overlapping = _demo_overlap(lm, [t for t, _ in audited], [y for _, y in audited], members,
                                             config.overlap_threshold)
    return _finish(
        thresholds or GateThresholds.from_config(config), scores, confidence=config.confidence, delta=delta,
        members_per_trial=config.members, non_members_per_trial=config.non_members,
        setting="dp", epsilon=float(epsilon), noise_multiplier=noise_multiplier, demo_sets=len(audited),
        max_overlap_tokens=max_overlap, overlapping_records=overlapping,
        overlap_threshold=config.overlap_threshold, crosscheck_agreed=crosscheck_agreed, model=lm.name,
        dataset=spec.name, seconds=time.perf_counter() - began, overlap_tokenizer="model",
    )


def _demo_overlap(lm, demo_texts: list[str], demo_labels: list[str], members: pd.DataFrame,
                  threshold: int) -> tuple[int, int]:
    """Verbatim check: each demo against the members of its label (the records it was generated from);
    one tokenization of a label's members however many demos share the label."""
    tokenize = model_tokenize(lm)
    m_label = members["label"].astype(str).to_numpy()
    max_overlap, overlapping = 0, 0
    for label in dict.fromkeys(demo_labels):
        texts = [text for text, y in zip(demo_texts, demo_labels, strict=True) if y == label]
        pool = members.loc[m_label == label, "text"].astype(str).tolist()
        report = verbatim_overlap(texts, pool, threshold=threshold, tokenize=tokenize)
        max_overlap = max(max_overlap, report.max_overlap)
        overlapping += report.overlapping_records
    return max_overlap, overlapping


# =========================================================================== ROC plot


def roc_plot(results: Sequence[AuditResult], path: Path, title: str = "") -> Path:
    """Pooled ROC curves (members vs non-members), one per audit (e.g. DP vs non-private), as a PNG.

    Left: linear axes with the chance diagonal; right: log-log axes for the low-FPR region.
    Matplotlib's object API on the Agg canvas (no pyplot state); written atomically.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from dpcore.artifacts import write_bytes_atomic

    figure = Figure(figsize=(9.6, 4.4))
    FigureCanvasAgg(figure)
    linear, logarithmic = figure.subplots(1, 2)
    floor = 1.0
    for result in results:
        scores = result.mia_scores
        if "attack" in scores.columns:  # the gate's attack (the strongest) of each audit
            scores = scores.loc[scores["attack"] == result.attack]
        member = scores["member"].to_numpy(dtype=bool)
        if member.all() or not member.any():
            continue
        values = scores["score"].to_numpy(dtype=float)
        curve = roc_curve(values[member], values[~member])
        name = result.setting if result.setting == "non-private" else f"{result.setting} eps={result.epsilon:g}"
        label = f"{name} [{result.attack}]: mean trial AUC {result.auc:.3f} (pooled {result.pooled_auc:.3f})"
        for axis in (linear, logarithmic):
            axis.plot(curve.fpr, curve.tpr, drawstyle="steps-post", label=label)
        floor = min(floor, 1.0 / curve.non_members, 1.0 / curve.members)
    grid = np.linspace(0, 1, 101)
    linear.plot(grid, grid, color="gray", linestyle=":", label="chance")
    logarithmic.plot(np.maximum(grid, floor / 2), np.maximum(grid, floor / 2), color="gray", linestyle=":")
    linear.set(xlim=(0, 1), ylim=(0, 1), xlabel="false positive rate (non-members)",
               ylabel="true positive rate (members)", title=title or "Membership inference ROC (pooled)")
    logarithmic.set(xscale="log", yscale="log", xlim=(floor / 2, 1), ylim=(floor / 2, 1.05),
                    xlabel="false positive rate (log)", ylabel="true positive rate (log)", title="low-FPR region")
    for axis in (linear, logarithmic):
        axis.grid(True, alpha=0.3)
    linear.legend(fontsize=8, loc="lower right")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return write_bytes_atomic(Path(path), buffer.getvalue())
