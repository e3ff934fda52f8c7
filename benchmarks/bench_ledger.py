"""Benchmark: the ledger's composed spend of many distinct entries, against dp-accounting's PLD.

    .venv/bin/python benchmarks/bench_ledger.py [--entries 10 50 100] [--delta 1e-5] [--seed 7] [--json]

A ledger that lives for months of scheduled regenerations holds many distinct (sigma, q, T) spends.
Each size draws that many Poisson-sampled Gaussian spends (sigma 0.6-3, q 0.001-0.05, T 5-120; every
seventh an unsampled release, sigma 20-60, T 1-20, as PromptPATE's steps are), composes them the way
the ledger does (`dpcore.privacy.ledger.compose_epsilon`: every distinct event exactly) and with dp-accounting's
PLD accountant at the same discretisation (1e-3), and prints both epsilons, their ratio and the times.
With --json the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def spends(count: int, seed: int) -> list:
    """`count` ledger spends (`dpcore.privacy.spend.Spend`), drawn as the module docstring says."""
    import numpy as np

    from dpcore.privacy.spend import Spend

    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        sigma, q, steps = float(rng.uniform(0.6, 3.0)), float(rng.uniform(0.001, 0.05)), int(rng.integers(5, 120))
        if i % 7 == 6:
            sigma, q, steps = float(rng.uniform(20.0, 60.0)), 1.0, int(rng.integers(1, 20))
        out.append(Spend.sampled_steps("gaussian", sigma, q, steps, "pipeline"))
    return out


def reference_epsilon(entries, delta: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for e in entries:  # built from the display parameters, not the stored event: an independent reading
        step = dp_event.GaussianDpEvent(e.noise_multiplier)
        accountant.compose(step if e.sampling_rate >= 1.0 else dp_event.PoissonSampledDpEvent(e.sampling_rate, step),
                           e.steps)
    return float(accountant.get_epsilon(delta))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from dpcore.privacy import composition

    rows = []
    print(f"{'entries':>7} {'ledger eps':>11} {'PLD eps':>9} {'ratio':>7} {'ledger s':>9} {'PLD s':>7}  cross-check")
    for count in args.entries:
        entries = spends(count, args.seed)
        t0 = time.perf_counter()
        # what the ledger composes (`ledger.compose_epsilon`), computed afresh: not read back from the
        # home's accounting cache (`dpcore.privacy.memo`), where an earlier run of this benchmark left it
        ours = composition.compose([spend.event for spend in entries], args.delta, cache=False)
        ours_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = reference_epsilon(entries, args.delta)
        ref_s = time.perf_counter() - t0
        rows.append({"entries": count, "epsilon": ours.epsilon, "epsilon_pld_reference": ref,
                     "ratio": ours.epsilon / ref, "seconds": ours_s, "reference_seconds": ref_s,
                     "crosscheck_agreed": ours.crosscheck_agreed})
        print(f"{count:>7} {ours.epsilon:>11.4f} {ref:>9.4f} {ours.epsilon / ref:>7.4f} {ours_s:>9.2f} {ref_s:>7.2f}  "
              f"{'agreed' if ours.crosscheck_agreed else 'prv-accountant could not answer: PLD alone'}")
    print(f"machine: {platform.machine()}, {platform.python_version()}, delta {args.delta:g}")
    if args.json:
        print(json.dumps({"delta": args.delta, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
