"""CLI: `dpicl evaluate` (ICL accuracy of one demo set or one baseline).

    dpicl evaluate --dataset NAME (--demos PATH | --baseline zero-shot|instruction-only|random-real)
                   [--model NAME] [--shots S] [--test-size N] [--seeds K] [--no-calibrate]
                   [--data-path FILE --task-spec YAML] [--device D] [--out DIR] [--json]

`--baseline instruction-only` first generates demos from the instruction alone (epsilon = 0,
`dpcore.generation.instruction_only_demos`; `--max-tokens`, `--top-k`, `--no-rvp`, `--seed` apply).

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
import math
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

EVAL_FLAGS = ["dataset", "data_path", "test_path", "task_spec", "model", "device", "dtype", "shots", "seeds", "test_size",
              "calibrate", "seed", "delta", "max_tokens", "top_k", "rvp"]
BASELINES = ("zero-shot", "instruction-only", "random-real")


def register(subparsers) -> None:
    from flows.cli.common import add_config_flags, parse_epsilon

    parser = subparsers.add_parser(
        "evaluate", help="ICL accuracy (raw and calibrated) of a demo set or a baseline",
        description="In-context learning accuracy of synthetic demos (--demos) or of a baseline, over several "
        "seeds (demo choice and order), with contextual calibration (Zhao et al. 2021).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--demos", metavar="PATH", help="a demos Parquet (columns label, text[, method, epsilon])")
    source.add_argument("--baseline", choices=BASELINES, help="evaluate a baseline instead of a demos file")
    add_config_flags(parser, EVAL_FLAGS)
    parser.add_argument("--method", default=None,
                        help="with --demos: keep only rows of this method (when the file holds several)")
    parser.add_argument("--epsilon", type=parse_epsilon, default=None,
                        help="with --demos: the epsilon the demos were generated at (default: the file's "
                        "epsilon column, inf for sigma-zero, 0 for instruction-only, else accounted from the "
                        "demos' noise multiplier and generation settings at --delta, default 1/|D_priv|)")
    parser.add_argument("--batch-size", type=int, default=16, help="test items per forward pass")
    parser.add_argument("--max-new-tokens", type=int, default=12, help="extraction tasks: greedy answer length")
    parser.add_argument("--out", default=None, help="output folder (default: under $DPICL_HOME/runs/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(handler=_evaluate)


# --------------------------------------------------------------------------- demo sources


def _epsilon_from_noise(frame, dataset, delta: float | None) -> float:
    """Run epsilon of DP demos from their generation settings (Poisson accountant; max over labels,
    parallel composition), or NaN when the file lacks a setting or used a sampler the accountant does not
    cover (`dpcore.sampling.ACCOUNTED_SAMPLERS`: Poisson, and fixed-size under add/remove neighbours)."""
    from dpcore import accounting
    from dpcore.sampling import ACCOUNTED_SAMPLERS

    needed = ("noise_multiplier", "num_subsets", "subset_size", "max_tokens", "shot")
    if any(column not in frame.columns for column in needed):
        return math.nan
    if "sampler" in frame.columns and not set(frame["sampler"].astype(str)) <= set(ACCOUNTED_SAMPLERS):
        return math.nan
    mechanism = str(frame["mechanism"].iloc[0]) if "mechanism" in frame.columns else "gaussian"
    delta = delta if delta is not None else accounting.default_delta(len(dataset.train))
    counts = dataset.label_counts()
    epsilons = []
    for label, rows in frame.groupby("label"):
        if counts.get(str(label), 0) < 1:
            return math.nan
        first = rows.iloc[0]
        q = accounting.sampling_rate(int(first["num_subsets"]), int(first["subset_size"]), counts[str(label)])
        steps = accounting.total_steps(int(first["max_tokens"]), int(rows["shot"].max()) + 1)
        report = accounting.epsilon_for(float(first["noise_multiplier"]), q, steps, delta, mechanism)
        epsilons.append(float(report.epsilon))
    return max(epsilons) if epsilons else math.nan


def _demos_from_file(path: str, method_filter: str | None, epsilon_flag: float | None, spec, dataset,
                     delta: float | None):
    """(pool, method, epsilon) from a demos Parquet written by `dpcore.generation.demos_frame`."""
    import pandas as pd

    from dpcore.config import DEMO_SOURCES as METHODS
    from dpcore.errors import ConfigError, DataValidationError

    file = Path(path)
    if not file.exists():
        raise DataValidationError(f"{file}: demos file not found")
    try:
        frame = pd.read_parquet(file)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DataValidationError(f"{file}: not a readable Parquet file ({type(exc).__name__})") from None
    for column in ("label", "text"):
        if column not in frame.columns:
            raise DataValidationError(f"{file}: missing column {column!r} (found: {', '.join(frame.columns)})")
    if method_filter is not None:
        if "method" not in frame.columns:
            raise ConfigError(f"--method: {file} has no method column")
        frame = frame[frame["method"] == method_filter]
    methods = sorted(set(frame["method"].astype(str))) if "method" in frame.columns else ["dp"]
    if len(methods) > 1:
        raise ConfigError(f"--demos: {file} holds demos of several methods ({', '.join(methods)}); pass --method")
    if not len(frame):
        raise DataValidationError(f"{file}: no demos" + (f" of method {method_filter!r}" if method_filter else ""))
    method = methods[0]
    if method not in METHODS:
        raise DataValidationError(f"{file}: column 'method': unknown method {method!r}")
    for column in ("epsilon", "noise_multiplier"):
        if column in frame.columns and frame[column].nunique(dropna=False) > 1:
            raise ConfigError(f"--demos: {file} mixes several values of {column}; split the file per epsilon")
    if epsilon_flag is not None:
        epsilon = epsilon_flag
    elif "epsilon" in frame.columns:
        epsilon = float(frame["epsilon"].iloc[0])
    elif method in ("sigma-zero", "random-real") or (
            "noise_multiplier" in frame.columns and float(frame["noise_multiplier"].iloc[0]) == 0.0
            and method != "instruction-only"):
        epsilon = math.inf
    elif method == "instruction-only":
        epsilon = 0.0
    else:
        epsilon = _epsilon_from_noise(frame, dataset, delta)
        if math.isnan(epsilon):
            print(f"dpicl evaluate: warning: {file} records no epsilon and not enough generation settings to "
                  "account for it; pass --epsilon E to label the results", file=sys.stderr)
        else:
            print(f"dpicl evaluate: epsilon {epsilon:.3f} accounted from the demos' noise multiplier "
                  f"(delta {delta if delta is not None else 1 / len(dataset.train):.3g}; --epsilon overrides)",
                  file=sys.stderr)
    pool = [(str(t), str(lab), f"{lab}/{i}") for i, (t, lab) in enumerate(zip(frame["text"], frame["label"],
                                                                            strict=True))]
    return pool, method, epsilon


def _instruction_only_pool(lm, spec, dataset, config):
    from dpcore import generation
    from dpcore.config import demos_per_label

    labels = spec.label_names if spec.kind == "classification" else dataset.labels[: max(1, config.shots)]
    gen_config = config.generation_config().model_copy(
        update={"demos_per_label": demos_per_label(config.shots, len(labels))})
    result = generation.instruction_only_demos(lm, spec, labels, gen_config, seed=config.seed)
    return [(d.text, d.label, f"{d.label}/{d.shot}") for d in result.demos]


# --------------------------------------------------------------------------- output


def _charge_random_real(config, dataset, run_id: str) -> None:
    """`--baseline random-real` puts real private records in the prompts: no privacy at all. It is charged to
    the ledger as an infinite spend (sigma = 0) before the model loads, refused under any budget (exit 3)."""
    import sys

    from dpcore.ledger import Ledger

    print(f"WARNING: --baseline random-real uses real private records as demonstrations: charged to ledger id "
          f"'{config.ledger_id}' as an infinite spend (epsilon = inf).", file=sys.stderr, flush=True)
    delta = config.delta if config.delta is not None else 1.0 / max(2, len(dataset.train))
    Ledger().charge(config.ledger_id, dataset.content_hash, run_id, config.mechanism, 0.0, 1.0, 1, delta,
                    "baseline")


def _out_dir(args, dataset) -> Path:
    from dpcore.home import dpicl_home

    if args.out:
        return Path(args.out)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return dpicl_home() / "runs" / dataset.spec.name / dataset.content_hash[:12] / f"evaluate-{stamp}"


def _stats(values) -> dict:
    import numpy as np

    values = [float(v) for v in values]
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "per_seed": values}


def _fmt_eps(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else ("?" if math.isnan(epsilon) else f"{epsilon:g}")


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
    if not summary["calibrated"]:
        lines.append("(no calibration applied: calibrated = raw)")
    lines.append(f"{summary['seconds']:.1f} s ({summary['seconds_per_100_items']:.1f} s per 100 items)")
    lines.append(f"output: {summary['out']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- handler


def _evaluate(args: argparse.Namespace) -> int:
    from dpcore import icl
    from dpcore.artifacts import write_json_atomic, write_manifest, write_table
    from dpcore.datasets import load_dataset
    from dpcore.errors import ConfigError
    from dpcore.home import private_dir
    from dpcore.lm import LanguageModel
    from dpcore.taskspec import load_task_spec
    from flows.cli.common import config_from_args, print_json
    from flows.cli.progress import showing_progress, stopping_on_signals
    from tasks.common import report_progress

    if args.batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {args.batch_size}")
    if args.baseline and (args.method or args.epsilon is not None):
        raise ConfigError("--method/--epsilon apply to --demos only")
    config = config_from_args(args)
    spec = load_task_spec(config.task_spec or config.dataset)
    dataset = load_dataset(spec, config.data_path, config.test_path)
    eval_config = config.eval_config()

    pool = None
    if args.demos:
        pool, method, epsilon = _demos_from_file(args.demos, args.method, args.epsilon, spec, dataset, config.delta)
    out = _out_dir(args, dataset)
    if args.baseline == "random-real":  # real private records in the prompts: an infinite spend, charged first
        _charge_random_real(config, dataset, out.name)
    lm = LanguageModel.load(config.model, config.device, config.dtype)
    if args.baseline == "zero-shot":
        method, epsilon = "zero-shot", 0.0
    elif args.baseline == "instruction-only":
        method, epsilon = "instruction-only", 0.0
        pool = _instruction_only_pool(lm, spec, dataset, config)
    elif args.baseline == "random-real":
        method, epsilon = "random-real", math.inf
        train = dataset.train  # PRIVATE: only ids leave, into the private store
        pool = list(zip(train["text"].tolist(), train["label"].tolist(), train["id"].tolist(), strict=True))

    labels = spec.label_names if spec.kind == "classification" else None
    began = time.perf_counter()
    with stopping_on_signals(), showing_progress(not args.json):
        predictions, metrics = icl.evaluate(
            lm, spec, dataset.test, pool, method, epsilon, eval_config, labels, batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens,
            items_progress=lambda done, total: report_progress(f"evaluate {method}: test items", done, total))
    seconds = time.perf_counter() - began

    private_out = private_dir() / "runs" / spec.name / dataset.content_hash[:12] / out.name
    if method == "random-real":
        _, real_demos = icl.split_private_demo_ids(predictions, free_text=spec.kind != "classification")
        write_table(real_demos, private_out / "real_demos.parquet")
    # Per-item predictions are private (test ids, gold labels, probabilities); the public side keeps metrics.
    write_table(predictions, private_out / "predictions.parquet")
    write_table(metrics, out / "metrics.parquet")
    n = int(metrics["n"].max())
    summary = {
        "dataset": spec.name, "model": config.model, "method": method, "epsilon": float(epsilon),
        "shots": int(metrics["shots"].max()), "seeds": int(len(metrics)), "n": n,
        "accuracy": _stats(metrics["accuracy"]), "calibrated_accuracy": _stats(metrics["calibrated_accuracy"]),
        "calibrated": bool(metrics["calibrated"].all()), "seconds": seconds,
        "seconds_per_100_items": icl.seconds_per_100_items(metrics),
        "data_hash": dataset.content_hash, "demos": str(args.demos) if args.demos else None,
        "out": str(out), "private_out": str(private_out),
    }
    from flows.cli.common import jsonable

    write_json_atomic(out / "summary.json", jsonable(summary))
    write_manifest(out)
    if args.json:
        print_json(summary)
    else:
        print(format_table(summary))
    return 0
