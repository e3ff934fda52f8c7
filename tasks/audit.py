"""Stage 6: the membership-inference audit (`dpcore.audit.procedures`, Duan et al. 2023 / Tang et al. Appendix F).

Every audit runs every attack of `dpcore.audit.attacks` (Duan et al.'s score, difficulty-
calibrated label and text scores, offline LiRA) and gates on the strongest. Two designs
(`AuditConfig.mode`):

run-demos (default): the run's own DP demonstrations were generated from the whole private split, so
every private record is a member; the held-out records are the non-members (the test split, or with a
separate test file the rows of the private file held out for the audit, `RunConfig.audit_holdout_fraction`). Each
demo's 1-shot prompt is attacked with members vs non-members of its label
(`dpcore.audit.procedures.demos_audit`): nothing is generated, nothing is charged, and every epsilon
is audited on the same candidate records (their reference scores computed once).

regenerate: for each DP epsilon of the run: the private records are split into members and
non-members (`split_members`), sigma is calibrated for the members' label counts (the
audit generates from half the data, so its q is larger), and `dp_audit` generates DP
demo sets from the members only and scores members against non-members. A non-private
reference audit (real records as 1-shot demos, Duan et al.'s leaky setting) is run for
the ROC comparison; it fails the gate by design, so it is kept out of the `audit` table
(which the release gate reads) and goes to `audit_reference` (its verbatim-overlap figure is
measured against a 2,000-record sample: its demos are real records by construction).

The run's own DP demonstrations are also checked for verbatim overlap with the private
records of their label; an overlap at or above the threshold fails that epsilon's gate.

Outputs: public `audit` and `audit_reference` with the design and the gate's verdict only; private
(the operator's diagnostic) the per-record scores `mia_scores`, the full `audit` tables (AUCs, intervals,
TPRs, epsilon lower bounds, overlap) and the ROC plots: every figure of an audit is a non-DP statistic
of private records.
The audit's DP generations read private records: they are charged to the privacy ledger before
each generation, through dp_audit's `charge` hook, from the audit's own plan (`audit_plan`:
`dpcore.fewshot.plan` on the members' label counts, purpose "audit").

The pieces `dpicl audit` shares with this task (`flows.standalone`): the member split, the audit's
plan, the DP audit at one epsilon, the non-private reference and the writing of the tables.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import pandas as pd

from dpcore.audit.config import AuditConfig
from dpcore.audit.design import AuditDesign
from dpcore.audit.procedures import MEMBER_FRACTION, verdict_word
from dpcore.config import RunConfig
from dpcore.data.artifacts import read_table, write_table
from dpcore.errors import ConfigError
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.plan import TANG, Calibration, FewShotPlan, fewshot_plan
from dpcore.lm import runtime
from dpcore.privacy.plan import AUDIT_PLAN, PrivacyPlan
from dpcore.public_outputs import Kind, declare, declare_line, declare_log
from tasks.common import (
    Ingested,
    cached_task,
    derive_seed,
    open_stage,
    report_progress,
    stage_dir,
    stage_logger,
    stop_requested,
)

AUDIT_MODULES = ("dpcore.audit.procedures", "dpcore.audit.statistics", "dpcore.audit.gate", "dpcore.audit.overlap", "dpcore.audit.attacks",
                 "dpcore.fewshot.generation", "dpcore.fewshot.mechanisms", "dpcore.fewshot.sampling", "dpcore.lm.icl", "dpcore.lm.prefix_cache",
                 "dpcore.fewshot.accounting", "dpcore.fewshot.plan")
# The non-private audit's demos ARE records (dpcore adds them to the overlap pool), so its overlap figure is
# exact on any pool; above this size a random sample keeps the check cheap (the pipeline and `dpicl audit`).
REFERENCE_OVERLAP_SAMPLE = 2000
AUDIT_KEY_FIELDS = ("data_hash", "task_spec", "targets", "generation", "audit_config", "model", "dtype", "seed",
                    "noise_scope", "demo_keys", "non_private_reference", "delta")


# The audit's public face: the gate's verdict (and its figure-free reasons) and its design, which follows from
# the configuration and the public counts (|D|, |D_y|: the pools of members and non-members the plan draws).
for _output in ("file:*audit.parquet", "file:*audit_reference.parquet"):
    declare(_output, Kind.VERDICT, "/*/verdict", "/*/passed", "/*/reasons")
    declare(_output, Kind.COUNT, "/*/noise_multiplier", "/*/power")  # power: of the design's sizes (public counts)
AUDIT_VERDICT_LOG = declare_log("audit at epsilon %g: %s", verdict=(1,))  # `AuditResult.statement`
declare_line(Kind.COUNT, r"^audit: label\(s\) (.*) lack the members/non-members to query")


def run_audit_design(config: RunConfig, label_counts: dict[str, int], held_out: int
                     ) -> tuple[AuditConfig | None, AuditDesign, str | None]:
    """The run's audit, planned from public counts before it runs (`dpcore.audit.design`): (the audit
    configuration to run, or None to skip it; its design; one line to say, or None). Sizes the user did not
    set (--audit-trials, --audit-members) are those of the cheapest design that concludes on the pools; an
    audit that cannot conclude at the default sizes is skipped (minutes saved: the release gate needs a
    conclusive audit anyway); sizes the user set run as asked, with the line."""
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run

    audit_config = config.audit_config()
    reserve = audit_config.reference_prompts if audit_config.reference_prompts >= 2 else 0
    sizes = audit_design.settings(audit_config, len(attacks_run(audit_config.reference_prompts)))
    if audit_config.mode == "run-demos":
        # each of the run's demos (ceil(shots / labels) per label, generated once: the seeds choose among them)
        # against its label's records (every private record a member) and its label's share of the `held_out`
        # rows (the test split, or the private file's rows held out for the audit; taken as even: the split is
        # public only as a total)
        member_pools = list(label_counts.values())
        non_member_pools = [max(0, held_out // len(label_counts) - reserve)] * len(label_counts)
        demo_sets = len(label_counts) * max(1, math.ceil(config.shots / len(label_counts)))
    else:  # Tang et al. App. F: half of each label's records are members (`dpcore.audit.procedures.split_members`)
        member_pools = [int(round(0.5 * n)) for n in label_counts.values()]
        non_member_pools = [max(0, n - m - reserve) for n, m in zip(label_counts.values(), member_pools, strict=True)]
        demo_sets = audit_config.demo_sets
    pools = (sum(member_pools), sum(non_member_pools))

    def planner(members, non_members, trials):
        return audit_design.plan_by_label(member_pools, non_member_pools, demo_sets=demo_sets, members=members,
                                          non_members=non_members, trials=trials, **sizes)
    asked = {"audit_trials", "audit_members"} & config.flat_fields_set
    if asked:
        chosen = planner(audit_config.members, audit_config.non_members, audit_config.trials)
    else:
        chosen = audit_design.cheapest(planner, max(pools[0], 1), max(pools[1], 1))
        audit_config = audit_config.model_copy(update={"members": chosen.members, "non_members": chosen.non_members,
                                                       "trials": max(1, chosen.trials // demo_sets)})
    refusal = audit_design.cannot_conclude(chosen, *pools, members_are="the audit's members",
                                           non_members_are="its non-members")
    if refusal is not None and audit_config.mode == "regenerate":
        refusal += " (or --audit-mode run-demos: every private record a member, held-out rows the non-members)"
    if refusal is not None:
        if asked:
            return audit_config, chosen, f"audit: {refusal} (running it as asked)"
        return None, chosen, (f"audit skipped: {refusal}; without an audit that reaches its aim the release gate "
                              "refuses the run's demos (--no-audit silences this)")
    note = audit_design.shortfall_note(chosen)
    return audit_config, chosen, (f"audit: {note}" if note else None)


def design_line(audit_config: AuditConfig, chosen: AuditDesign, demo_sets: int = 1) -> str:
    """One line said before an audit runs: its attacks, its sizes, the interval it predicts and its cost in
    forward passes (public: sizes and configuration only)."""
    from dpcore.audit.attacks import attacks_run, passes_per_record

    attacks = attacks_run(audit_config.reference_prompts)
    sets = f"{demo_sets} demo sets x {chosen.trials // demo_sets}" if demo_sets > 1 else f"{chosen.trials}"
    width = (f"+/- {chosen.half_width:.3f}" if math.isfinite(chosen.half_width) else "no interval")
    scored = f"{chosen.scored_records} records" if chosen.scored_records else "each record"
    if chosen.test == "detect":
        aim = (f"detects a leak of AUC {chosen.leak_auc:g} with power {chosen.power:.2f} (false alarm <= "
               f"{1 - chosen.confidence:.2g}; AUC interval {width} when nothing leaks)")
    else:
        aim = f"AUC interval {width} predicted when nothing leaks (band +/- {chosen.tolerance:g})"
    return (f"audit: {len(attacks)} attacks ({', '.join(attacks)}) on {sets} trials of {chosen.members} member(s) vs "
            f"{chosen.non_members} non-members; {aim}; {scored} x {passes_per_record(audit_config.reference_prompts)} "
            "forward passes" + ("" if len(attacks) > 3 else " (--audit-reference-prompts 4 adds LiRA: 4 more passes each)"))


# The method whose DP demonstrations a run's audit audits (its plan's epsilons and label counts design the audit).
AUDITED_METHOD = TANG


def audit_work(config: RunConfig, audit_config: AuditConfig, design: AuditDesign, *, epsilons: int, labels: int,
               record_tokens: int) -> runtime.Work:
    """The audit's model work from public sizes (`dpcore.lm.runtime`; the run's time estimate,
    `tasks.run_plans.RunPlan.work`): its design's scored records x the forward passes per record at its
    `epsilons` (the audited method's DP epsilons), a regenerate-mode audit's demo sets (one demo per label each,
    per epsilon), and the non-private reference's pairs when asked."""
    from dpcore.audit.attacks import passes_per_record

    audit_record = min(record_tokens, audit_config.max_record_tokens or record_tokens)
    audit = runtime.audit_positions(design.scored_records, passes_per_record(audit_config.reference_prompts),
                                    audit_record, epsilons=max(epsilons, 1))
    if audit_config.mode == "regenerate":  # its demo sets: one demo per label each, per epsilon
        audit += epsilons * audit_config.demo_sets * runtime.generation_positions(
            demos_per_label=1, labels=labels, num_subsets=config.num_subsets, subset_size=config.subset_size,
            max_tokens=config.max_tokens, record_tokens=record_tokens)
    if config.audit.reference:  # real records as 1-shot demos: as many pairs again
        audit += runtime.audit_positions(design.scored_records, 2, audit_record)
    return runtime.Work(audit=audit)


def audit_call(config: RunConfig, ingested: Ingested, plan: FewShotPlan, shards: list,
               generation_config: GenerationConfig, noise_scope: str, audit_config: AuditConfig,
               charged: bool = False) -> dict:
    """The keyword arguments of the `audit` task for a pipeline run: its DP epsilons (`FewShotPlan.dp`) and
    the run's own DP demos (`tasks.generate.Shard`s), with the audit as planned (`run_audit_design`).
    `charged`: this attempt of the run charged every DP demo set the audit generates, with its other spends."""
    dp_shards = sorted((s for s in shards if s.method == TANG), key=lambda s: (s.epsilon, s.label))
    return dict(records_path=ingested.records_path, data_hash=ingested.data_hash,
                task_spec=ingested.task_spec, targets=plan.tang(), generation=generation_config,
                audit_config=audit_config, model=config.model, device=config.device, dtype=config.dtype,
                seed=config.seed, noise_scope=noise_scope, demo_paths=[s.path for s in dp_shards],
                demo_keys=[s.key for s in dp_shards], non_private_reference=config.audit.reference,
                delta=plan.delta, dataset_id=config.ledger_id, run_id=ingested.paths.run_id, charged=charged)


def _progress(what: str):
    return lambda done, total: report_progress(what, done, total)


# --------------------------------------------------------------------------- shared with `dpicl audit`


def audit_members(train: pd.DataFrame, seed: int, labels: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Tang et al. Appendix F: (members, non-members, the members' count per label) of a seeded split."""
    from dpcore.audit.procedures import split_members

    members, non_members = split_members(train, seed=seed)
    counts = members["label"].astype(str).value_counts().to_dict()
    return members, non_members, {label: int(counts.get(label, 0)) for label in labels}


def audit_plan(generation: GenerationConfig, member_counts: dict[str, int], epsilon: float, delta: float,
               demo_sets: int) -> FewShotPlan:
    """The audit's own plan at one epsilon: sigma calibrated on the members' label counts (the audit
    generates from half the data, so its q is larger), one demo per set (T = max_tokens), each of the
    `demo_sets` generations charged (purpose "audit")."""
    return fewshot_plan([epsilon], member_counts, generation.model_copy(update={"demos_per_label": 1}), delta,
                        purpose="audit", repeats=demo_sets)


def audit_generation_plans(generation: GenerationConfig, label_counts: dict[str, int], fewshot: FewShotPlan,
                           delta: float, audit_config: AuditConfig | None) -> list[PrivacyPlan]:
    """The plans of the DP demo sets a regenerate-mode audit generates, from public counts: per DP epsilon of
    the run, `audit_plan` on the members' label counts (`split_members` takes round(half) of each label),
    named "audit". What the audit task then spends, charged with the run's other spends before anything
    runs; none for a run-demos audit or one not run."""
    if audit_config is None or audit_config.mode != "regenerate":
        return []
    members = {label: int(round(MEMBER_FRACTION * n)) for label, n in label_counts.items()}
    plans = []
    for target in fewshot.tang():
        (charged,) = audit_plan(generation, members, float(target.epsilon), delta,
                                audit_config.demo_sets).privacy_plans()
        plans.append(dataclasses.replace(charged, method=AUDIT_PLAN))
    return plans


def dp_audit_at(lm, spec, members: pd.DataFrame, non_members: pd.DataFrame, audit_config: AuditConfig,
                generation: GenerationConfig, calibration: Calibration, *, seed: int, noise_seed: int | None,
                crosscheck_agreed: bool, thresholds, charge=None, cache: dict | None = None, what: str):
    """`dpcore.audit.procedures.dp_audit` at one calibrated epsilon (epsilon 0: instruction-only demos, sigma reported
    as inf: no noise calibrated)."""
    from dpcore.audit import procedures as mia

    sigma = math.inf if not calibration.reads_private_data else calibration.noise_multiplier
    return mia.dp_audit(lm, spec, members, non_members, audit_config, generation, sigma, seed=seed,
                        epsilon=calibration.epsilon, delta=calibration.delta, crosscheck_agreed=crosscheck_agreed,
                        noise_seed=noise_seed, charge=charge, thresholds=thresholds, cache=cache,
                        progress=_progress(what), should_stop=stop_requested)


def reference_design(audit_config: AuditConfig, records: int) -> tuple[AuditConfig, AuditDesign]:
    """The non-private reference's sizes (real records as 1-shot demos: one member, the demo, per trial), as the
    design with the fewest scored records that detects `audit_config`'s leak (`dpcore.audit.design.cheapest`; at
    the defaults 1 + 4 records x 35 trials), drawn disjointly from the split's `records` less the LiRA prompts'
    records. A leaking prompt is what this audit is for: it is sized for the same gate as a release audit."""
    from dpcore.audit import design as audit_design
    from dpcore.audit.attacks import attacks_run

    reserve = audit_config.reference_prompts if audit_config.reference_prompts >= 2 else 0
    pool = max(0, records - reserve)
    sizes = audit_design.settings(audit_config, len(attacks_run(audit_config.reference_prompts)))

    def planner(members, non_members, trials):  # members is 1: each trial's prompt holds one real record
        slots = pool // (members + non_members)  # trials that fit disjointly in the one pool
        return audit_design.plan(slots * members, slots * non_members, members=members, non_members=non_members,
                                 trials=trials, **sizes)

    chosen = audit_design.cheapest(planner, 1, max(1, pool - 1))
    return audit_config.model_copy(update={"non_members": chosen.non_members, "trials": chosen.trials}), chosen


def reference_audit(lm, spec, train: pd.DataFrame, audit_config: AuditConfig, *, seed: int, sample_seed: int,
                    delta: float, thresholds, what: str):
    """The non-private reference (real records as 1-shot demos, Duan et al.'s leaky setting). Its demos are
    real records (verbatim copies by construction): the overlap check runs on a sample of the records only."""
    from dpcore.audit import procedures as mia

    sample = train.sample(n=min(len(train), REFERENCE_OVERLAP_SAMPLE), random_state=sample_seed % (2**32))
    return mia.non_private_audit(lm, spec, train, audit_config, seed=seed, delta=delta, thresholds=thresholds,
                                 overlap_records=sample, progress=_progress(what), should_stop=stop_requested)


def write_audit(results: list, reference, public: Path, private: Path, title: str,
                private_roc: str = "roc.png") -> dict:
    """The audit's tables. Private (an operator's diagnostic: statistics of private records): per-record
    scores, the full `audit` / `audit_reference` tables (AUCs, intervals, TPRs, overlap) and every ROC
    plot. Public: `audit` (and `audit_reference`) with the design and the gate's verdict only."""
    from dpcore.report.plots import roc_plot

    audits = results + ([reference] if reference is not None else [])
    scores = pd.concat([r.mia_scores for r in audits], ignore_index=True)
    empty = pd.DataFrame(columns=["setting", "epsilon", "passed", "reasons"])
    table = pd.concat([r.audit_frame() for r in results], ignore_index=True) if results else empty
    verdicts = pd.concat([r.public_frame() for r in results], ignore_index=True) if results else empty
    paths = {"mia_scores_path": str(write_table(scores, private / "mia_scores.parquet")),
             "private_audit_path": str(write_table(table, private / "audit.parquet")),
             "audit_path": str(write_table(verdicts, public / "audit.parquet")),
             "roc_path": str(roc_plot(audits, private / private_roc, title=title)) if audits else None}
    if reference is not None:
        paths["private_reference_path"] = str(write_table(reference.audit_frame(),
                                                          private / "audit_reference.parquet"))
        paths["reference_path"] = str(write_table(reference.public_frame(), public / "audit_reference.parquet"))
    return paths


# --------------------------------------------------------------------------- the pipeline's task


@cached_task("audit", AUDIT_KEY_FIELDS, AUDIT_MODULES, private_outputs=True, tags=["gpu"])
def audit(
    *,
    records_path: str,
    data_hash: str,
    task_spec: str,
    targets: list[Calibration],
    generation: GenerationConfig,
    audit_config: AuditConfig,
    model: str,
    device: str = "auto",
    dtype: str = "auto",
    seed: int | None = None,
    noise_scope: str = "",
    demo_paths: list[str] | None = None,
    demo_keys: list[str] | None = None,
    non_private_reference: bool = False,
    delta: float | None = None,
    dataset_id: str | None = None,
    run_id: str | None = None,
    charged: bool = False,
) -> dict:
    """Audit every DP epsilon of a run; returns stage paths and the per-epsilon summaries (public).
    `charged` (not in the cache key): the run charged every DP demo set of a regenerate-mode audit before it
    started (`audit_generation_plans`), so none is charged here; otherwise (a resumed run whose charge an
    earlier attempt made) each demo set is charged anew before it is generated: never a draw under an old
    charge."""
    from dpcore.audit.gate import GateThresholds
    from dpcore.fewshot.plan import default_delta
    from tasks.charge import audit_charge_hook
    from tasks.ingest import private_split

    logger = stage_logger()
    key, spec, lm = open_stage("audit", locals(), AUDIT_KEY_FIELDS, AUDIT_MODULES, task_spec=task_spec, model=model,
                               device=device, dtype=dtype)
    train = private_split(records_path, "train")
    delta = delta if delta is not None else default_delta(len(train))
    # The member split is an audit design choice, not privacy noise: reproducible from the data hash.
    split_seed = derive_seed(seed if seed is not None else int(data_hash[:15], 16), "audit-split")
    demos = pd.concat([read_table(Path(p)) for p in demo_paths or []], ignore_index=True) if demo_paths else None
    thresholds = GateThresholds.from_config(audit_config)
    # Every epsilon draws the same trials (one trial seed): its candidates' reference scores are computed once
    # and reused from this cache by the next epsilons' audits.
    shared = dict(thresholds=thresholds, cache={}, trial_seed=derive_seed(split_seed, "audit-trials"))
    if audit_config.mode == "run-demos":
        results = _audit_run_demos(lm, spec, records_path, train, demos, targets, audit_config, delta=delta,
                                   **shared)
    else:
        charge = _charged_with_the_run if charged else functools.partial(audit_charge_hook, dataset_id, data_hash,
                                                                          run_id)
        results = _audit_regenerated(lm, spec, train, demos, targets, generation, audit_config, delta=delta,
                                     split_seed=split_seed, noise_seed=seed, charge=charge, **shared)
    reference = None
    if non_private_reference:
        reference = reference_audit(lm, spec, train, reference_design(audit_config, len(train))[0],
                                    seed=derive_seed(split_seed, "reference"),
                                    sample_seed=split_seed, delta=delta, thresholds=thresholds,
                                    what="audit non-private reference trials")
        logger.info("non-private reference audit (real 1-shot demos): %s",
                    verdict_word(reference.passed, reference.reasons))

    paths = write_audit(results, reference, stage_dir("audit", key), stage_dir("audit", key, private=True),
                        f"{spec.name}: membership inference ROC", private_roc="roc_reference.png")
    result = {"key": key, **paths, "summary": [public_summary(r) for r in results]}
    if reference is not None:
        result["reference"] = public_summary(reference)
    return result


def _charged_with_the_run(plan: PrivacyPlan):
    """The `charge(plan)` of an audit whose demo sets the run charged before it started: nothing more."""
    return lambda demo_set: None


def _audit_run_demos(lm, spec, records_path: str, train: pd.DataFrame, demos: pd.DataFrame | None,
                     targets: list[Calibration], audit_config: AuditConfig, *, delta: float, thresholds,
                     cache: dict, trial_seed: int) -> list:
    """run-demos: each epsilon's own DP demos against the held-out records (`AuditConfig.held_out`: the test
    split, or the private file's rows held out for the audit; nothing generated)."""
    from dpcore.audit import procedures as mia
    from tasks.ingest import private_split

    logger = stage_logger()
    held_out = private_split(records_path, "audit" if audit_config.held_out == "holdout" else "test")
    if held_out.empty:
        raise ConfigError("audit: the run-demos audit needs held-out records as non-members")
    results = []
    for target in targets:
        eps = float(target.epsilon)
        own = demos[demos["epsilon"] == eps] if demos is not None else pd.DataFrame(columns=["text", "label"])
        if own.empty:
            logger.warning("audit at epsilon %g: the run has no DP demonstration to audit", eps)
            continue
        result = mia.demos_audit(
            lm, spec, list(zip(own["text"].astype(str), own["label"].astype(str), strict=True)), train,
            held_out, audit_config, seed=trial_seed, epsilon=eps, noise_multiplier=target.noise_multiplier,
            delta=delta, crosscheck_agreed=target.crosscheck_agreed, thresholds=thresholds, cache=cache,
            progress=_progress(f"audit demos eps={eps:g}"), should_stop=stop_requested,
        )
        results.append(result)
        _log_result(logger, eps, result)
    return results


def _audit_regenerated(lm, spec, train: pd.DataFrame, demos: pd.DataFrame | None, targets: list[Calibration],
                       generation: GenerationConfig, audit_config: AuditConfig, *, delta: float, split_seed: int,
                       noise_seed: int | None, charge, thresholds, cache: dict, trial_seed: int) -> list:
    """regenerate (Tang et al. App. F): per epsilon, DP demo sets generated from the member half (each
    generation charged first through `charge(plan)`), scored members against non-members; the run's own DP
    demos checked for verbatim overlap with their labels' records."""
    from dpcore.audit import procedures as mia
    from dpcore.audit.overlap import model_tokenize

    logger = stage_logger()
    members, non_members, member_counts = audit_members(train, split_seed, spec.label_names)
    tokenize = model_tokenize(lm)
    pool_tokens = cache.setdefault(mia.OVERLAP_POOLS, {})  # the records' tokens, shared with the audits'
    results = []
    for target in targets:
        eps = float(target.epsilon)
        plan = audit_plan(generation, member_counts, eps, delta, audit_config.demo_sets)
        (charged,) = plan.privacy_plans()
        result = dp_audit_at(
            lm, spec, members, non_members, audit_config, generation, plan.calibration(eps), seed=trial_seed,
            noise_seed=derive_seed(noise_seed, "audit-noise", eps), crosscheck_agreed=target.crosscheck_agreed,
            thresholds=thresholds, charge=charge(charged), cache=cache, what=f"audit demo sets eps={eps:g}")
        own = demos[demos["epsilon"] == eps] if demos is not None else None
        if own is not None and len(own):  # the run's own DP demos, against their labels' records
            found = mia.demo_overlap(tokenize, own["text"].tolist(), own["label"].tolist(), train,
                                     result.overlap_threshold, pool_tokens)
            result = mia.with_demo_overlap(result, *found, thresholds)
        results.append(result)
        _log_result(logger, eps, result)
    return results


def _log_result(logger, eps: float, result) -> None:
    """The verdict only: the audit's figures are statistics of private records (private audit table)."""
    logger.info(AUDIT_VERDICT_LOG, eps, result.statement())


def public_summary(result) -> dict:
    return result.public_summary()
