"""CLI: `dpicl audit` — membership-inference audit and verbatim-leakage checks.

    dpicl audit --dataset NAME (--epsilon E | --non-private) [--model NAME] [--trials K] [--json]
                [--audit-demo-sets S] [--audit-members N] [--confidence C]
                [--audit-test detect|equivalence] [--leak-auc A] [--audit-power P] [--auc-tolerance T]
                [--audit-reference-prompts R] [--audit-max-record-tokens N]
                [--overlap-threshold K] [--reference] [--out DIR]
                [--num-subsets M] [--subset-size N] [--top-k K] [--no-rvp] [--max-tokens T]
                [--mechanism gaussian|rnm] [--sampler poisson|fixed] [--delta D] [--seed S]
                [--data-path FILE --task-spec YAML] [--dataset-id ID] [--device DEV] [--dtype DTYPE]

Every audit runs the calibrated attacks of `dpcore.audit.attacks` (Duan et al.'s label probability,
difficulty-calibrated label and text log-probabilities: 2 forward passes per record) and gates on the
strongest; `--audit-reference-prompts R` (R >= 2) adds offline LiRA against R OUT prompts (R more passes
per record).

`--non-private`: Duan et al.'s setting, 1-shot prompts holding a real record (leaky by
design), sized like every audit for the gate it is checked by: the fewest trials that detect a leak
of `--leak-auc` with `--audit-power` (35 trials of 1 member vs 4 non-members at the defaults), unless
`--trials` or `--audit-members` set them. `--epsilon E`: Tang et al. Appendix F: the private
records are split into members and non-members, sigma is calibrated for E on the
members' label counts (dpcore.fewshot.accounting), DP demo sets are generated from the members
only (each generation charged to the privacy ledger first, all demo sets at once), and
members are scored against non-members (`--trials` default: --audit-trials, 20 per demo
set). `--epsilon inf` audits sigma = 0 demos; `--epsilon 0` instruction-only demos.
`--reference` also runs the non-private audit and draws both ROC curves.

Writes `audit.parquet` and `audit.json` (the design and the gate's verdict) and a manifest under
`--out DIR` or `$DPICL_HOME/runs/<dataset>/<content_hash[:12]>/audit-<timestamp>/`. Every figure of
the audit (AUC per attack, intervals, TPR, epsilon lower bounds, overlap, the ROC plot, the per-record
scores) is a statistic of private records: it goes to `$DPICL_HOME/private/runs/<dataset>/<hash12>/<same
folder name>/` (the operator's diagnostic), never to the public folder, --json or the logs.

Exit code: 0 when the gate passes, 1 when it fails (CI can gate a release on
`dpicl audit`), 2 on bad input, 3 when the ledger budget refuses the audit's generations.
"""

from __future__ import annotations

from pathlib import Path

from dpcore.display import fmt_eps, fmt_sigma
from dpcore.errors import ConfigError
from flows.cli.common import (
    DATA_FLAGS,
    GENERATION_FLAGS,
    add_config_flags,
    add_output_flags,
    checked_config,
    command,
    parse_epsilon,
    print_json,
    say,
)
from flows.cli.progress import showing_progress, stopping_on_signals

CONFIG_FLAGS = [*DATA_FLAGS, "delta", *GENERATION_FLAGS, "seed", "audit_demo_sets", "audit_members", "audit_reference_prompts", "audit_max_record_tokens",
                "audit_test", "leak_auc", "audit_power", "auc_tolerance", "overlap_threshold"]


def register(subparsers) -> None:
    parser = command(
        subparsers, "audit", run_audit, help="membership-inference audit (Duan et al.) and verbatim-leakage gate",
        description="Attack ICL prompts with membership inference (Duan et al. 2023, Tang et al. Appendix F), "
        "check synthetic demos for verbatim copies, and gate on the result (exit 1 when the gate fails).")
    privacy = parser.add_mutually_exclusive_group(required=True)
    privacy.add_argument("--epsilon", type=parse_epsilon,
                         help="audit DP demos generated at this epsilon ('inf': sigma 0; 0: instruction-only)")
    privacy.add_argument("--non-private", action="store_true",
                         help="audit 1-shot prompts holding a real record (Duan et al.; leaky by design)")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per demo set (DP) or in total (non-private; default: the fewest that detect "
                             "--leak-auc at --audit-power, 35 trials of 1 + 4 records at the defaults)")
    parser.add_argument("--confidence", type=float, default=None,
                        help="confidence of the AUC interval and of the epsilon lower bound (default 0.95)")
    parser.add_argument("--reference", action="store_true",
                        help="with --epsilon: also run the non-private audit and plot both ROC curves")
    add_config_flags(parser, CONFIG_FLAGS)
    add_output_flags(parser, out=True)


def _audit_config(args, config):
    updates = {}
    if args.trials is not None:
        if args.trials < 1:
            raise ConfigError(f"--trials: must be >= 1, got {args.trials}")
        updates["trials"] = args.trials
    if args.confidence is not None:
        if not 0 < args.confidence < 1:
            raise ConfigError(f"--confidence: must lie in (0, 1), got {args.confidence}")
        updates["confidence"] = args.confidence
    return config.audit_config().model_copy(update=updates)


def run_audit(args) -> int:
    # Prefect, dp-accounting load here, not for `dpicl --help`
    from flows import standalone

    config = checked_config(args)
    audit_config = _audit_config(args, config)
    epsilon = None if args.non_private else float(args.epsilon)
    with stopping_on_signals(), showing_progress(not args.json):
        result, reference, summary = standalone.audit(
            config, audit_config, epsilon, args.reference, Path(args.out) if args.out else None, say,
            reference_sized=args.trials is None and "audit_members" not in config.flat_fields_set)
    if args.json:
        print_json(summary)
    else:
        _print_text(result, reference, summary)
    return 0 if result.passed else 1


def _print_text(result, reference, summary: dict) -> None:
    name = "non-private (real 1-shot demos)" if result.setting == "non-private" else (
        f"{result.setting} demos at epsilon {fmt_eps(result.epsilon)} (sigma {fmt_sigma(result.noise_multiplier)})")
    print(f"audit of {name}: {result.trials} trials, {result.members_per_trial} member(s) vs "
          f"{result.non_members_per_trial} non-members each, {100 * result.confidence:g}% intervals")
    if reference is not None:
        print(f"reference (non-private): {summary['reference']['verdict']}")
    statement = result.statement()
    detail = statement.partition(": ")[2] if result.passed else ""
    print(f"gate: {summary['verdict'].upper()}{': ' + detail if detail else ''}; wrote {summary['out']}")
    for reason in result.reasons:
        print(f"  - {reason}")
    print(f"figures (AUC per attack, intervals, TPR, overlap): {summary['private_out']}/audit.json, in the private "
          "store: statistics of private records, never published")
