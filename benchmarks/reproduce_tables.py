"""Reproduce the papers' tables on the embedded model: one command, resumable, one progress line per cell.

Three tables, each cell one `dpicl` command run in a subprocess (the CLI does all the work; this script
only orchestrates and formats):

- Tang et al. Table 1 (DP few-shot generation): per dataset one
  `dpicl run --json --methods tang --epsilons 1,2,3,4,8 --baselines zero-shot,instruction-only,sigma-zero,random-real`
  (0-shot, epsilon 0 = instruction-only demos, epsilon 1/2/4/8 and Duan Table 1's 3, epsilon inf = sigma 0,
  random real demos);
- Duan et al. Table 2 (PromptPATE): `dpicl pate --json --public iid` (with the zero-shot, ensemble and
  upper-bound baselines) and `--public ood`; epsilon charged (data-independent) beside the data-dependent bound;
- Duan et al. Table 1 (PromptDPSGD): `dpicl tune --json` for a soft prompt and a prefix at epsilon 3, 8 and inf,
  and the DP fine-tuning baselines (`--kind lora`, `--kind full`) at epsilon 8, beside the same dataset's zero-shot and DP few-shot generation at epsilon 3 and 8 (from its Tang cell).

Every cell charges the ledger id `<dataset>-tables` (`--dataset-id`), so a user's budget on `<dataset>` is
untouched (the non-private baselines are infinite spends on that id). A finished cell's JSON is kept in
`$DPICL_HOME/benchmarks/tables/<cell>.json` (with the exact command); a rerun skips it when its command is
unchanged, and retries a cell that failed (its stderr is in `logs/<cell>.log` there). `tables.md` (accuracy
mean +/- std in %, epsilon, each cell's command, the papers' published numbers beside) and one PNG per
dataset (accuracy against epsilon, a line per method) are written to `--out`.

    python benchmarks/reproduce_tables.py                       # CPU sizes: 100 test items, small flock
    python benchmarks/reproduce_tables.py --datasets sst2 --tables pate --test-size 50 --seeds 1
    python benchmarks/reproduce_tables.py --full --extra-args="--device cuda"   # the papers' sizes (a GPU job)
    python benchmarks/reproduce_tables.py --dry-run             # the cells and their commands only
    python benchmarks/reproduce_tables.py --report-only         # the tables of the cells finished so far

CPU defaults: DP few-shot generation with M=3, N=1, K=100, T_max=20 (`dpicl demo`'s), no audit;
PromptPATE with E=20 one-shot teachers, Q=50, sigma2=2 (Table 7's 20 scaled to E=20), 10 candidate students,
delta 1e-6, 2 repeats; PromptDPSGD with the CPU preset, 20 steps and 32 validation examples, 3 trainings;
3 evaluation seeds for DP few-shot generation. `--full`: Tang et al. Table 9 (AG News M=10, N=2,
RVP, T_max=100; TREC M=80, N=1, no RVP, T_max=15; SST-2, absent from the paper, as AG News), 5 seeds;
PromptPATE E=200, Q=500 (TREC: its 492 public rows), sigma2=20, 50 candidates, 3 repeats; PromptDPSGD's GPU
preset (Duan et al. Table 6); the whole test split.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DATASETS = ("sst2", "agnews", "trec")
TABLES = ("tang", "pate", "dpsgd")
TANG_EPSILONS = (1, 2, 3, 4, 8)  # Tang Table 1's 1, 2, 4, 8 and Duan Table 1's 3
TANG_BASELINES = "zero-shot,instruction-only,sigma-zero,random-real"
DPSGD_KINDS = ("soft-prompt", "prefix")
DPSGD_EPSILONS = ("3", "8", "inf")
# Duan et al. Table 1's DP fine-tuning baselines, at its epsilon 8 (`dpicl tune --kind lora|full`)
FINE_TUNING_KINDS = ("lora", "full")
DPSGD_KEYS = ([(kind, eps) for kind in DPSGD_KINDS for eps in DPSGD_EPSILONS]
              + [(kind, "8") for kind in FINE_TUNING_KINDS])
INF = math.inf

# ---------------------------------------------------------------- published numbers (accuracy in %)
# Tang et al. 2024, Table 1 (GPT-3 Babbage, 4-shot, calibrated; mean and std over 5 seeds). Its epsilon = inf
# column is the better of sigma = 0 and random real demos. SST-2 is not in that table.
TANG_PAPER = {
    "agnews": {"zero-shot": (47.9, 0.0), "instruction-only": (68.0, 0.8), 1: (64.1, 3.9), 2: (63.5, 5.7),
               4: (71.3, 4.6), 8: (68.7, 3.0), INF: (69.3, 4.8)},
    "trec": {"zero-shot": (35.4, 0.0), "instruction-only": (45.7, 4.0), 1: (50.7, 4.1), 2: (48.6, 3.5),
             4: (50.4, 5.5), 8: (51.3, 5.8), INF: (50.6, 6.9)},
}
# Duan et al. 2023, Table 2 (GPT-3 Babbage, one-shot teachers, E=200, Q=500, delta 1e-6; epsilon is the
# data-dependent bound; accuracy mean +/- std over 3 repeats).
PATE_PAPER = {
    "sst2": {"zero-shot": 76.3, "ensemble": 90.0, "upper-bound": 93.8, "iid": ("sst2", 0.178, 88.8, 2.3),
             "ood": ("imdb", 0.187, 87.2, 1.9)},
    "agnews": {"zero-shot": 62.0, "ensemble": 72.8, "upper-bound": 78.2, "iid": ("agnews", 0.248, 71.7, 0.8),
               "ood": ("arisetv", 0.258, 67.9, 1.7)},
    "trec": {"zero-shot": 40.7, "ensemble": 57.6, "upper-bound": 58.7, "iid": ("trec", 0.281, 52.8, 1.5),
             "ood": ("qqp", 0.293, 50.9, 3.5)},
}
# Duan et al. 2023, Table 1 (epsilon 8 and inf) and the appendix table for epsilon 3 (RoBERTa-base, delta 1/N).
# AG News and TREC are not in those tables.
DPSGD_PAPER = {
    "sst2": {("soft-prompt", "3"): 90.48, ("soft-prompt", "8"): 92.31, ("soft-prompt", "inf"): 95.64,
             ("prefix", "3"): 90.37, ("prefix", "8"): 91.97, ("prefix", "inf"): 96.33,
             ("lora", "8"): 92.97, ("full", "8"): 85.89},
}

# ---------------------------------------------------------------- cell settings
TANG_CPU = ["--num-subsets", "3", "--subset-size", "1", "--top-k", "100", "--max-tokens", "20"]
TANG_FULL = {  # Tang et al. Table 9
    "agnews": ["--num-subsets", "10", "--subset-size", "2", "--top-k", "100", "--max-tokens", "100"],
    "trec": ["--num-subsets", "80", "--subset-size", "1", "--no-rvp", "--max-tokens", "15"],
}
# Table 2's cells label every query (--epsilon inf: charged their data-independent bound) at Table 7's sigma1 (the
# gpu preset's: the task YAML's) on a CPU-sized flock.
PATE_CPU = ["--preset", "gpu", "--teachers", "20", "--shots", "1", "--queries", "50", "--sigma2", "2",
            "--student-candidates", "10"]
PATE_FULL_QUERIES = {"trec": "492"}  # the TREC public split holds 492 rows (the paper's Q is 500)
DPSGD_CPU_STEPS = "20"
# Private examples held out for a CPU training's loss curve: half the CPU preset's 64, since the curve is
# evaluated at every fifth of the steps and on a short run costs about as much as the training itself.
DPSGD_CPU_VALIDATION = "32"
# Evaluation seeds (tang), repeats (pate), trainings (dpsgd) when --seeds is not given: CPU and --full.
DEFAULT_SEEDS = {"tang": (3, 5), "pate": (2, 3), "dpsgd": (3, 1)}


@dataclass
class Cell:
    """One command of the grid and what it fills in."""

    name: str
    table: str
    dataset: str
    argv: list[str]
    key: tuple = ()
    result: dict | None = field(default=None, repr=False)

    @property
    def command(self) -> str:
        return "dpicl " + shlex.join(self.argv)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="comma-separated (default: sst2,agnews,trec); another name works with --extra-args "
                             "naming its --task-spec/--data-path")
    parser.add_argument("--tables", default=",".join(TABLES), help="tang,pate,dpsgd (default: all three)")
    parser.add_argument("--test-size", type=int, default=None, help="test items (default: 100; --full: all)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="evaluation seeds (tang), repeats (pate), trainings (dpsgd) (default: 3, 2, 3; --full: "
                             "5, 3, 1)")
    parser.add_argument("--dpsgd-steps", type=int, default=int(DPSGD_CPU_STEPS),
                        help=f"DP-SGD steps of each CPU-preset training (default {DPSGD_CPU_STEPS}; --full: the GPU "
                             "preset's 100 epochs)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--full", action="store_true", help="the papers' sizes (a GPU job)")
    parser.add_argument("--dry-run", action="store_true", help="print the cells and their commands, run nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="write tables.md and the PNGs from the cells finished so far; run no cell")
    parser.add_argument("--extra-args", default="",
                        help='flags appended to every cell\'s command, e.g. --extra-args="--device cuda" '
                             "(write it with =, the value starts with dashes)")
    parser.add_argument("--out", default=None, help="where tables.md and the PNGs go "
                                                    "(default: $DPICL_HOME/benchmarks/tables/)")
    return parser.parse_args(argv)


def _names(text: str, allowed: tuple | None, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if allowed is not None and n not in allowed]
    if bad or not names:
        raise SystemExit(f"reproduce_tables: {flag}: expected a comma-separated subset of {','.join(allowed)}, "
                         f"got {text!r}")
    return names


def _seeds(args, table: str) -> int:
    return args.seeds or DEFAULT_SEEDS[table][1 if args.full else 0]


def build_cells(args) -> list[Cell]:
    """Every cell of the grid, in run order, with its exact `dpicl` arguments."""
    datasets = _names(args.datasets, None, "--datasets")
    tables = _names(args.tables, TABLES, "--tables")
    extra = shlex.split(args.extra_args)
    test_size = args.test_size if args.test_size is not None else (None if args.full else 100)
    common_tail = ["--model", args.model] + (["--test-size", str(test_size)] if test_size else [])
    cells = []
    for dataset in datasets:
        head = ["--dataset", dataset, "--dataset-id", f"{dataset}-tables"]
        if "tang" in tables:
            seeds = _seeds(args, "tang")
            sizes = TANG_FULL.get(dataset, TANG_FULL["agnews"]) if args.full else TANG_CPU
            argv = ["run", "--json", "--methods", "tang", "--epsilons", ",".join(map(str, TANG_EPSILONS)),
                    "--baselines", TANG_BASELINES, *head, "--no-audit", "--seeds", str(seeds), *sizes,
                    *common_tail, *extra]
            cells.append(Cell(f"tang-{dataset}", "tang", dataset, argv))
        if "pate" in tables:
            repeats = _seeds(args, "pate")
            sizes = (["--teachers", "200", "--shots", "1", "--queries", PATE_FULL_QUERIES.get(dataset, "500"),
                      "--sigma2", "20", "--student-candidates", "50"] if args.full else PATE_CPU)
            for public, baselines in (("iid", "zero-shot,ensemble,upper-bound"), ("ood", "zero-shot")):
                argv = ["pate", "--json", "--epsilon", "inf", *head, "--public", public, *sizes, "--repeats", str(repeats),
                        "--delta", "1e-6", "--baselines", baselines, *common_tail, *extra]
                cells.append(Cell(f"pate-{public}-{dataset}", "pate", dataset, argv, key=(public,)))
        if "dpsgd" in tables:
            trainings = _seeds(args, "dpsgd")
            preset = ["--preset", "gpu"] if args.full else ["--preset", "cpu", "--steps", str(args.dpsgd_steps),
                                                            "--validation-size", DPSGD_CPU_VALIDATION]
            for kind, eps in DPSGD_KEYS:
                argv = ["tune", "--json", *head, "--kind", kind, "--epsilon", eps, *preset,
                        "--seeds", str(trainings), *common_tail, *extra]
                cells.append(Cell(f"dpsgd-{kind}-eps{eps}-{dataset}", "dpsgd", dataset, argv, key=(kind, eps)))
    return cells


def _launcher() -> list[str]:
    """`python -m flows.cli` where the package has a `__main__`, else the same entry point through `-c`."""
    if importlib.util.find_spec("flows.cli.__main__") is not None:
        return [sys.executable, "-m", "flows.cli"]
    return [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]


def _finished(path: Path, cell: Cell) -> dict | None:
    """The stored record of a finished cell run with the same command, else None."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("argv") == cell.argv and isinstance(record.get("result"), dict) else None


