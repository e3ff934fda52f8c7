"""CLI: `dpicl evaluate` (ICL accuracy of one demo set or one baseline).

    dpicl evaluate --dataset NAME (--demos PATH | --baseline zero-shot|instruction-only|random-real)
                   [--model NAME] [--shots S] [--test-size N] [--seeds K] [--no-calibrate]
                   [--data-path FILE --task-spec YAML] [--device D] [--out DIR] [--json]
                   [--endpoint URL [--timeout S] [--retries R] [--scoring auto|echo|logprobs|text]]

With `--endpoint` the prompts go to an OpenAI-compatible server (`dpcore.release.endpoint`; `--model` is the served
model's name): DP demos (`--demos`) or zero-shot only, and the test texts with them; never real records.

`--baseline instruction-only` first generates demos from the instruction alone (epsilon = 0,
`tasks.generate.generate_for`; `--max-tokens`, `--top-k`, `--no-rvp`, `--seed` apply).

Writes `metrics.parquet` (accuracy per seed: aggregates), `summary.json` and `manifest.json` to
`$DPICL_HOME/runs/<dataset>/<data hash[:12]>/evaluate-<UTC time>/` (or `--out DIR`).
`predictions.parquet` (each test item's id, gold label and label probabilities: per-record
functions of the test split, which comes from the private data) goes to the private store,
`$DPICL_HOME/private/runs/<dataset>/<data hash[:12]>/<same folder name>/`, never to the public
folder or `--json`. For `--baseline random-real` the ids of the real records used as demos
(they reveal membership) go to a private `real_demos` table there as well. No record text is
ever printed.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from dpcore.display import fmt_eps
from dpcore.errors import ConfigError
from dpcore.names import method_name
from flows.cli import common as cli
from flows.cli.endpoint import add_endpoint_flags, endpoint_config

EVAL_FLAGS = [*cli.DATA_FLAGS, "shots", "seeds", "test_size", "calibrate", "seed", "delta", "max_tokens", "top_k", "rvp"]
BASELINES = ("zero-shot", "instruction-only", "random-real")


def register(subparsers) -> None:
    parser = cli.command(
        subparsers, "evaluate", _evaluate, help="ICL accuracy (raw and calibrated) of a demo set or a baseline",
        description="In-context learning accuracy of synthetic demos (--demos) or of a baseline, over several "
        "seeds (demo choice and order), with contextual calibration (Zhao et al. 2021).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--demos", metavar="PATH", help="a demos Parquet (columns label, text[, method, epsilon])")
    source.add_argument("--baseline", choices=BASELINES, help="evaluate a baseline instead of a demos file")
    cli.add_config_flags(parser, EVAL_FLAGS)
    parser.add_argument("--method", default=None, type=method_name,
                        help="with --demos: keep only rows of this method (when the file holds several)")
    parser.add_argument("--epsilon", type=cli.parse_epsilon, default=None,
                        help="with --demos: the epsilon the demos were generated at (default: the file's "
                        "epsilon column, inf for sigma-zero, 0 for instruction-only, else accounted from the "
                        "demos' noise multiplier and generation settings at --delta, default 1/|D_priv|)")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="test items per forward pass (with --endpoint: prompts per request)")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="extraction tasks: greedy answer length")
    cli.add_output_flags(parser, out=True, json_help="print one JSON object instead of the table")
    add_endpoint_flags(parser, sizes=False)


# --------------------------------------------------------------------------- output


def _fmt_eps(epsilon: float) -> str:
    return fmt_eps(epsilon)


def format_table(summary: dict) -> str:
    lines = [f"{summary['dataset']}: {summary['method']} (epsilon {_fmt_eps(summary['epsilon'])}), "
             f"{summary['shots']} shots, {summary['n']} test items, model {summary['model']}",
             f"{'seed':>6} {'accuracy':>9} {'calibrated':>11}", "-" * 28]
    acc, cal = summary["accuracy"], summary["calibrated_accuracy"]
    for seed, (a, c) in enumerate(zip(acc["per_seed"], cal["per_seed"], strict=True)):
        lines.append(f"{seed:>6} {a:>9.3f} {c:>11.3f}")
    lines.append("-" * 28)
    lines.append(f"{'mean':>6} {acc['mean']:>9.3f} {cal['mean']:>11.3f}")
    lines.append(f"{'std':>6} {acc['std']:>9.3f} {cal['std']:>11.3f}")
    if summary.get("endpoint"):
        top = f" top {summary['top_logprobs']}" if summary.get("top_logprobs") else ""
        lines.append(f"through endpoint {summary['endpoint']} (scoring: {summary['scoring']}{top})")
    if not summary["calibrated"]:
        why = " (text answers: no probabilities)" if summary.get("scoring") == "text" else ""
        lines.append(f"(no calibration applied{why}: calibrated = raw)")
    lines.append(f"{summary['seconds']} s ({summary['seconds_per_100_items']:.0f} s per 100 items)")
    lines.append(f"output: {summary['out']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- handler


def _evaluate(args: argparse.Namespace) -> int:
    from flows import standalone
    from flows.cli.progress import showing_progress, stopping_on_signals

    if args.batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {args.batch_size}")
    if args.baseline and (args.method or args.epsilon is not None):
        raise ConfigError("--method/--epsilon apply to --demos only")
    endpoint = endpoint_config(args, args.model)
    if endpoint is not None:
        endpoint = replace(endpoint, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    config = cli.checked_config(args)
    with stopping_on_signals(), showing_progress(not args.json):
        summary = standalone.evaluate(config, demos=args.demos, method=args.method, epsilon=args.epsilon,
                                      baseline=args.baseline, out=Path(args.out) if args.out else None,
                                      batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, say=cli.say,
                                      endpoint=endpoint)
    if args.json:
        cli.print_json(summary)
    else:
        print(format_table(summary))
    return 0
