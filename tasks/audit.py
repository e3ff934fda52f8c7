"""Stage 6: the membership-inference audit (`dpcore.audit`, Duan et al. 2023 / Tang et al. Appendix F).

Every audit runs every attack of `dpcore.mia_attacks` (Duan et al.'s score, difficulty-
calibrated label and text scores, offline LiRA) and gates on the strongest. Two designs
(`AuditConfig.mode`):

run-demos: the run's own DP demonstrations were generated from the whole private split, so
every private record is a member; the held-out (test) records are the non-members. Each
demo's 1-shot prompt is attacked with members vs non-members of its label
(`dpcore.audit.demos_audit`): nothing is generated, nothing is charged, and every epsilon
is audited on the same candidate records (their reference scores computed once).

regenerate (default): for each DP epsilon of the run: the private records are split into members and
non-members (`split_members`), sigma is calibrated for the members' label counts (the
audit generates from half the data, so its q is larger), and `dp_audit` generates DP
demo sets from the members only and scores members against non-members. A non-private
reference audit (real records as 1-shot demos, Duan et al.'s leaky setting) is run for
the ROC comparison; it fails the gate by design, so it is kept out of the `audit` table
(which the release gate reads) and goes to `audit_reference` (its verbatim-overlap figure is
measured against a 2,000-record sample: its demos are real records by construction).

The run's own DP demonstrations are also checked for verbatim overlap with the private
records of their label; an overlap at or above the threshold fails that epsilon's gate.

Outputs: public aggregates `audit`, `audit_reference` and `roc.png` (DP audits only); private
(record ids and per-record scores) `mia_scores` and `roc_reference.png` (with the non-private curve).
The audit's DP generations read private records: they are charged to the privacy ledger
(when `dpcore.ledger` exists) before each generation, through dp_audit's `charge` hook.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task

from dpcore.artifacts import read_table, write_table
from dpcore.config import AuditConfig, GenerationConfig, RunConfig
from dpcore.errors import ConfigError
from tasks.common import (
    RETRIES,
    RETRY_DELAY_SECONDS,
    cache_key_on,
    derive_seed,
    language_model,
    report_progress,
    stage_dir,
    stage_key,
    transient_only,
)

AUDIT_MODULES = ("dpcore.audit", "dpcore.audit_statistics", "dpcore.audit_gate", "dpcore.overlap", "dpcore.mia_attacks",
                 "dpcore.generation", "dpcore.mechanisms", "dpcore.sampling", "dpcore.icl", "dpcore.prefix_cache",
                 "dpcore.accounting")
# The non-private audit's demos ARE records (dpcore adds them to the overlap pool), so its overlap figure is
# exact on any pool; above this size a random sample keeps the check cheap (the pipeline and `dpicl audit`).
REFERENCE_OVERLAP_SAMPLE = 2000
AUDIT_KEY_FIELDS = ("data_hash", "task_spec", "targets", "generation", "audit_config", "model", "dtype", "seed",
                    "noise_scope", "demo_keys", "non_private_reference", "delta")


def audit_call(config: RunConfig, ingested: dict, calibration: list[dict], shards: list[dict],
               generation_config: GenerationConfig, noise_scope: str) -> dict:
    """The keyword arguments of the `audit` task for a pipeline run."""
    targets = [{"epsilon": float(row["epsilon"]), "crosscheck_agreed": bool(row["crosscheck_agreed"]),
                "noise_multiplier": None if row.get("noise_multiplier") is None else float(row["noise_multiplier"])}
               for row in calibration if row["method"] == "dp"]
    dp_shards = sorted((s for s in shards if s["method"] == "dp"), key=lambda s: (s["epsilon"], s["label"]))
    delta = next((float(row["delta"]) for row in calibration if row.get("delta") is not None), None)
    return dict(records_path=ingested["records_path"], data_hash=ingested["data_hash"],
                task_spec=ingested["task_spec"], targets=targets, generation=generation_config,
                audit_config=config.audit_config(), model=config.model, device=config.device, dtype=config.dtype,
                seed=config.seed, noise_scope=noise_scope, demo_paths=[s["path"] for s in dp_shards],
                demo_keys=[s["key"] for s in dp_shards], non_private_reference=config.audit_reference,
                delta=delta, dataset_id=config.ledger_id, run_id=ingested["paths"]["run_id"])


def _progress(what: str):
    return lambda done, total: report_progress(what, done, total)


def outputs_exist(result: dict) -> bool:
    return all(Path(result[name]).exists() for name in ("mia_scores_path", "audit_path"))


@task(name="audit", tags=["gpu"], cache_key_fn=cache_key_on("audit", AUDIT_KEY_FIELDS, AUDIT_MODULES),
      persist_result=True, result_serializer="json", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_SECONDS,
      retry_condition_fn=transient_only)
def audit(
    *,
    records_path: str,
    data_hash: str,
    task_spec: str,
    targets: list[dict],
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
) -> dict:
    """Audit every DP epsilon of a run; returns stage paths and the per-epsilon summaries (public)."""
    from dpcore import accounting
    from dpcore import audit as mia
    from dpcore.audit_gate import GateThresholds
    from dpcore.overlap import model_tokenize
    from dpcore.plots import roc_plot
    from dpcore.taskspec import load_task_spec
    from tasks.charge import audit_charge_hook

    logger = get_run_logger()
    key = stage_key("audit", {name: value for name, value in locals().items() if name in AUDIT_KEY_FIELDS},
                    AUDIT_MODULES)
    spec = load_task_spec(task_spec)
    lm = language_model(model, device, dtype)
    records = read_table(Path(records_path))
    train = records[records["split"] == "train"][["id", "text", "label"]].reset_index(drop=True)
    delta = delta if delta is not None else accounting.default_delta(len(train))
    # The member split is an audit design choice, not privacy noise: reproducible from the data hash.
    split_seed = derive_seed(seed if seed is not None else int(data_hash[:15], 16), "audit-split")
    demos = pd.concat([read_table(Path(p)) for p in demo_paths or []], ignore_index=True) if demo_paths else None
    thresholds = GateThresholds.from_config(audit_config)
    cache: dict = {}  # reference scores of a candidate, shared by the epsilons (same OUT prompts)

    results, rows = [], []
    if audit_config.mode == "run-demos":
        held_out = records[records["split"] != "train"][["id", "text", "label"]].reset_index(drop=True)
        if held_out.empty:
            raise ConfigError("audit: the run-demos audit needs held-out (test) records as non-members")
        for target in targets:
            eps = float(target["epsilon"])
            own = demos[demos["epsilon"] == eps] if demos is not None else pd.DataFrame(columns=["text", "label"])
            if own.empty:
                logger.warning("audit at epsilon %g: the run has no DP demonstration to audit", eps)
                continue
            # The same trial seed for every epsilon: the same candidates, scored against each epsilon's demos.
            result = mia.demos_audit(
                lm, spec, list(zip(own["text"].astype(str), own["label"].astype(str), strict=True)), train,
                held_out, audit_config, seed=derive_seed(split_seed, "audit-trials"), epsilon=eps,
                noise_multiplier=target.get("noise_multiplier"), delta=delta,
                crosscheck_agreed=target["crosscheck_agreed"], thresholds=thresholds, cache=cache,
                progress=_progress(f"audit demos eps={eps:g}"),
            )
            results.append(result)
            rows.append(result.audit_frame())
            _log_result(logger, eps, result)
    else:
        members, non_members = mia.split_members(train, seed=split_seed)
        member_counts = members["label"].astype(str).value_counts().to_dict()
        member_counts = {label: int(member_counts.get(label, 0)) for label in spec.label_names}
        steps = accounting.total_steps(generation.max_tokens, 1)
        tokenize = model_tokenize(lm)
        pool_tokens: dict = {}
        for target in targets:
            eps = float(target["epsilon"])
            calibrated = accounting.calibrate_for_labels(eps, member_counts, generation.num_subsets,
                                                         generation.subset_size, steps, delta,
                                                         mechanism=generation.mechanism)
            sigma = float(calibrated["noise_multiplier"])
            q = float(calibrated["sampling_rate"])  # the members' largest q (the audit's own spend)
            hook = audit_charge_hook(dataset_id, data_hash, run_id, sigma, q, steps, delta, generation.mechanism)
            result = mia.dp_audit(
                lm, spec, members, non_members, audit_config, generation, sigma,
                seed=derive_seed(split_seed, "audit-trials", eps), epsilon=eps, delta=delta,
                crosscheck_agreed=target["crosscheck_agreed"],
                noise_seed=derive_seed(seed, "audit-noise", eps), charge=hook, thresholds=thresholds, cache=cache,
                progress=_progress(f"audit demo sets eps={eps:g}"),
            )
            own = demos[demos["epsilon"] == eps] if demos is not None else None
            if own is not None and len(own):  # the run's own DP demos, against their labels' records
                found = mia.demo_overlap(tokenize, own["text"].tolist(), own["label"].tolist(), train,
                                         result.overlap_threshold, pool_tokens)
                result = mia.with_demo_overlap(result, *found, thresholds)
            results.append(result)
            rows.append(result.audit_frame())
            _log_result(logger, eps, result)

    reference = None
    if non_private_reference:
        # Its demos are real records (verbatim copies by construction): the overlap check runs on a
        # sample of the records only, to keep the reference cheap on large datasets.
        sample = train.sample(n=min(len(train), REFERENCE_OVERLAP_SAMPLE), random_state=split_seed % (2**32))
        reference = mia.non_private_audit(lm, spec, train, audit_config, seed=derive_seed(split_seed, "reference"),
                                          delta=delta, thresholds=thresholds, overlap_records=sample,
                                          progress=_progress("audit non-private reference trials"))
        logger.info("non-private reference audit (real 1-shot demos): AUC %.3f (%s attack; %s)", reference.auc,
                    reference.attack, ", ".join(f"{a.attack} {a.auc:.3f}" for a in reference.attacks))

    out = stage_dir("audit", key)
    # Per-record scores (record ids, membership bits, scores) are a function of private records: private
    # store only. The public ROC is an aggregate of the DP audits; one drawn with the non-private
    # reference goes to the private store too.
    private_out = stage_dir("audit", key, private=True)
    scores = pd.concat([r.mia_scores for r in results + ([reference] if reference else [])], ignore_index=True)
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["setting", "epsilon", "passed"])
    title = f"{spec.name}: membership inference ROC"
    result = {
        "key": key,
        "mia_scores_path": str(write_table(scores, private_out / "mia_scores.parquet")),
        "audit_path": str(write_table(table, out / "audit.parquet")),
        "roc_path": str(roc_plot(results, out / "roc.png", title=title)) if results else None,
        "summary": [public_summary(r) for r in results],
    }
    if reference is not None:
        result["reference_roc_path"] = str(roc_plot(results + [reference], private_out / "roc_reference.png",
                                                    title=title))
        result["reference_path"] = str(write_table(reference.audit_frame(), out / "audit_reference.parquet"))
        result["reference"] = public_summary(reference)
    return result


def _log_result(logger, eps: float, result) -> None:
    logger.info("audit at epsilon %g: AUC %.3f (CI %.3f-%.3f, %s attack; %s), TPR@1%%FPR %.3f, max overlap %d "
                "tokens: %s", eps, result.auc, result.auc_ci[0], result.auc_ci[1], result.attack,
                ", ".join(f"{a.attack} {a.auc:.3f}" for a in result.attacks), result.tpr_at_1pct_fpr,
                result.max_overlap_tokens, "passed" if result.passed else "FAILED")


def public_summary(result) -> dict:
    summary = result.summary()
    return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in summary.items()
            if k in ("setting", "epsilon", "noise_multiplier", "attack", "attacks", "auc", "auc_ci", "tpr_at_1pct_fpr",
                     "tpr_at_01pct_fpr", "epsilon_lower_bound", "max_overlap_tokens", "passed", "reasons",
                     "trials", "demo_sets")}
