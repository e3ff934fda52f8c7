"""Benchmark: a user's own-data loop end to end, at `dpicl run`'s defaults, each step timed.

The loop of README.md ("Using your own data") in a fresh `$DPICL_HOME` (the embedded model is converted in
it, as on a new machine):

    dpicl ledger set-budget --dataset ID --epsilon 8 --delta 1e-5
    dpicl run --task-spec T.yaml --data-path D.csv [--test-path TEST.csv] --yes --json [RUN FLAGS]
    dpicl release --run RUN
    dpicl predict --input QUERIES.jsonl --out answers.jsonl        # --queries texts

It prints the wall minutes of each step and of the whole loop, the run's plan line (its epsilon and its
estimated minutes) and the release's verdict (released, or refused with the gate's reasons).

`--seeds N` instead measures the release gate: N independent DP runs (cryptographically seeded noise, each in
its own home) each followed by `dpicl release` (a sound release should pass), and N non-private audits
(`dpicl audit --non-private`: real records as 1-shot demos, Duan et al.'s leaky prompt, which the gate should
refuse; each draws its trials with its own `--seed`, sized as the gate sizes them unless
--non-private-trials). It prints the pass rate of the sound releases and the refusal rate of the leaking prompts;
--only dp or --only leaky measures one of the two. `--jobs J`
runs J of them at once (a machine with cores to spare).

    python benchmarks/bench_own_data_loop.py (--task-spec T.yaml --data-path D.csv [--test-path TEST.csv] | --dataset sst2)
        [--dataset-id ID] [--budget 8] [--delta 1e-5] [--queries 20] [--queries-path FILE]
        [--seeds N] [--jobs J] [--non-private-trials K] [--only dp|leaky] [--home DIR] [--json] [-- RUN FLAGS...]

Every home is made under --home (default: $DPICL_HOME/benchmarks/own-data-loop/); nothing else is written.
The queries for `dpicl predict` are the first --queries texts of --queries-path (default: the test file, else
the data file). With --json the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (a `benchmarks` package may be installed)
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DPICL = [sys.executable, "-m", "flows.cli"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task-spec", default=None, help="your task's YAML (or --dataset, a shipped task)")
    parser.add_argument("--dataset", default=None, help="a shipped task (sst2, trec, agnews) instead of --task-spec")
    parser.add_argument("--data-path", default=None, help="the private file (default: the task's own source)")
    parser.add_argument("--test-path", default=None)
    parser.add_argument("--dataset-id", default=None, help="ledger id (default: the task spec's name)")
    parser.add_argument("--budget", type=float, default=8.0, help="the budget's epsilon (set-budget)")
    parser.add_argument("--delta", type=float, default=1e-5, help="the budget's delta")
    parser.add_argument("--queries", type=int, default=20, help="texts answered by dpicl predict")
    parser.add_argument("--queries-path", default=None)
    parser.add_argument("--seeds", type=int, default=0, help="N DP runs and N non-private audits: the gate's rates")
    parser.add_argument("--jobs", type=int, default=1, help="--seeds: how many at once")
    parser.add_argument("--non-private-trials", type=int, default=None,
                        help="--seeds: trials of each non-private audit (default: the design the gate sizes)")
    parser.add_argument("--only", choices=("dp", "leaky"), default=None,
                        help="--seeds: the DP runs only, or the non-private audits only")
    parser.add_argument("--home", default=None, help="folder of the fresh homes")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("run_flags", nargs=argparse.REMAINDER, help="after --: more flags for dpicl run")
    return parser


def _spec(args) -> dict:
    """The task's YAML: --task-spec, or a shipped task's under data/tasks/."""
    import yaml

    path = Path(args.task_spec) if args.task_spec else ROOT / "data" / "tasks" / f"{args.dataset}.yaml"
    return yaml.safe_load(path.read_text())


def _step(name: str, argv: list[str], home: Path, log: Path) -> dict:
    """Run one dpicl command in `home`; its seconds, exit code and output (kept in `log`)."""
    env = {**os.environ, "DPICL_HOME": str(home)}
    began = time.perf_counter()
    done = subprocess.run(DPICL + argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    log.write_text(f"$ dpicl {' '.join(argv)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}\n")
    return {"step": name, "seconds": round(seconds, 1), "rc": done.returncode, "stdout": done.stdout,
            "stderr": done.stderr}


def _data_flags(args) -> list[str]:
    flags = ["--task-spec", str(Path(args.task_spec).resolve())] if args.task_spec else ["--dataset", args.dataset]
    if args.data_path:
        flags += ["--data-path", str(Path(args.data_path).resolve())]
    if args.test_path:
        flags += ["--test-path", str(Path(args.test_path).resolve())]
    return flags


def _queries(args, out: Path) -> Path:
    """The first --queries texts of the queries file as `dpicl predict` input (JSONL, a `text` field)."""
    source = _spec(args).get("source") or {}
    if not (args.queries_path or args.test_path or args.data_path):  # a shipped task: its public test split
        sys.path.insert(0, str(ROOT))
        from dpcore.data.datasets import load_dataset
        from dpcore.data.taskspec import load_task_spec

        texts = load_dataset(load_task_spec(args.dataset)).test["text"].astype(str).tolist()[:args.queries]
        out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        return out
    path = Path(args.queries_path or args.test_path or args.data_path or "")
    column = source.get("text_column", "text")
    texts = []
    if path.suffix == ".jsonl":
        for line in path.read_text().splitlines():
            if line.strip():
                texts.append(str(json.loads(line)[column]))
    else:
        with path.open(newline="") as handle:
            texts = [row[column] for row in csv.DictReader(handle)]
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:args.queries]))
    return out


def _plan_line(stderr: str) -> str:
    return next((line for line in stderr.splitlines() if line.startswith("plan: ")), "")


def _refusal(step: dict) -> list[str]:
    """The release's reasons (figure-free lines of its output)."""
    text = step["stdout"] + step["stderr"]
    return [line.strip() for line in text.splitlines() if "refused" in line or line.strip().startswith("- ")][:8]