def run_cell(cell: Cell, cells_dir: Path) -> tuple[str, float]:
    """Run one cell's command; returns (status, wall seconds): done, or FAILED (exit N) with its log."""
    from dpcore.data.artifacts import write_json_atomic

    log_path = cells_dir / "logs" / f"{cell.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(cell.command + "\n")
        log.flush()
        proc = subprocess.run(_launcher() + cell.argv, cwd=REPO, env=os.environ.copy(), stdout=subprocess.PIPE,
                              stderr=log, text=True)
    wall = time.perf_counter() - began
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (IndexError, ValueError):
        result = None
    if result is None:
        return f"FAILED (exit {proc.returncode}; log {log_path})", wall
    cell.result = result
    write_json_atomic(cells_dir / f"{cell.name}.json", {"cell": cell.name, "table": cell.table, "dataset": cell.dataset, "argv": cell.argv,
                       "command": cell.command, "wall_seconds": round(wall),  # whole seconds: a cell reads its dataset as private records
                       "finished_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "result": result})
    return "done", wall


# ---------------------------------------------------------------- reading the cells' JSON
def _num(value) -> float | None:
    if value is None:
        return None
    if value in ("inf", "Infinity"):
        return INF
    return float(value)


def _pct(mean, std=None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    text = f"{100 * mean:.1f}"
    return text + (f" ± {100 * std:.1f}" if std is not None else "")


def _paper(mean, std=None) -> str:
    """A published number as printed in the paper (its own precision)."""
    return "-" if mean is None else f"{mean}" + (f" ± {std}" if std is not None else "")


def _eps(value) -> str:
    value = _num(value)
    return "-" if value is None else ("inf" if math.isinf(value) else f"{value:.3g}")


def tang_points(result: dict) -> dict:
    """{column: (mean, std)} of a `dpicl run --json` tang-only result, calibrated accuracy (the paper's)."""
    points = {}
    for row in result.get("results", []):
        column = _num(row["epsilon"]) if row["method"] == "tang" else row["method"]
        mean = row.get("calibrated_accuracy_mean", row.get("accuracy_mean"))
        std = row.get("calibrated_accuracy_std", row.get("accuracy_std"))
        points[column] = (mean, std, row.get("noise_multiplier"))
    return points


def _wall(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s" if seconds >= 60 else f"{seconds:.0f} s"


def _commands(cells: list[Cell], walls: dict) -> list[str]:
    lines = ["", "Commands (each cell's exact command; wall time of its finished run):", ""]
    for cell in cells:
        state = _wall(walls[cell.name]) if cell.result is not None and cell.name in walls else "not finished"
        lines.append(f"- `{cell.name}` ({state}): `{cell.command}`")
    return lines


def tang_section(cells: list[Cell], walls: dict, model: str) -> list[str]:
    columns = ["zero-shot", "instruction-only", *[float(e) for e in TANG_EPSILONS], "sigma-zero", "random-real"]
    heads = ["0-shot", "ε = 0 (instruction-only)", *[f"ε = {e}" for e in TANG_EPSILONS], "ε = ∞ (σ = 0)",
             "ε = ∞ (random real)"]
    lines = ["## Tang et al. Table 1: DP few-shot generation (`dpicl run --methods tang`)", "",
             "4-shot ICL, calibrated accuracy in %, mean ± std over evaluation seeds. Paper: GPT-3 Babbage, "
             "its ε = ∞ is the better of σ = 0 and random real demos.", "",
             "| dataset | source | δ | " + " | ".join(heads) + " |", "|---" * (len(heads) + 3) + "|"]
    for cell in cells:
        if cell.result is None:
            lines.append(f"| {cell.dataset} | {model} (this run) | - | " + " | ".join(["not finished"] * len(heads)) + " |")
        else:
            points = tang_points(cell.result)
            values = [_pct(*points[c][:2]) if c in points else "-" for c in columns]
            lines.append(f"| {cell.dataset} | {model} (this run) | "
                         f"{_eps(cell.result.get('delta'))} | " + " | ".join(values) + " |")
        paper = TANG_PAPER.get(cell.dataset)
        if paper:
            values = [_paper(*paper[c]) if c in paper else "-" for c in columns[:-2]]
            values += [_paper(*paper[INF]) + " (best of both)", "(see σ = 0)"]
            lines.append(f"| {cell.dataset} | paper (GPT-3 Babbage) | 1/\\|D\\| | " + " | ".join(values) + " |")
    sigmas = [f"{c.dataset}: " + ", ".join(f"ε {e:g} σ {_eps(tang_points(c.result)[float(e)][2])}"
                                           for e in TANG_EPSILONS if float(e) in tang_points(c.result))
              for c in cells if c.result is not None]
    if sigmas:
        lines += ["", "Noise multipliers calibrated per ε: " + "; ".join(sigmas) + "."]
    return lines + _commands(cells, walls)


def _data_dependent(result: dict) -> float | None:
    """PromptPATE's data-dependent epsilon, read from the run's PRIVATE store: a non-DP statistic of the
    votes that dpicl never publishes. The operator reads it here because these tables run on the shipped
    public benchmarks, to set it beside the paper's figure."""
    path = Path(result.get("private_run_dir") or "") / "pate_data_dependent.json"
    return json.loads(path.read_text()).get("epsilon_data_dependent") if path.is_file() else None


def pate_section(cells: list[Cell], walls: dict, model: str) -> list[str]:
    lines = ["## Duan et al. Table 2: PromptPATE (`dpicl pate`)", "",
             "Accuracy in %, student mean ± std over repeats (calibrated votes and accuracies); ε: what the ledger "
             "charged (data-independent, all repeats) / the data-dependent bound (Papernot et al. 2018, not itself "
             "DP; the paper reports this one; read from the run's private store, as only an operator can). Paper: GPT-3 Babbage, E = 200, Q = 500, δ = 1e-6.", "",
             "| dataset | source | zero-shot (ε = 0) | ensemble (ε = ∞) | upper bound (ε = ∞) | IID public | "
             "ε / data-dep. ε | IID accuracy | OOD public | ε / data-dep. ε | OOD accuracy | answered IID / OOD |",
             "|---" * 12 + "|"]
    by_dataset: dict[str, dict] = {}
    for cell in cells:
        by_dataset.setdefault(cell.dataset, {})[cell.key[0]] = cell
    for dataset, pair in by_dataset.items():
        iid, ood = (pair.get(p).result if pair.get(p) else None for p in ("iid", "ood"))
        base = (iid or ood or {}).get("baselines", {})
        row = [dataset, f"{model} (this run)", _pct(base.get("zero-shot")),
               _pct((iid or {}).get("baselines", {}).get("ensemble")),
               _pct((iid or {}).get("baselines", {}).get("upper-bound"))]
        for result in (iid, ood):
            if result is None:
                row += ["not finished", "-", "-"]
            else:
                acc = result["accuracy"]
                row += [str(result.get("public", "")), f"{_eps(result['epsilon'])} / "
                        f"{_eps(_data_dependent(result))}", _pct(acc.get("mean"), acc.get("std"))]
        row.append(" / ".join(", ".join(str(a) for a in r.get("answered", [])) if r else "-" for r in (iid, ood)))
        lines.append("| " + " | ".join(row) + " |")
        paper = PATE_PAPER.get(dataset)
        if paper:
            prow = [dataset, "paper (GPT-3 Babbage)", _paper(paper["zero-shot"]), _paper(paper["ensemble"]),
                    _paper(paper["upper-bound"])]
            for public in ("iid", "ood"):
                name, eps, mean, std = paper[public]
                prow += [name, f"- / {eps}", _paper(mean, std)]
            lines.append("| " + " | ".join(prow + ["-"]) + " |")
    return lines + _commands(cells, walls)


def _raw_calibrated(result: dict | None, method: str, epsilon: float | None) -> str:
    """`raw ± std [calibrated]` of one row of a tang cell's results (`-` when the cell or row is missing)."""
    for row in (result or {}).get("results", []):
        if row["method"] == method and (epsilon is None or _num(row["epsilon"]) == epsilon):
            return (f"{_pct(row.get('accuracy_mean'), row.get('accuracy_std'))} "
                    f"[{_pct(row.get('calibrated_accuracy_mean'))}]")
    return "-"


def dpsgd_section(cells: list[Cell], walls: dict, model: str, tang_cells: list[Cell] = ()) -> list[str]:
    keys = DPSGD_KEYS
    references = [e for e in DPSGD_EPSILONS if e != "inf"]
    heads = ["0-shot", *[f"DP few-shot generation ε = {e}" for e in references],
             *[f"{k} ε = {'∞' if e == 'inf' else e}" for k, e in keys]]
    lines = ["## Duan et al. Table 1: PromptDPSGD (`dpicl tune`)", "",
             "Test accuracy in %, mean ± std over trainings (calibrated accuracy in brackets); ε = ∞ trains without "
             "noise. Beside them, on the same test items, the dataset's zero-shot prompt and DP few-shot generation "
             "at the same ε from its Tang cell (mean ± std over its evaluation seeds; δ = 1/|D| there as here). "
             "Paper: RoBERTa-base, δ = 1/N, ε = 3 from its appendix table.", "",
             "| dataset | source | " + " | ".join(heads) + " |", "|---" * (len(heads) + 2) + "|"]
    by_dataset: dict[str, dict] = {}
    for cell in cells:
        by_dataset.setdefault(cell.dataset, {})[cell.key] = cell
    for dataset, found in by_dataset.items():
        tang = next((t.result for t in tang_cells if t.dataset == dataset and t.result is not None), None)
        values = [_raw_calibrated(tang, "zero-shot", None)] + [_raw_calibrated(tang, "tang", float(e))
                                                                for e in references]
        for key in keys:
            result = found[key].result if key in found else None
            if result is None:
                values.append("not finished")
            else:
                acc, cal = result["accuracy"], result.get("calibrated_accuracy", {})
                values.append(f"{_pct(acc.get('mean'), acc.get('std'))} [{_pct(cal.get('mean'))}]")
        lines.append(f"| {dataset} | {model} (this run) | " + " | ".join(values) + " |")
        paper = DPSGD_PAPER.get(dataset)
        if paper:
            lines.append(f"| {dataset} | paper (RoBERTa-base) | " + " | ".join(["-"] * (1 + len(references)))
                         + " | " + " | ".join(_paper(paper.get(k)) for k in keys) + " |")
    details = [f"{c.name}: δ {_eps(c.result.get('delta'))}, σ {_eps(c.result.get('noise_multiplier'))}, "
               f"q {_eps(c.result.get('sampling_rate'))}, T {c.result.get('steps')}" for c in cells if c.result is not None]
    if details:
        lines += ["", "Trainings: " + "; ".join(details) + "."]
    return lines + _commands(cells, walls)


def write_markdown(cells: list[Cell], walls: dict, args, out: Path) -> Path:
    from dpcore.data.artifacts import write_text_atomic

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# The papers' tables on the embedded model", "",
             f"Written {when} by `python benchmarks/reproduce_tables.py` ({'papers sizes (--full)' if args.full else 'CPU sizes'}; "
             f"model `{args.model}`). Every cell charges the ledger id `<dataset>-tables`.", ""]
    sections = {"tang": tang_section, "pate": pate_section, "dpsgd": dpsgd_section}
    for table, section in sections.items():
        chosen = [c for c in cells if c.table == table]
        if chosen:
            extra = {"tang_cells": [c for c in cells if c.table == "tang"]} if table == "dpsgd" else {}
            lines += section(chosen, walls, args.model, **extra) + [""]
    plotted = [d for d in dict.fromkeys(c.dataset for c in cells) if (out / f"accuracy_{d}.png").exists()]
    if plotted:
        lines += ["Plots (accuracy against the epsilon charged, a line per method, references as horizontal lines): "
                  + ", ".join(f"`accuracy_{d}.png`" for d in plotted) + ".", ""]
    return write_text_atomic(out / "tables.md", "\n".join(lines))


def plot_points(cells: list[Cell]) -> tuple[dict, dict]:
    """(lines, references) of one dataset: {label: [(epsilon, mean, std)]} at finite epsilon, {label: mean}."""
    lines: dict[str, list] = {}
    references: dict[str, float] = {}
    for cell in cells:
        result = cell.result
        if result is None:
            continue
        if cell.table == "tang":
            for column, (mean, std, _) in tang_points(result).items():
                if isinstance(column, float) and 0 < column < INF:
                    lines.setdefault("DP few-shot generation", []).append((column, mean, std or 0.0))
                elif mean is not None:
                    references[f"{column} (Tang)"] = mean
        elif cell.table == "pate":
            acc = result["accuracy"]
            if acc.get("mean") is not None:
                lines.setdefault(f"PromptPATE {cell.key[0].upper()}", []).append(
                    (_num(result["epsilon"]), acc["mean"], acc.get("std") or 0.0))
            for name, value in result.get("baselines", {}).items():
                if value is not None:
                    references[f"{name} (PATE)"] = value
        else:
            kind, eps = cell.key
            acc = result["accuracy"]
            if eps == "inf":
                references[f"PromptDPSGD {kind} (ε = ∞)"] = acc["mean"]
            else:
                lines.setdefault(f"PromptDPSGD {kind}", []).append((float(eps), acc["mean"], acc.get("std") or 0.0))
    return lines, references


def write_plot(dataset: str, cells: list[Cell], model: str, out: Path) -> Path | None:
    from matplotlib.figure import Figure

    from dpcore.data.artifacts import write_bytes_atomic

    lines, references = plot_points(cells)
    if not lines and not references:
        return None
    figure = Figure(figsize=(7.5, 4.5))
    axis = figure.subplots()
    for label, points in lines.items():
        points = sorted(points)
        axis.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                      capsize=3, label=label)
    for i, (label, value) in enumerate(sorted(references.items())):
        axis.axhline(value, color=f"C{(i + len(lines)) % 10}", linestyle=(":", "--", "-.")[i % 3], linewidth=1,
                     label=f"{label}: {value:.3f}")
    if lines:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        axis.set_xscale("log")
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel("epsilon charged (log scale)")
    axis.set_ylabel("test accuracy (Tang et al.: calibrated)")
    axis.set_ylim(0.0, 1.0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axis.set_title(f"{dataset}: accuracy against epsilon ({model})")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return write_bytes_atomic(out / f"accuracy_{dataset}.png", buffer.getvalue())


@contextlib.contextmanager
def _grid_bar(total: int):
    """A bar over the grid's cells on stderr (a terminal only; the `[i/N]` lines on stdout always show progress).

    Yields `advance(name, skipped)`: called as a cell starts (or is skipped), and once at the end."""
    if not sys.stderr.isatty():
        yield lambda name, skipped: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(file=sys.stderr))
    task = bar.add_task("cells", total=total)
    state = {"started": 0}

    def advance(name: str, skipped: bool) -> None:
        bar.update(task, completed=state["started"], description=f"cells ({name})" if name else "cells")
        if name:
            state["started"] += 1
            if skipped:
                bar.update(task, completed=state["started"])

    with bar:
        yield advance


def main(argv=None) -> int:
    from dpcore.home import dpicl_home

    args = _parse(argv)
    cells = build_cells(args)
    if args.dry_run:
        for i, cell in enumerate(cells, 1):
            print(f"[{i}/{len(cells)}] {cell.name}: {cell.command}")
        return 0
    cells_dir = dpicl_home() / "benchmarks" / "tables"
    out = Path(args.out) if args.out else cells_dir
    cells_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    failed = not_run = 0
    began = time.perf_counter()
    with _grid_bar(len(cells)) as advance:
        for i, cell in enumerate(cells, 1):
            record = _finished(cells_dir / f"{cell.name}.json", cell)
            if record is not None:
                cell.result, walls[cell.name] = record["result"], float(record.get("wall_seconds", 0))
                print(f"[{i}/{len(cells)}] {cell.name}: skipped, finished {record.get('finished_utc', '?')}",
                      flush=True)
                advance(cell.name, skipped=True)
                continue
            if args.report_only:
                print(f"[{i}/{len(cells)}] {cell.name}: not finished (--report-only: not run)", flush=True)
                not_run += 1
                advance(cell.name, skipped=True)
                continue
            print(f"[{i}/{len(cells)}] {cell.name}: running {cell.command}", flush=True)
            advance(cell.name, skipped=False)
            status, walls[cell.name] = run_cell(cell, cells_dir)
            failed += status.startswith("FAILED")
            print(f"[{i}/{len(cells)}] {cell.name}: {status} in {_wall(walls[cell.name])}", flush=True)
            write_markdown(cells, walls, args, out)  # the tables so far: a stopped grid still leaves them
        advance("", skipped=True)
    for dataset in dict.fromkeys(c.dataset for c in cells):
        write_plot(dataset, [c for c in cells if c.dataset == dataset], args.model, out)
    path = write_markdown(cells, walls, args, out)
    print(f"{len(cells) - failed - not_run}/{len(cells)} cells finished in {_wall(time.perf_counter() - began)}; "
          f"tables: {path}" + (f"; {failed} failed (rerun to retry them)" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
