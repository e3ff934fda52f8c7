"""AdaDPSyn against Algorithm 1 (DP few-shot generation), paired over noise seeds, with standard errors.

For each noise seed S: one `dpicl run --methods tang,adadpsyn --seed S` (both methods' demonstrations generated
on the same records, the same sampling rate and steps, each at each epsilon, then evaluated on the same test
items with the same evaluation seeds). Each seed gives each method one accuracy per epsilon (the mean over its
evaluation seeds); across the K noise seeds the table shows each method's mean with its standard error
(sd / sqrt(K)) and the paired difference AdaDPSyn - Algorithm 1 (mean, standard error, and how many seeds
AdaDPSyn won), for raw and calibrated accuracy. A separate ledger id (`bench-adadpsyn-<dataset>`) keeps a user's
budget untouched; the noise is seeded, so these are experiments, not releases.

    python benchmarks/bench_adadpsyn.py [--dataset sst2] [--epsilons 1,8] [--noise-seeds 5] [--first-seed 1]
                                        [--test-size 100] [--seeds 2] [--model smollm2-135m]
                                        [--run-flags "..."] [--out FILE] [--json]

With --json the last line printed is one JSON object; the same object is written to --out (default
$DPICL_HOME/benchmarks/bench_adadpsyn.json).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import dpicl_json, report  # noqa: E402

METHODS = ("tang", "adadpsyn")
MEASURES = (("accuracy", "accuracy_mean"), ("calibrated", "calibrated_accuracy_mean"))


def run_seed(args, seed: int) -> tuple[dict, float]:
    """One `dpicl run` of both methods at noise seed `seed`: ({(method, epsilon, measure): accuracy}, seconds)."""
    argv = ["run", "--json", "--yes", "--dataset", args.dataset, "--dataset-id", f"bench-adadpsyn-{args.dataset}",
            "--new-budget-for-same-records", "--model", args.model, "--methods", ",".join(METHODS),
            "--epsilons", args.epsilons, "--seed", str(seed), "--test-size", str(args.test_size),
            "--seeds", str(args.seeds), "--baselines", "zero-shot", "--no-audit", *args.run_flags.split()]
    summary, seconds = dpicl_json(argv)
    found = {}
    for row in summary["results"]:
        method = "zero-shot" if row["method"] == "zero-shot" else row["method"]
        for measure, key in MEASURES:
            if row.get(key) is not None:
                found[(method, float(row["epsilon"]), measure)] = float(row[key])
    return found, seconds


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (sample sd / sqrt(n); 0 for one value)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def summarise(per_seed: list[dict], epsilons: list[float]) -> list[dict]:
    """Per epsilon and measure: each method's mean +/- SE over the seeds, and the paired difference."""
    rows = []
    for epsilon in epsilons:
        for measure, _ in MEASURES:
            tang = [s[("tang", epsilon, measure)] for s in per_seed if ("tang", epsilon, measure) in s]
            ada = [s[("adadpsyn", epsilon, measure)] for s in per_seed if ("adadpsyn", epsilon, measure) in s]
            if not tang or len(tang) != len(ada):
                continue
            differences = [a - t for a, t in zip(ada, tang, strict=True)]
            (t_mean, t_se), (a_mean, a_se), (d_mean, d_se) = mean_se(tang), mean_se(ada), mean_se(differences)
            rows.append({"epsilon": epsilon, "measure": measure, "seeds": len(tang), "tang": t_mean, "tang_se": t_se,
                         "adadpsyn": a_mean, "adadpsyn_se": a_se, "difference": d_mean, "difference_se": d_se,
                         "adadpsyn_wins": sum(d > 0 for d in differences), "ties": sum(d == 0 for d in differences)})
    return rows


def table(rows: list[dict], zero_shot: dict) -> str:
    lines = ["| epsilon | measure | Algorithm 1 | AdaDPSyn | AdaDPSyn - Algorithm 1 (paired) | AdaDPSyn won | zero-shot |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        zs = zero_shot.get(r["measure"])
        lines.append(f"| {r['epsilon']:g} | {r['measure']} | {r['tang']:.3f} +/- {r['tang_se']:.3f} | "
                     f"{r['adadpsyn']:.3f} +/- {r['adadpsyn_se']:.3f} | {r['difference']:+.3f} +/- "
                     f"{r['difference_se']:.3f} | {r['adadpsyn_wins']} of {r['seeds']} ({r['ties']} tied) | "
                     f"{'-' if zs is None else f'{zs:.3f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sst2")
    parser.add_argument("--epsilons", default="1,8")
    parser.add_argument("--noise-seeds", type=int, default=5, help="independent generations per method (K)")
    parser.add_argument("--first-seed", type=int, default=1, help="the noise seeds are first-seed .. first-seed+K-1")
    parser.add_argument("--test-size", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2, help="evaluation seeds of each generation")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--run-flags", default="", help="more flags for `dpicl run` (e.g. --max-tokens 20)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    began = time.monotonic()
    epsilons = [float(e) for e in args.epsilons.split(",")]
    per_seed, minutes = [], []
    for seed in range(args.first_seed, args.first_seed + args.noise_seeds):
        found, seconds = run_seed(args, seed)
        per_seed.append(found)
        minutes.append(round(seconds / 60, 2))
        print(f"noise seed {seed}: {seconds / 60:.1f} minutes", file=sys.stderr, flush=True)
    zero_shot = {measure: per_seed[0][key] for measure, _ in MEASURES
                 for key in [k for k in per_seed[0] if k[0] == "zero-shot" and k[2] == measure][:1]}
    rows = summarise(per_seed, epsilons)
    result = {"rows": rows, "zero_shot": zero_shot, "dataset": args.dataset, "epsilons": args.epsilons,
              "noise_seeds": list(range(args.first_seed, args.first_seed + args.noise_seeds)),
              "test_size": args.test_size, "seeds": args.seeds, "model": args.model, "run_flags": args.run_flags,
              "minutes_per_run": minutes, "per_seed": [{"|".join(map(str, k)): v for k, v in s.items()} for s in per_seed],
              "wall_minutes": round((time.monotonic() - began) / 60, 2), "command": " ".join(sys.argv)}
    return report(result, table(rows, zero_shot), "bench_adadpsyn", args.out, args.json)


if __name__ == "__main__":
    sys.exit(main())