def one_loop(args, home: Path, predict: bool = True, run_flags: list[str] | None = None) -> dict:
    """set-budget, run, release (and predict): each step's seconds and the release's verdict."""
    home.mkdir(parents=True, exist_ok=True)
    dataset_id = args.dataset_id or _spec(args)["name"]
    steps = [_step("set-budget", ["ledger", "set-budget", "--dataset", dataset_id, "--epsilon", str(args.budget),
                                  "--delta", str(args.delta)], home, home / "set-budget.log")]
    run = _step("run", ["run", *_data_flags(args), *(["--dataset-id", args.dataset_id] if args.dataset_id else []),
                        "--yes", "--json", *(run_flags or [])], home, home / "run.log")
    steps.append(run)
    result = {"home": str(home), "steps": steps, "plan": _plan_line(run["stderr"]), "released": False}
    if run["rc"] != 0:
        result["error"] = run["stderr"].strip().splitlines()[-1:] if run["stderr"].strip() else []
        return result
    summary = json.loads(run["stdout"])
    result["run_id"] = summary["run_id"]
    result["audit"] = [row.get("verdict") for row in (summary.get("audit") or {}).get("summary") or []]
    release = _step("release", ["release", "--run", summary["run_id"]], home, home / "release.log")
    steps.append(release)
    result["released"] = release["rc"] == 0
    if not result["released"]:
        result["refusal"] = _refusal(release)
        return result
    if predict:
        queries = _queries(args, home / "queries.jsonl")
        steps.append(_step("predict", ["predict", "--input", str(queries), "--out", str(home / "answers.jsonl")],
                           home, home / "predict.log"))
    return result


