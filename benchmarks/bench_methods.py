"""Every private-prompting method against calibrated zero-shot, on the same test items, at the same epsilons.

For each dataset: one `dpicl run` of the prompt-producing methods (DP few-shot generation, AdaDPSyn, DP-OPT, and
PromptPATE / PromptDPSGD when named) with the zero-shot baseline, then `dpicl dp-icl` at each epsilon on the same
test items (`--queries N` answers the items of `--test-size N`). Each dataset gets a ledger id of its own for the
benchmark (`bench-methods-<dataset>`, a separate budget for records the user's own runs may also spend on), so a
user's ledger is untouched.

    python benchmarks/bench_methods.py --datasets sst2,trec,agnews --epsilons 1,8 --test-size 100 --seeds 2

Prints one table (dataset, method, epsilon, accuracy and calibrated accuracy, mean +/- std over seeds, and the
minutes each command took), writes the JSON result, and with --json prints it as the last line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import dpicl_json, report  # noqa: E402

RUN_METHODS = "tang,adadpsyn,dp-opt"


def _row(dataset: str, method: str, epsilon, raw: list[float] | float, calibrated: list[float] | float | None,
         n: int, seconds: float) -> dict:
    raw = raw if isinstance(raw, list) else [raw]
    calibrated = calibrated if isinstance(calibrated, list) or calibrated is None else [calibrated]
    return {"dataset": dataset, "method": method, "epsilon": epsilon, "n": n, "minutes": round(seconds / 60, 2),
            "accuracy": statistics.fmean(raw), "accuracy_std": statistics.pstdev(raw),
            "calibrated": None if calibrated is None else statistics.fmean(calibrated),
            "calibrated_std": None if calibrated is None else statistics.pstdev(calibrated)}


def run_dataset(dataset: str, args) -> list[dict]:
    """The run of the prompt-producing methods and DP-ICL's answers on one dataset: its table rows."""
    ledger_id = f"bench-methods-{dataset}"
    common = ["--dataset", dataset, "--dataset-id", ledger_id, "--model", args.model, "--new-budget-for-same-records"]
    if args.seed is not None:
        common += ["--seed", str(args.seed)]
    summary, seconds = dpicl_json(["run", "--json", "--yes", *common, "--methods", args.methods,
                               "--epsilons", args.epsilons, "--test-size", str(args.test_size),
                               "--seeds", str(args.seeds), "--baselines", "zero-shot", "--no-audit",
                               *args.run_flags.split()])
    rows = []
    for r in summary["results"]:
        if r.get("accuracy_mean") is None:
            continue
        rows.append({**_row(dataset, r["method"], r["epsilon"], r["accuracy_mean"], r.get("calibrated_accuracy_mean"),
                            int(r.get("n") or args.test_size), seconds),
                     "accuracy_std": r.get("accuracy_std") or 0.0,
                     "calibrated_std": r.get("calibrated_accuracy_std") or 0.0})
    for epsilon in args.epsilons.split(","):
        answered, seconds = dpicl_json(["dp-icl", "--json", *common, "--epsilon", epsilon,
                                    "--queries", str(args.test_size)])
        rows.append(_row(dataset, "dp-icl", float(epsilon), answered["accuracy"], None, answered["labelled"],
                         seconds))
    return rows


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(rows: list[dict]) -> str:
    lines = ["| dataset | method | epsilon | accuracy | calibrated | n | minutes (command) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        calibrated = "-" if r["calibrated"] is None else f"{_fmt(r['calibrated'])} +/- {_fmt(r['calibrated_std'])}"
        lines.append(f"| {r['dataset']} | {r['method']} | {r['epsilon']} | {_fmt(r['accuracy'])} +/- "
                     f"{_fmt(r['accuracy_std'])} | {calibrated} | {r['n']} | {r['minutes']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="sst2,trec,agnews")
    parser.add_argument("--methods", default=RUN_METHODS, help="the methods of the `dpicl run` (DP-ICL runs beside)")
    parser.add_argument("--epsilons", default="1,8")
    parser.add_argument("--test-size", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seed", type=int, default=None, help="noise seed (reproducible noise: not for a release)")
    parser.add_argument("--run-flags", default="", help="more flags for `dpicl run` (e.g. --max-tokens 20)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    began = time.monotonic()
    rows = [row for dataset in args.datasets.split(",") for row in run_dataset(dataset, args)]
    result = {"rows": rows, "datasets": args.datasets.split(","), "methods": args.methods, "epsilons": args.epsilons,
              "test_size": args.test_size, "seeds": args.seeds, "model": args.model, "run_flags": args.run_flags,
              "wall_minutes": round((time.monotonic() - began) / 60, 2), "command": " ".join(sys.argv)}
    return report(result, table(rows), "bench_methods", args.out, args.json)


if __name__ == "__main__":
    sys.exit(main())
