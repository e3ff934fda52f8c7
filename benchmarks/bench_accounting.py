"""Benchmark: sigma calibration time, cold (empty cache) and cached.

    .venv/bin/python benchmarks/bench_accounting.py [--epsilons 1 2 4 8] [--steps 100]
        [--sampling-rate 0.000666667] [--delta 3.333e-5] [--mechanism gaussian|rnm] [--json]

Defaults are the paper's AG News settings (q = 20/30000, T = 100, delta = 1/30000). Each cold
calibration uses a fresh empty cache folder; the cached run repeats it against that folder.
The one-off import of the accountants (scipy) is timed separately. With --json the last line
of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpcore.names import MECHANISMS  # noqa: E402  (the names only: the accountants' import is timed below)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sampling-rate", type=float, default=20 / 30000)
    parser.add_argument("--delta", type=float, default=1 / 30000)
    parser.add_argument("--mechanism", choices=list(MECHANISMS), default="gaussian")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    import prv_accountant  # noqa: F401  (the imports are the same for every calibration)
    from dp_accounting.pld import privacy_loss_distribution  # noqa: F401

    from dpcore.fewshot import accounting
    from dpcore.privacy import memo

    import_seconds = time.perf_counter() - started

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-accounting-") as tmp:
        for index, target in enumerate(args.epsilons):
            cache = Path(tmp) / f"cache-{index}"
            t0 = time.perf_counter()
            cold = accounting.calibrate(target, args.sampling_rate, args.steps, args.delta,
                                        mechanism=args.mechanism, cache_dir=cache)
            cold_seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            warm = accounting.calibrate(target, args.sampling_rate, args.steps, args.delta,
                                        mechanism=args.mechanism, cache_dir=cache)
            cached_seconds = time.perf_counter() - t0
            rows.append({
                "target_epsilon": target, "noise_multiplier": cold.noise_multiplier, "epsilon": cold.epsilon,
                "epsilon_crosscheck": cold.epsilon_crosscheck, "crosscheck_agreed": cold.crosscheck_agreed,
                "cold_seconds": round(cold_seconds, 3), "cached_seconds": round(cached_seconds, 4),
                "cache_identical": warm == cold,
            })

    print(f"calibration ({args.mechanism}): q={args.sampling_rate:.6g} T={args.steps} delta={args.delta:.4g}; "
          f"accountant import {import_seconds:.2f} s")
    print(f"{'target eps':>10} {'sigma':>8} {'epsilon':>8} {'PLD':>8} {'agreed':>6} {'cold s':>8} {'cached s':>9}")
    for row in rows:
        print(f"{row['target_epsilon']:>10g} {row['noise_multiplier']:>8.4f} {row['epsilon']:>8.4f} "
              f"{row['epsilon_crosscheck']:>8.4f} {str(row['crosscheck_agreed']):>6} {row['cold_seconds']:>8.2f} "
              f"{row['cached_seconds']:>9.4f}")
    summary = {
        "benchmark": "accounting.calibrate",
        "mechanism": args.mechanism, "sampling_rate": args.sampling_rate, "steps": args.steps, "delta": args.delta,
        "rows": rows,
        "import_seconds": round(import_seconds, 3),
        "total_cold_seconds": round(sum(r["cold_seconds"] for r in rows), 3),
        "total_cached_seconds": round(sum(r["cached_seconds"] for r in rows), 4),
        "all_cache_identical": all(r["cache_identical"] for r in rows),
        "all_within_target": all(r["epsilon"] <= r["target_epsilon"] or math.isinf(r["target_epsilon"]) for r in rows),
        "versions": memo.accountant_versions(),
        "python": platform.python_version(), "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
