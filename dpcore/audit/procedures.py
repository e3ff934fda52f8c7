"""Membership-inference audit: the attack procedures and their result.

The prompt under audit is attacked by several scores (`dpcore.audit.attacks`), all computed
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
- `demo_overlap` / `with_demo_overlap`: the verbatim check of demonstrations against the
  records of their label, folded into a result and gated again (a run's own demos beside a
  regenerated audit).

Modules of the audit: the attack scores (`dpcore.audit.attacks`), their statistics
(`dpcore.audit.statistics`: ROC/AUC, empirical epsilon bounds, intervals), the verbatim check
(`dpcore.audit.overlap`), the gate (`dpcore.audit.gate`) and the ROC plot (`dpcore.report.plots.roc_plot`).
This module draws the trials, runs the attacks and assembles an `AuditResult`.

Privacy: every output here (AuditResult, the `mia_scores` and `audit` tables, the ROC
plot) holds record ids, scores, counts and public configuration, never a record's text.
Overlap is reported as token counts only; the audited demo texts are not kept either (a
sigma = 0 demo may copy a record). `mia_scores` is a per-record table of private data: it
belongs in the private store.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpcore.audit import attacks as mia_attacks
from dpcore.audit import design as audit_design
from dpcore.audit.config import AuditConfig
from dpcore.audit.gate import GateThresholds, gate, pass_statement
from dpcore.audit.overlap import model_tokenize, verbatim_overlap, verbatim_overlap_tokens
from dpcore.audit.statistics import AttackMetrics, attack_metrics, strongest_attack
from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError, DataValidationError, stop_if_requested
from dpcore.fewshot.config import GenerationConfig
from dpcore.flags import flag

log = logging.getLogger(__name__)

# The key of the member pools' tokens (`demo_overlap`) in an audit's `cache`, beside the reference scores'
# (prompt, record) keys: several epsilons' audits of the same members tokenize them once.
OVERLAP_POOLS = "overlap token pools"
MIA_SCORE_COLUMNS = ["setting", "epsilon", "demo_set", "trial", "role", "member", "record_id", "attack", "score"]
AUC_CI_METHOD = ("Student t over trials, per-trial variance >= Hanley-McNeil null variance, within [0, 1]; "
                 "Bonferroni over the attacks")
EPSILON_LB_METHOD = "holdout"  # threshold chosen on even trials, bounded on odd trials (see below)


# =========================================================================== result


# The audit's public face (`AuditResult.public_summary`): design and verdict, no statistic of the records.
PUBLIC_AUDIT_FIELDS = ("setting", "epsilon", "noise_multiplier", "delta", "trials", "demo_sets", "members_per_trial",
                       "non_members_per_trial", "confidence", "test", "leak_auc", "power", "false_alarm", "passed",
                       "reasons")
MEMBER_FRACTION = 0.5  # Tang et al. Appendix F: half of each label's records are members


def verdict_word(passed: bool, reasons) -> str:
    """passed | inconclusive | failed: an audit that cannot tell is not a failure of the prompt."""
    if passed:
        return "passed"
    return "inconclusive" if reasons and all(str(r).startswith("audit inconclusive") for r in reasons) else "failed"


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
    test: str = "detect"  # the gate's test (`AuditConfig.test`)
    leak_auc: float | None = None  # detect: the leak the audit was sized against (None: equivalence)
    power: float | None = None  # detect: P(the gate fails | an attack reaches leak_auc), of the sizes run (public)
    false_alarm: float = math.nan  # P(the gate fails on the AUCs | nothing leaks): at most 1 - confidence
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

    def public_summary(self) -> dict:
        """What of the audit may leave the private store: the design (setting, epsilon, sizes, confidence)
        and the gate's verdict with its figure-free reasons. The AUCs, intervals, TPRs, epsilon lower
        bounds, overlap lengths, the strongest attack's name and the audit's timing are non-DP statistics
        of the private records: an operator's diagnostic, kept in the private audit table."""
        out = {name: getattr(self, name) for name in PUBLIC_AUDIT_FIELDS if name != "reasons"}
        out["reasons"] = list(self.reasons)
        out["verdict"] = verdict_word(self.passed, self.reasons)
        return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in out.items()}

    def statement(self) -> str:
        """The verdict in words (public: configuration and sizes only): a pass says what it detected none
        of; a failure or an inconclusive audit its word."""
        word = verdict_word(self.passed, self.reasons)
        if not self.passed:
            return word
        return f"{word}: {pass_statement(self.test, self.leak_auc, self.power, self.confidence)}"

    def public_frame(self) -> pd.DataFrame:
        """The one-row public `audit` table: `public_summary` with `reasons` one per line (what the release
        gate reads)."""
        row = {name: getattr(self, name) for name in PUBLIC_AUDIT_FIELDS}
        row.update(reasons="\n".join(self.reasons), verdict=verdict_word(self.passed, self.reasons),
                   noise_multiplier=math.nan if self.noise_multiplier is None else self.noise_multiplier)
        return pd.DataFrame([row])

    def audit_frame(self) -> pd.DataFrame:
        """The one-row PRIVATE `audit` table (the operator's diagnostic); `reasons` one per line (what dpcore.release.gate reads); each attack's
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


def _finish(thresholds: GateThresholds, scores: pd.DataFrame, *, confidence: float, delta: float,
            members_per_trial: int, non_members_per_trial: int, **fields) -> AuditResult:
    attacks = attack_metrics(scores, members_per_trial, non_members_per_trial, confidence, delta)
    top = strongest_attack(attacks)
    # the power of the sizes run (public: members and non-members per trial, trials, attacks), its trials taken
    # as drawn disjointly (records that recur, from a small pool, only narrow what it detects: logged when drawn)
    sized = audit_design.design(max(1, len(top.trial_aucs)), members=members_per_trial,
                                non_members=non_members_per_trial, trials=max(1, len(top.trial_aucs)),
                                attacks=len(attacks), confidence=confidence, test=audit_design.DETECT,
                                leak_auc=thresholds.leak_auc, power=thresholds.power)
    detect = thresholds.test == audit_design.DETECT
    result = AuditResult(
        auc=top.auc, auc_ci=top.auc_ci, trial_aucs=top.trial_aucs, trials=len(top.trial_aucs),
        tpr_at_1pct_fpr=top.tpr_at_1pct_fpr, tpr_at_01pct_fpr=top.tpr_at_01pct_fpr, pooled_auc=top.pooled_auc,
        epsilon_lower_bound=top.epsilon_lower_bound, epsilon_lower_bound_method="holdout (trial parity)",
        confidence=confidence, delta=delta, members_per_trial=members_per_trial,
        non_members_per_trial=non_members_per_trial, attack=top.attack, attacks=attacks, test=thresholds.test,
        leak_auc=thresholds.leak_auc if detect else None, power=round(sized.power, 4) if detect else None,
        false_alarm=1.0 - confidence, mia_scores=scores[MIA_SCORE_COLUMNS].reset_index(drop=True), **fields)
    passed, reasons = gate(result, thresholds)
    return dataclasses.replace(result, passed=passed, reasons=reasons)


# =========================================================================== the attack


def _check_split(frame: pd.DataFrame, name: str) -> None:
    for column in ("id", "text", "label"):
        if column not in frame.columns:
            raise DataValidationError(f"{name}: missing column {column!r}")


def trial_samples(rng: np.random.Generator, pool_size: int, per_trial: int, trials: int) -> list[np.ndarray]:
    """Row indices for each trial: disjoint across trials when the pool allows (one permutation, sliced),
    so trials are independent samples given the prompt; otherwise independent draws per trial (records
    then recur across trials, and the interval counts only the disjoint trials the pool could fill:
    `audit_statistics.independent_trials`; a warning is logged)."""
    if per_trial > pool_size:
        raise ConfigError(f"{flag('audit_members')}: {per_trial} records per trial but only {pool_size} in the pool")
    if per_trial * trials <= pool_size:
        order = rng.permutation(pool_size)
        return [order[t * per_trial:(t + 1) * per_trial] for t in range(trials)]
    # the pool's size is not said: for a trained prompt it is how many records the Poisson batches drew
    log.warning("audit: %d trials x %d records exceed the pool: records recur across trials, so the AUC interval "
                "counts only the independent trials the pool holds (fewer records per trial or a larger pool "
                "narrow it)", trials, per_trial)
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
                   batch_size: int, past=None, should_stop: Callable[[], bool] | None = None) -> dict[str, np.ndarray]:
    target = mia_attacks.prompt_scores(lm, spec, prompt, texts, labels, batch_size=batch_size, past=past,
                                       should_stop=should_stop)
    return mia_attacks.attack_scores(target, refs.zero, refs.out)


def non_private_audit(lm, spec: TaskSpec, records: pd.DataFrame, config: AuditConfig, seed=None, *,
                      delta: float | None = None, overlap_records: pd.DataFrame | None = None,
                      thresholds: GateThresholds | None = None, batch_size: int = 16,
                      cache: dict | None = None, progress: Callable[[int, int], None] | None = None,
                      should_stop: Callable[[], bool] | None = None) -> AuditResult:
    """Duan et al. Section 3 / Tang et al. Appendix F (eps = inf): real records as 1-shot demos.

    Each of `config.trials` trials draws one member record (the 1-shot demonstration) and
    `config.non_members` other records of `records` (the same private split), scores all
    of them against the 1-shot prompt with every attack (`dpcore.audit.attacks`), and computes
    that trial's AUC per attack (1 member vs the non-members: a step function, Duan et al.
    Figure 2b). Trials use disjoint records when the split is large enough
    (`trial_samples`); the `config.reference_prompts` OUT prompts of the LiRA attacks are
    1-shot prompts of records outside every trial. `seed` (int or Generator) drives all
    sampling. The verbatim check runs on the member demos against `overlap_records`
    (default `records`; the member records are always added), so it reports the demos'
    own lengths: real records ARE verbatim copies. This configuration is leaky by
    design: its gate fails.
    """
    began = time.perf_counter()
    _check_split(records, "records")
    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    n = len(records)
    if n < config.non_members + 1:
        raise ConfigError(f"{flag('audit_members')}: {config.non_members} non-members + 1 member need more than the "
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
    refs = mia_attacks.reference_scores(lm, spec, queries, labels[used].tolist(), out_demos, batch_size, cache,
                                        should_stop=should_stop)
    position = {int(row): i for i, row in enumerate(used)}
    frames, member_rows = [], []
    for trial, chosen in enumerate(picks):
        if progress is not None:
            progress(trial, len(picks))
        member = int(chosen[0])
        member_rows.append(member)
        local = [position[int(r)] for r in chosen]
        scores = _attack_scores(lm, spec, [(texts[member], labels[member])], [queries[i] for i in local],
                                labels[chosen].tolist(), refs.take(local), batch_size, should_stop=should_stop)
        frames.append(_trial_frame(scores, ids[chosen], 1, setting="non-private", epsilon=math.inf, demo_set=-1,
                                   trial=trial, global_trial=trial))
        log.debug("non-private audit trial %d/%d done", trial + 1, config.trials)
    if progress is not None:
        progress(len(picks), len(picks))
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


def split_members(records: pd.DataFrame, seed=None, member_fraction: float = MEMBER_FRACTION
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
                  epsilon: float, demo_set: int, batch_size: int, cache: dict | None,
                  should_stop: Callable[[], bool] | None = None) -> list[pd.DataFrame]:
    """`config.trials` trials of `config.members` members vs `config.non_members` non-members of
    `label` against one prompt; each distinct record is scored once (its prompt is fixed)."""
    config = pools.config
    label_members, label_non_members, out_demos = pools.get(label)
    picks = list(zip(trial_samples(rng, len(label_members), config.members, config.trials),
                     trial_samples(rng, len(label_non_members), config.non_members, config.trials), strict=True))
    return _scored_trials(lm, spec, prompt, label_members, label_non_members, out_demos, picks, config,
                          setting=setting, epsilon=epsilon, demo_set=demo_set, batch_size=batch_size, cache=cache,
                          should_stop=should_stop)


def _scored_trials(lm, spec: TaskSpec, prompt, members: pd.DataFrame, non_members: pd.DataFrame, out_demos,
                   picks, config: AuditConfig, *, setting: str, epsilon: float, demo_set: int, batch_size: int,
                   cache: dict | None, past=None, first_trial: int | None = None,
                   should_stop: Callable[[], bool] | None = None) -> list[pd.DataFrame]:
    """Trials (member rows, non-member rows) of `picks` against one fixed prompt (`prompt` demos after
    `past`, a trained prompt's cache): each distinct record scored once with every attack, each record
    with its own label."""
    m_unique = np.unique(np.concatenate([p[0] for p in picks]))
    n_unique = np.unique(np.concatenate([p[1] for p in picks]))
    texts = (members["text"].astype(str).to_numpy()[m_unique].tolist()
             + non_members["text"].astype(str).to_numpy()[n_unique].tolist())
    texts = mia_attacks.truncate_texts(lm, texts, config.max_record_tokens)
    ids = np.concatenate([members["id"].astype(str).to_numpy()[m_unique],
                          non_members["id"].astype(str).to_numpy()[n_unique]])
    query_labels = (members["label"].astype(str).to_numpy()[m_unique].tolist()
                    + non_members["label"].astype(str).to_numpy()[n_unique].tolist())
    # public counts only: how many scores this prompt costs (the sizes are planned from public numbers)
    log.info("audit: scoring %d records under the prompt and %d reference score(s) not scored before",
             len(texts), mia_attacks.reference_passes_needed(texts, query_labels, out_demos, cache))
    refs = mia_attacks.reference_scores(lm, spec, texts, query_labels, out_demos, batch_size, cache,
                                        should_stop=should_stop)
    scores = _attack_scores(lm, spec, prompt, texts, query_labels, refs, batch_size, past=past,
                            should_stop=should_stop)
    m_pos = {int(r): i for i, r in enumerate(m_unique)}
    n_pos = {int(r): len(m_unique) + i for i, r in enumerate(n_unique)}
    frames = []
    for trial, (m_rows, n_rows) in enumerate(picks):
        local = [m_pos[int(r)] for r in m_rows] + [n_pos[int(r)] for r in n_rows]
        number = trial if first_trial is None else first_trial + trial
        overall = demo_set * config.trials + trial if first_trial is None else number
        frames.append(_trial_frame({name: values[local] for name, values in scores.items()}, ids[local],
                                   len(m_rows), setting=setting, epsilon=epsilon, demo_set=demo_set, trial=number,
                                   global_trial=overall))
    return frames


def _usable_labels(spec: TaskSpec, pools: _LabelPools, config: AuditConfig) -> list[str]:
    labels = [y for y in spec.label_names if pools.usable(y)]
    if not labels:
        raise ConfigError(f"{flag('audit_members')}: no label has {config.members} members and {config.non_members} "
                          f"non-members (+ {config.reference_prompts} OUT-prompt records) to query")
    return labels


def dp_audit(lm, spec: TaskSpec, members: pd.DataFrame, non_members: pd.DataFrame, config: AuditConfig,
             generation_config: GenerationConfig, noise_multiplier: float, seed=None, *,
             epsilon: float, delta: float, crosscheck_agreed: bool | None,
             noise_seed: int | None = None, charge: Callable[[int], None] | None = None,
             progress: Callable[[int, int], None] | None = None,
             thresholds: GateThresholds | None = None, batch_size: int = 16,
             cache: dict | None = None, should_stop: Callable[[], bool] | None = None) -> AuditResult:
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

    `noise_multiplier` comes from the caller's calibration (dpcore.fewshot.accounting) for the
    members' label counts; `epsilon`, `delta` and `crosscheck_agreed` describe it for the
    report and the gate. `noise_seed`: None draws cryptographically seeded noise per demo
    set; an int makes the audit reproducible (seed + demo set index). `charge(demo_set)`
    is called BEFORE each generation touches the members (the privacy-ledger hook). `should_stop()` is
    asked at every token step of a generation and before every forward pass of the scoring: True ends
    the audit with `RunStopped` (what `charge` recorded stays recorded).
    """
    from dpcore.fewshot import generation

    def step(info: dict) -> None:  # a generation's token step: the point where it stops when asked
        stop_if_requested(should_stop, "the audit")

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
            produced = generation.instruction_only_demos(lm, spec, [label], gen_config, seed=set_seed,
                                                         progress=step)
        else:
            # ---- PRIVACY LEDGER HOOK: this generation reads the members' records. The caller's
            # `charge` records its spend (sigma, q, T) BEFORE the records are touched.
            if charge is not None:
                charge(demo_set)
            produced = generation.generate_demos(lm, spec, {label: member_texts}, gen_config, noise_multiplier,
                                                 seed=set_seed, labels=[label], progress=step)
        demo = produced.demos[0]
        demo_texts.append(demo.text)
        demo_labels.append(label)
        frames += _audit_prompt(lm, spec, [(demo.text, demo.label)], label, pools, rng, setting=setting,
                                epsilon=float(epsilon), demo_set=demo_set, batch_size=batch_size, cache=cache,
                                should_stop=should_stop)
        log.info("DP audit demo set %d/%d (label %s) scored", demo_set + 1, config.demo_sets, label)
    if progress is not None:
        progress(config.demo_sets, config.demo_sets)
    scores = pd.concat(frames, ignore_index=True)
    max_overlap, overlapping = demo_overlap(model_tokenize(lm), demo_texts, demo_labels, members,
                                            config.overlap_threshold, cache.setdefault(OVERLAP_POOLS, {}))
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
                cache: dict | None = None, progress: Callable[[int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> AuditResult:
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
                                demo_set=index, batch_size=batch_size, cache=cache, should_stop=should_stop)
    if progress is not None:
        progress(len(todo), len(todo))
    if not frames:
        raise ConfigError("audit: none of the demonstrations' labels has enough records to query")
    scores = pd.concat(frames, ignore_index=True)
    pools_tokens = {} if cache is None else cache.setdefault(OVERLAP_POOLS, {})
    max_overlap, overlapping = demo_overlap(model_tokenize(lm), [t for t, _ in audited], [y for _, y in audited],
                                            members, config.overlap_threshold, pools_tokens)
    return _finish(
        thresholds or GateThresholds.from_config(config), scores, confidence=config.confidence, delta=delta,
        members_per_trial=config.members, non_members_per_trial=config.non_members,
        setting="dp", epsilon=float(epsilon), noise_multiplier=noise_multiplier, demo_sets=len(audited),
        max_overlap_tokens=max_overlap, overlapping_records=overlapping,
        overlap_threshold=config.overlap_threshold, crosscheck_agreed=crosscheck_agreed, model=lm.name,
        dataset=spec.name, seconds=time.perf_counter() - began, overlap_tokenizer="model",
    )


def _check_disjoint(members: pd.DataFrame, non_members: pd.DataFrame) -> None:
    shared = set(members["id"].astype(str)) & set(non_members["id"].astype(str))
    if shared:
        raise DataValidationError(f"audit: {len(shared)} record id(s) are both members and non-members")


def _candidates(rng, non_members: pd.DataFrame, config: AuditConfig) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """(the non-member candidates, the LiRA OUT prompts): `config.reference_prompts` non-members kept out of
    the candidates as 1-shot OUT prompts (fewer than 2: no LiRA)."""
    reserve = config.reference_prompts if config.reference_prompts >= 2 else 0
    rows = np.arange(len(non_members))
    out = _out_rows(rng, rows, max(0, min(reserve, len(rows) - config.non_members)))
    out_demos = [(str(t), str(y)) for t, y in zip(non_members["text"].to_numpy()[out],
                                                  non_members["label"].to_numpy()[out], strict=True)]
    return non_members.iloc[np.setdiff1d(rows, out)].reset_index(drop=True), out_demos


def prompt_audit(lm, spec: TaskSpec, demos: Sequence[tuple[str, str]], members: pd.DataFrame,
                 non_members: pd.DataFrame, config: AuditConfig, seed=None, *, setting: str, epsilon: float,
                 noise_multiplier: float | None, delta: float, crosscheck_agreed: bool | None, past=None,
                 thresholds: GateThresholds | None = None, batch_size: int = 16, cache: dict | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> AuditResult:
    """The membership audit of one released prompt (Duan et al. Section 3's attack and the others of
    `dpcore.audit.attacks`): PromptPATE's student prompt (`demos`: public queries with noisy labels) or a
    PromptDPSGD trained prompt (`past`: its cache, `soft_prompt.TrainablePrompt.cache_layers`; `demos`
    usually empty).

    `members`: the private records the prompt's mechanism read (the teachers' records; the DP-SGD
    training records); `non_members`: records it never read (held-out test records), disjoint from
    the members (checked). `config.trials` trials each draw `config.members` members and
    `config.non_members` non-members over all labels (disjoint across trials when the pools allow;
    each record scored with its own label), every attack, AUC per trial, averaged. The LiRA OUT
    prompts are 1-shot prompts of `config.reference_prompts` non-members kept out of the candidates.
    The verbatim check runs on the prompt's demonstrations against the members."""
    began = time.perf_counter()
    _check_split(members, "members")
    _check_split(non_members, "non_members")
    _check_disjoint(members, non_members)
    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    if len(members) < config.members:
        raise ConfigError(f"{flag('audit_members')}: {config.members} members per trial are more than the records the "
                          "prompt's mechanism read; audit with fewer members per trial")
    rng = _rng(seed)
    candidates, out_demos = _candidates(rng, non_members, config)
    if len(candidates) < config.non_members:
        raise ConfigError(f"{flag('audit_members')}: {config.non_members} non-members per trial but only {len(candidates)} "
                          "held-out records (after the LiRA OUT prompts)")
    picks = list(zip(trial_samples(rng, len(members), config.members, config.trials),
                     trial_samples(rng, len(candidates), config.non_members, config.trials), strict=True))
    if progress is not None:
        progress(0, 1)
    prompt = [(str(t), str(y)) for t, y in demos]
    frames = _scored_trials(lm, spec, prompt, members, candidates, out_demos, picks, config, setting=setting,
                            epsilon=float(epsilon), demo_set=0, batch_size=batch_size, cache=cache, past=past,
                            should_stop=should_stop)
    if progress is not None:
        progress(1, 1)
    overlap = verbatim_overlap([t for t, _ in prompt], members["text"].astype(str).tolist(),
                               threshold=config.overlap_threshold, tokenize=model_tokenize(lm))
    return _finish(
        thresholds or GateThresholds.from_config(config), pd.concat(frames, ignore_index=True),
        confidence=config.confidence, delta=delta, members_per_trial=config.members,
        non_members_per_trial=config.non_members, setting=setting, epsilon=float(epsilon),
        noise_multiplier=noise_multiplier, demo_sets=1, max_overlap_tokens=overlap.max_overlap,
        overlapping_records=overlap.overlapping_records, overlap_threshold=config.overlap_threshold,
        crosscheck_agreed=crosscheck_agreed, model=lm.name, dataset=spec.name, seconds=time.perf_counter() - began,
        overlap_tokenizer=overlap.tokenizer,
    )


def teacher_audit(lm, spec: TaskSpec, teachers: Sequence[pd.DataFrame], non_members: pd.DataFrame,
                  config: AuditConfig, seed=None, *, delta: float, thresholds: GateThresholds | None = None,
                  batch_size: int = 16, cache: dict | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None) -> AuditResult:
    """The non-private contrast of a PromptPATE audit: single teachers' prompts (real private records,
    Duan et al. Section 3's leaky setting). Trial t attacks teacher t's prompt (its k records as the
    demonstrations, in order): its k records are the members, `config.non_members` held-out records
    the non-members; up to `config.trials` teachers. Leaky by design: its gate fails (no accountant,
    verbatim copies)."""
    began = time.perf_counter()
    if not teachers:
        raise ConfigError("audit: no teacher prompt to audit")
    for frame in teachers:
        _check_split(frame, "teacher")
        _check_disjoint(frame, non_members)
    _check_split(non_members, "non_members")
    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    rng = _rng(seed)
    candidates, out_demos = _candidates(rng, non_members, config)
    chosen = [teachers[i] for i in np.sort(rng.permutation(len(teachers))[:config.trials])]
    n_picks = trial_samples(rng, len(candidates), config.non_members, len(chosen))
    frames, demos = [], []
    for trial, (teacher, n_rows) in enumerate(zip(chosen, n_picks, strict=True)):
        if progress is not None:
            progress(trial, len(chosen))
        prompt = [(str(t), str(y)) for t, y in zip(teacher["text"], teacher["label"], strict=True)]
        demos += prompt
        frames += _scored_trials(lm, spec, prompt, teacher.reset_index(drop=True), candidates, out_demos,
                                 [(np.arange(len(teacher)), n_rows)], config, setting="non-private",
                                 epsilon=math.inf, demo_set=-1, batch_size=batch_size, cache=cache,
                                 first_trial=trial, should_stop=should_stop)
    if progress is not None:
        progress(len(chosen), len(chosen))
    members = pd.concat(chosen, ignore_index=True)
    overlap = verbatim_overlap([t for t, _ in demos], members["text"].astype(str).tolist(),
                               threshold=config.overlap_threshold, tokenize=model_tokenize(lm))
    return _finish(
        thresholds or GateThresholds.from_config(config), pd.concat(frames, ignore_index=True),
        confidence=config.confidence, delta=delta, members_per_trial=int(max(len(t) for t in chosen)),
        non_members_per_trial=config.non_members, setting="non-private", epsilon=math.inf, noise_multiplier=None,
        demo_sets=0, max_overlap_tokens=overlap.max_overlap, overlapping_records=overlap.overlapping_records,
        overlap_threshold=config.overlap_threshold, crosscheck_agreed=None, model=lm.name, dataset=spec.name,
        seconds=time.perf_counter() - began, overlap_tokenizer=overlap.tokenizer,
    )


def demo_overlap(tokenize: Callable[[Sequence[str]], list[list[int]]], demo_texts: Sequence[str],
                 demo_labels: Sequence[str], records: pd.DataFrame, threshold: int,
                 pool_tokens: dict | None = None) -> tuple[int, int]:
    """Verbatim check: each demo against the records of its label (the records it was generated from).

    Returns (the longest token run any demo shares with a record, the records sharing >= `threshold`
    tokens). A label's records are tokenized once however many demos share the label; `pool_tokens`
    keeps them across calls (several epsilons' demos), keyed by the label and the records' texts
    themselves, so a call on other records never reads another pool's tokens."""
    pool_tokens = {} if pool_tokens is None else pool_tokens
    record_labels = records["label"].astype(str).to_numpy()
    max_overlap, overlapping = 0, 0
    for label in dict.fromkeys(str(y) for y in demo_labels):
        texts = [str(text) for text, y in zip(demo_texts, demo_labels, strict=True) if str(y) == label]
        pool = tuple(records.loc[record_labels == label, "text"].astype(str).tolist())
        key = (label, len(pool), hash(pool))
        if key not in pool_tokens:
            pool_tokens[key] = tokenize(pool)
        report = verbatim_overlap_tokens(tokenize(texts), pool_tokens[key], threshold=threshold, tokenizer="model")
        max_overlap = max(max_overlap, report.max_overlap)
        overlapping += report.overlapping_records
    return max_overlap, overlapping


def with_demo_overlap(result: AuditResult, max_overlap: int, overlapping: int,
                      thresholds: GateThresholds) -> AuditResult:
    """`result` with more demonstrations' verbatim overlap (`demo_overlap`) folded in, gated again."""
    updated = dataclasses.replace(result, max_overlap_tokens=max(result.max_overlap_tokens, max_overlap),
                                  overlapping_records=result.overlapping_records + overlapping)
    passed, reasons = gate(updated, thresholds)
    return dataclasses.replace(updated, passed=passed, reasons=reasons)
