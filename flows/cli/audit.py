"""CLI: `dpicl audit` — membership-inference audit and verbatim-leakage checks.

    dpicl audit --dataset NAME (--epsilon E | --non-private) [--model NAME] [--trials K] [--json]
                [--audit-demo-sets S] [--audit-members N] [--confidence C] [--auc-tolerance T]
                [--audit-reference-prompts R] [--audit-max-record-tokens N]
                [--overlap-threshold K] [--reference] [--out DIR]
                [--num-subsets M] [--subset-size N] [--top-k K] [--no-rvp] [--max-tokens T]
                [--mechanism gaussian|rnm] [--sampler poisson|fixed] [--delta D] [--seed S]
                [--data-path FILE --task-spec YAML] [--dataset-id ID] [--device DEV] [--dtype DTYPE]

Every audit runs every attack of `dpcore.mia_attacks` (Duan et al.'s label probability,
difficulty-calibrated label and text log-probabilities, offline LiRA against
`--audit-reference-prompts` OUT prompts) and gates on the strongest.

`--non-private`: Duan et al.'s setting, 1-shot prompts holding a real record (leaky by
design; `--trials` default 100). `--epsilon E`: Tang et al. Appendix F: the private
records are split into members and non-members, sigma is calibrated for E on the
members' label counts (dpcore.accounting), DP demo sets are generated from the members
only (each generation charged to the privacy ledger first, all demo sets at once), and
members are scored against non-members (`--trials` default: --audit-trials, 20 per demo
set). `--epsilon inf` audits sigma = 0 demos; `--epsilon 0` instruction-only demos.
`--reference` also runs the non-private audit and draws both ROC curves.

Writes `audit.parquet` (aggregates), `roc.png` (DP audits only), `audit.json` and a manifest under
`--out DIR` or `$DPICL_HOME/runs/<dataset>/<content_hash[:12]>/audit-<timestamp>/`; the per-record
`mia_scores.parquet` (record ids, membership, scores) and a ROC drawn with a non-private audit go to
`$DPICL_HOME/private/runs/<dataset>/<hash12>/<same folder name>/`. Nothing public holds a record's
text or a per-record value.

Exit code: 0 when the gate passes, 1 when it fails (CI can gate a release on
`dpicl audit`), 2 on bad input, 3 when the ledger budget refuses the audit's generations.
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from dpcore.config import RunConfig
from dpcore.errors import ConfigError
from flows.cli.common import add_config_flags, config_from_args, jsonable, parse_epsilon, print_json

log = logging.getLogger("dpicl.audit")

CONFIG_FLAGS = ["dataset", "data_path", "test_path", "task_spec", "dataset_id", "model", "device", "dtype", "delta",
                "mechanism", "sampler", "num_subsets", "subset_size", "top_k", "rvp", "max_tokens", "max_record_tokens",
                "seed", "audit_demo_sets", "audit_members", "audit_reference_prompts", "audit_max_record_tokens",
                "auc_tolerance", "overlap_threshold"]
NON_PRIVATE_TRIALS = 100  # Duan et al. Section 3 / Tang et al. Appendix F
JSON_KEYS = ("setting", "dataset", "model", "epsilon", "noise_multiplier", "delta", "attack", "auc", "auc_ci",
             "auc_ci_method", "attacks",
             "pooled_auc", "tpr_at_1pct_fpr", "tpr_at_01pct_fpr", "epsilon_lower_bound",
             "epsilon_lower_bound_method", "confidence", "max_overlap_tokens", "overlapping_records",
             "overlap_threshold", "crosscheck_agreed", "trials", "demo_sets", "members_per_trial",
             "non_members_per_trial", "passed", "reasons", "seconds")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit", help="membership-inference audit (Duan et al.) and verbatim-leakage gate",
        description="Attack ICL prompts with membership inference (Duan et al. 2023, Tang et al. Appendix F), "
        "check synthetic demos for verbatim copies, and gate on the result (exit 1 when the gate fails).")
    privacy = parser.add_mutually_exclusive_group(required=True)
    privacy.add_argument("--epsilon", type=parse_epsilon,
                         help="audit DP demos generated at this epsilon ('inf': sigma 0; 0: instruction-only)")
    privacy.add_argument("--non-private", action="store_true",
                         help="audit 1-shot prompts holding a real record (Duan et al.; leaky by design)")
    parser.add_argument("--trials", type=int, default=None,
                        help=f"trials per demo set (DP) or in total (non-private, default {NON_PRIVATE_TRIALS})")
    parser.add_argument("--confidence", type=float, default=None,
                        help="confidence of the AUC interval and of the epsilon lower bound (default 0.95)")
    parser.add_argument("--reference", action="store_true",
                        help="with --epsilon: also run the non-private audit and plot both ROC curves")
    add_config_flags(parser, CONFIG_FLAGS)
    parser.add_argument("--out", default=None, help="output folder (default: under $DPICL_HOME/runs/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_audit)


def _config(args) -> RunConfig:
    try:
        return config_from_args(args)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
                             for err in exc.errors())
        raise ConfigError(problems) from None
    except ValueError as exc:  # an int flag that is not an int
        raise ConfigError(str(exc)) from None


def _audit_config(args, config: RunConfig):
    updates = {}
    if args.trials is not None:
        if args.trials < 1:
            raise ConfigError(f"trials: must be >= 1, got {args.trials}")
        updates["trials"] = args.trials
    elif args.non_private:
        updates["trials"] = NON_PRIVATE_TRIALS
    if args.confidence is not None:
        if not 0 < args.confidence < 1:
            raise ConfigError(f"confidence: must lie in (0, 1), got {args.confidence}")
        updates["confidence"] = args.confidence
    return config.audit_config().model_copy(update=updates)


def _default_out(dataset, home) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return home / "runs" / dataset.spec.name / dataset.content_hash[:12] / f"audit-{stamp}-{secrets.token_hex(2)}"


def _charge_ledger(config: RunConfig, dataset, run_id: str, privacy: dict, demo_sets: int, dry_run: bool = False):
    """PRIVACY LEDGER HOOK: the audit's DP generations read the members' records. All demo sets are
    charged at once (all-or-nothing, dpcore.ledger.Ledger.charge_many) before any record is read."""
    from dpcore.ledger import ChargeRequest, Ledger

    request = ChargeRequest(
        dataset_id=config.ledger_id, content_hash=dataset.content_hash, run_id=run_id,
        mechanism=config.mechanism, noise_multiplier=privacy["noise_multiplier"],
        sampling_rate=privacy["sampling_rate"], steps=privacy["steps"], delta=privacy["delta"], purpose="audit",
    )
    if dry_run:  # the budget refusal (exit 3) before the model loads; records nothing
        Ledger().check_charge([request] * demo_sets)
        return []
    return [entry.to_dict() for entry in Ledger().charge_many([request] * demo_sets)]


def _charge_real_records(config: RunConfig, dataset, run_id: str, delta: float, dry_run: bool = False) -> list[dict]:
    """PRIVACY LEDGER HOOK: the non-private audit (`--non-private`, `--reference`) is charged as an
    infinite spend, like every non-private baseline, before it reads a record."""
    from dpcore.ledger import Ledger
    from tasks.charge import real_records_spend

    request = real_records_spend(config, dataset.content_hash, run_id, delta)
    if dry_run:
        Ledger().check_charge([request])
        return []
    return [entry.to_dict() for entry in Ledger().charge_many([request])]


def _progress(what: str):
    from tasks.common import report_progress

    return lambda done, total: report_progress(what, done, total)


def _split_seed(config: RunConfig, dataset) -> int:
    """The member/non-member split and the trial draws: an audit design choice, not privacy noise.
    Reproducible: --seed when given, else derived from the data's content hash."""
    return int(config.seed) if config.seed is not None else int(dataset.content_hash[:15], 16)