def non_private_audit(args, home: Path, seed: int) -> dict:
    """`dpicl audit --non-private`: real records as 1-shot demos; exit 1 is the gate refusing them. `seed` draws
    the audit's trials (each audit its own records)."""
    home.mkdir(parents=True, exist_ok=True)
    trials = ["--trials", str(args.non_private_trials)] if args.non_private_trials else []
    step = _step("audit --non-private", ["audit", "--non-private", *trials, "--seed", str(seed),
                                         *_data_flags(args), "--json"], home, home / "audit.log")
    try:
        reasons = json.loads(step["stdout"].strip().splitlines()[-1]).get("reasons") or []
    except (ValueError, IndexError):
        reasons = []
    # Real records in a prompt also fail the overlap check and have no accountant: the attacks' own refusal is
    # the membership-inference reason
    return {"home": str(home), "seconds": step["seconds"], "rc": step["rc"], "refused": step["rc"] == 1,
            "membership_detected": any(r.startswith("membership inference") for r in reasons)}


def _warm(args, base: Path) -> Path:
    """A home with the embedded model converted once (`dpicl` converts it on first use), copied into every
    seed's home so the runs measure the loop, not the conversion."""
    warm = base / "warm"
    if not (warm / "models").exists():
        _step("warm", ["audit", "--non-private", "--trials", "1", *_data_flags(args), "--json"], warm,
              base / "warm.log")
    return warm / "models"


def _fresh(base: Path, name: str, models: Path | None) -> Path:
    home = base / name
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    if models is not None and models.exists():
        shutil.copytree(models, home / "models")
    return home


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not (args.task_spec or args.dataset):
        _parser().error("--task-spec or --dataset")
    run_flags = [f for f in args.run_flags if f != "--"]
    root = Path(args.home) if args.home else Path(os.environ.get("DPICL_HOME", ".dpicl")) / "benchmarks" / \
        "own-data-loop"
    root.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-"), dir=root))
    if not args.seeds:
        began = time.perf_counter()
        result = one_loop(args, base / "loop", run_flags=run_flags)
        result["total_seconds"] = round(time.perf_counter() - began, 1)
        lines = [f"{step['step']:<12} {step['seconds'] / 60:6.2f} min  (exit {step['rc']})" for step in result["steps"]]
        lines += [f"{'loop':<12} {result['total_seconds'] / 60:6.2f} min", result["plan"],
                  "release: " + ("released" if result["released"] else "refused " + "; ".join(
                      result.get("refusal") or result.get("error") or []))]
        for step in result["steps"]:
            step.pop("stdout"), step.pop("stderr")
    else:
        models = _warm(args, base)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            dp = list(pool.map(lambda i: one_loop(args, _fresh(base, f"dp-{i}", models), predict=False,
                                                  run_flags=run_flags), range(0 if args.only == "leaky" else args.seeds)))
            leaky = list(pool.map(lambda i: non_private_audit(args, _fresh(base, f"np-{i}", models), seed=i),
                                  range(0 if args.only == "dp" else args.seeds)))
        for r in dp:
            for step in r["steps"]:
                step.pop("stdout"), step.pop("stderr")
        ran = [r for r in dp if "run_id" in r]
        passed = sum(r["released"] for r in ran)
        refused = sum(r["refused"] for r in leaky)
        detected = sum(r["membership_detected"] for r in leaky)
        audited = [r for r in leaky if r["rc"] in (0, 1)]
        result = {"sound_runs": len(ran), "sound_released": passed, "leaky_audits": len(audited),
                  "leaky_refused": refused, "leaky_membership_detected": detected, "dp": dp, "non_private": leaky}
        lines = [f"sound releases passed: {passed}/{len(ran)} DP runs",
                 f"leaking prompts refused: {refused}/{len(audited)} non-private audits, "
                 f"{detected}/{len(audited)} for membership inference"]
        lines += [f"  {Path(r['home']).name}: " + ", ".join(f"{s['step']} {s['seconds']:.0f} s" for s in r["steps"])
                  + f"; {'released' if r['released'] else 'refused: ' + '; '.join(r.get('refusal') or r.get('error') or [])}"
                  for r in dp]
        lines += [f"  {Path(r['home']).name}: {r['seconds']:.0f} s, exit {r['rc']}" for r in leaky]
    return benchlib.report(result, "\n".join(lines), "own-data-loop", str(base / "result.json"), args.json)


if __name__ == "__main__":
    sys.exit(main())
