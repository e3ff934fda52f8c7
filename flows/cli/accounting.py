"""CLI: `dpicl epsilon` and `dpicl calibrate` (privacy accounting).

    dpicl epsilon   --noise-multiplier S --sampling-rate Q --steps T --delta D [--mechanism gaussian|rnm] [--json]
    dpicl calibrate --target-epsilon E   --sampling-rate Q --steps T --delta D [--mechanism gaussian|rnm] [--json]

`--json` prints one JSON object (infinity as "inf"); otherwise a small table. Bad input exits
with code 2. Results are cached under $DPICL_HOME/cache/accounting (`--no-cache` to skip).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from dpcore.names import MECHANISMS
from flows.cli.common import command, print_json


def register(subparsers) -> None:
    epsilon = command(
        subparsers, "epsilon", _epsilon,
        help="epsilon of a run: noise multiplier, sampling rate, steps, delta -> (epsilon, delta)",
        description="Epsilon of T Poisson-subsampled steps of Algorithm 1 (add/remove neighbours) from "
        "prv-accountant, cross-checked with dp-accounting PLD. The reported epsilon is an upper bound.")
    epsilon.add_argument("--noise-multiplier", type=float, required=True,
                         help="sigma (gaussian: noise N(0, 2 sigma^2); rnm: exponential noise of mean 2 sigma); "
                         "0 means no noise (epsilon = inf)")
    _common(epsilon)

    calibrate = command(
        subparsers, "calibrate", _calibrate, help="smallest noise multiplier whose epsilon is at most a target",
        description="Bisection for the smallest sigma (to 1e-3) whose upper-bound epsilon is at most the "
        "target. A target of inf gives sigma = 0 (no noise).")
    calibrate.add_argument("--target-epsilon", type=float, required=True, help="epsilon to reach (> 0, or inf)")
    _common(calibrate)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sampling-rate", type=float, required=True,
                        help="q = M*N/|D_y| (num_subsets x subset_size / records of the label), in (0, 1]")
    parser.add_argument("--steps", type=int, required=True, help="T = max_tokens x demos_per_label (>= 1)")
    parser.add_argument("--delta", type=float, required=True, help="delta in (0, 1); the paper uses 1/|D_priv|")
    parser.add_argument("--mechanism", choices=list(MECHANISMS), default="gaussian",
                        help="gaussian (default) or rnm (report-noisy-max with exponential noise)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the accounting cache")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _epsilon(args) -> int:
    # dp-accounting loads here, not for `dpicl --help`
    from tasks.charge import epsilon_report

    started = time.perf_counter()
    report = epsilon_report(args.noise_multiplier, args.sampling_rate, args.steps, args.delta, args.mechanism,
                            cache=not args.no_cache)
    _emit(args, "epsilon", report, time.perf_counter() - started)
    return 0


def _calibrate(args) -> int:
    # dp-accounting loads here, not for `dpicl --help`
    from tasks.charge import sigma_report

    started = time.perf_counter()
    report = sigma_report(args.target_epsilon, args.sampling_rate, args.steps, args.delta, args.mechanism,
                          cache=not args.no_cache)
    _emit(args, "calibrate", report, time.perf_counter() - started, target=args.target_epsilon)
    return 0


def _emit(args, command: str, report, seconds: float, target: float | None = None) -> None:
    payload = {"command": command, **report.to_dict(), "seconds": round(seconds, 3)}
    if target is not None:
        payload["target_epsilon"] = float(target)
    if args.json:
        print_json(payload)
        return
    rows = []
    if target is not None:
        rows.append(("target epsilon", _num(target)))
    rows += [
        ("mechanism", report.mechanism),
        ("noise multiplier", _num(report.noise_multiplier, 4)),
        ("sampling rate", _num(report.sampling_rate, 6)),
        ("steps", str(report.steps)),
        ("delta", _num(report.delta, 4)),
        ("epsilon (upper, reported)", _num(report.epsilon, 4)),
        ("epsilon estimate (prv)", _num(report.epsilon_estimate, 4)),
        ("epsilon lower (prv)", _num(report.epsilon_lower, 4)),
        ("epsilon cross-check (PLD)", _num(report.epsilon_crosscheck, 4)),
        ("cross-check", "agreed" if report.crosscheck_agreed else "DISAGREED (larger value reported)"),
    ]
    if report.mechanism == "rnm":
        rows += [("per-step epsilon' (amplified)", _num(report.step_epsilon, 6)),
                 ("pure-DP bound T*epsilon'", _num(report.epsilon_pure, 4))]
    rows.append(("seconds", f"{seconds:.2f}"))
    width = max(len(name) for name, _ in rows)
    out = sys.stdout
    for name, value in rows:
        out.write(f"{name:<{width}}  {value}\n")
    for warning in report.warnings:
        out.write(f"warning: {warning}\n")
    out.flush()


def _num(value: float, digits: int = 6) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}".rstrip("0").rstrip(".")