def run_audit(args) -> int:
    from flows.cli.progress import showing_progress, stopping_on_signals

    with stopping_on_signals(), showing_progress(not args.json):
        return _run_audit(args)


def _run_audit(args) -> int:
    from dpcore import accounting, plots
    from dpcore import audit as mia
    from dpcore.artifacts import write_json_atomic, write_manifest, write_table
    from dpcore.datasets import load_dataset
    from dpcore.generation import validate_generation
    from dpcore.home import dpicl_home, private_dir
    from dpcore.lm import LanguageModel
    from dpcore.taskspec import load_task_spec

    began = time.perf_counter()
    config = _config(args)
    audit_config = _audit_config(args, config)
    spec = load_task_spec(config.task_spec or config.dataset)
    if spec.kind != "classification":
        raise ConfigError(f"dataset: task {spec.name!r} is {spec.kind}; the membership audit scores class labels")
    dataset = load_dataset(spec, config.data_path, config.test_path)
    train = dataset.train
    delta = config.delta if config.delta is not None else accounting.default_delta(len(train))
    thresholds = mia.GateThresholds.from_config(audit_config)
    seed = _split_seed(config, dataset)
    out = Path(args.out) if args.out else _default_out(dataset, dpicl_home())
    run_id = out.name

    privacy, ledger_entries, members = None, [], None
    if not args.non_private:
        epsilon = float(args.epsilon)
        members, non_members = mia.split_members(train, seed=seed)
        member_counts = members["label"].astype(str).value_counts().to_dict()
        member_counts = {label: int(member_counts.get(label, 0)) for label in dataset.labels}
        gen_config = config.generation_config().model_copy(update={"demos_per_label": 1})
        steps = accounting.total_steps(config.max_tokens, 1)
        # Parameter errors before anything expensive (the vocabulary check follows the model load).
        validate_generation(gen_config, 0.0, sys.maxsize, member_counts if epsilon > 0 else None)
        if epsilon > 0:  # the longest group prompt fits the model's context (tokenizer only, before the charge)
            from dpcore.records import check_model_budget

            check_model_budget(config.model, spec, dataset.labels, gen_config)
        if epsilon == 0:
            privacy = {"epsilon": 0.0, "noise_multiplier": math.inf, "sampling_rate": 0.0, "steps": steps,
                       "delta": delta, "crosscheck_agreed": True, "warnings": []}
        else:
            calibrated = accounting.calibrate_for_labels(epsilon, member_counts, config.num_subsets,
                                                         config.subset_size, steps, delta,
                                                         mechanism=config.mechanism)
            privacy = {key: calibrated[key] for key in ("epsilon", "noise_multiplier", "sampling_rate", "steps",
                                                        "delta", "crosscheck_agreed")}
            privacy["warnings"] = list(calibrated["warnings"])
            _charge_ledger(config, dataset, run_id, privacy, audit_config.demo_sets, dry_run=True)
    non_private = args.non_private or args.reference
    if non_private:  # real records as 1-shot demos: an infinite spend, said and budget-checked before the model loads
        print(f"WARNING: the non-private audit puts real private records in prompts: it is charged to ledger id "
              f"'{config.ledger_id}' as an infinite spend (epsilon = inf); a budget on it refuses the audit.",
              file=sys.stderr, flush=True)
        _charge_real_records(config, dataset, run_id, delta, dry_run=True)
    lm = LanguageModel.load(config.model, config.device, config.dtype)
    if non_private:
        ledger_entries += _charge_real_records(config, dataset, run_id, delta)

    reference = None
    from tasks.audit import REFERENCE_OVERLAP_SAMPLE

    overlap_pool = train.sample(n=min(len(train), REFERENCE_OVERLAP_SAMPLE), random_state=seed % 2**32)
    if args.non_private:
        result = mia.non_private_audit(lm, spec, train, audit_config, seed=seed, delta=delta, thresholds=thresholds,
                                       overlap_records=overlap_pool, progress=_progress("audit: trials"))
    else:
        validate_generation(gen_config, 0.0, lm.vocab_size)
        if epsilon > 0:
            ledger_entries += _charge_ledger(config, dataset, run_id, privacy, audit_config.demo_sets)
        result = mia.dp_audit(
            lm, spec, members, non_members, audit_config, gen_config, privacy["noise_multiplier"], seed=seed,
            epsilon=epsilon, delta=delta, crosscheck_agreed=bool(privacy["crosscheck_agreed"]),
            noise_seed=config.seed, thresholds=thresholds, progress=_progress("audit: demo sets"),
        )
        if args.reference:
            reference = mia.non_private_audit(lm, spec, train, audit_config, seed=seed + 1, delta=delta,
                                              thresholds=thresholds, overlap_records=overlap_pool,
                                              progress=_progress("audit: non-private reference trials"))

    # Per-record scores (record ids, membership bits) and any ROC drawn from a non-private audit stay
    # private; the public folder keeps aggregates and the ROC of DP audits only.
    private_out = private_dir() / "runs" / spec.name / dataset.content_hash[:12] / out.name
    write_table(result.mia_scores if reference is None else
                _concat([result.mia_scores, reference.mia_scores]), private_out / "mia_scores.parquet")
    write_table(result.audit_frame(), out / "audit.parquet")
    if reference is not None:
        write_table(reference.audit_frame(), out / "audit_reference.parquet")
    audits = [result] + ([reference] if reference else [])
    dp_audits = [item for item in audits if item.setting != "non-private" and math.isfinite(item.epsilon)]
    if dp_audits:
        plots.roc_plot(dp_audits, out / "roc.png", title=f"{spec.name}: membership inference ROC")
    if len(dp_audits) < len(audits):
        plots.roc_plot(audits, private_out / "roc.png", title=f"{spec.name}: membership inference ROC")
    summary = {key: result.summary()[key] for key in JSON_KEYS}
    summary.update(run_id=run_id, out=str(out), content_hash=dataset.content_hash,
                   wall_seconds=time.perf_counter() - began, privacy=privacy, ledger_entries=len(ledger_entries),
                   seeded_noise=config.seed is not None)
    if reference is not None:
        summary["reference"] = {key: reference.summary()[key] for key in JSON_KEYS}
    write_json_atomic(out / "audit.json", jsonable(summary))
    write_manifest(out, {"run_id": run_id, "kind": "audit"})
    if args.json:
        print_json(summary)
    else:
        _print_text(result, reference, summary)
    return 0 if result.passed else 1


def _concat(frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def _print_text(result, reference, summary: dict) -> None:
    level = f"{100 * result.confidence:g}%"
    name = "non-private (real 1-shot demos)" if result.setting == "non-private" else (
        f"{result.setting} demos at epsilon {result.epsilon:g} (sigma {result.noise_multiplier:.4g})")
    print(f"audit of {name}: {result.trials} trials, {result.members_per_trial} member(s) vs "
          f"{result.non_members_per_trial} non-members each")
    for item in [result] + ([reference] if reference else []):
        tag = "" if item is result else "reference (non-private): "
        for attack in item.attacks:
            low, high = attack.auc_ci
            mark = "  <- gate" if attack.attack == item.attack else ""
            print(f"{tag}{attack.attack:<17} AUC {attack.auc:.3f} ([{low:.3f}, {high:.3f}]), "
                  f"TPR@1%FPR {attack.tpr_at_1pct_fpr:.3f}, empirical epsilon >= {attack.epsilon_lower_bound:.2f}"
                  f"{mark}")
        print(f"{tag}max verbatim overlap {item.max_overlap_tokens} tokens "
              f"(intervals: {level} simultaneous over the {len(item.attacks)} attacks)")
    print(f"gate: {'PASSED' if result.passed else 'FAILED'} ({summary['wall_seconds']:.0f} s); wrote {summary['out']}")
    for reason in result.reasons:
        print(f"  - {reason}")
