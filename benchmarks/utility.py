"""Benchmark: what PromptDPSGD's soft prompt is worth, per dataset and epsilon, on the embedded model.

The table of the CPU preset (`dpcore.dpsgd.training.CPU_PRESET`, the recipe `dpicl tune` and `dpicl run
--methods dpsgd` use on a CPU): for each dataset and epsilon one training of Duan et al. Algorithm 1
(`dpcore.dpsgd.training.train`, Opacus' clipping and noise, the accountant's sigma for (epsilon, 1/N)),
then raw and contextually calibrated accuracy of the trained prompt on the first `--test-size` items of the
test split (`dpcore.lm.icl.evaluate`, the pipeline's scoring), beside the zero-shot prompt on the same
items; wall time and peak memory per training. `--spread D:E:K` trains K prompts of dataset D at epsilon E
(the spread over trainings). Every row is an experiment: the noise is seeded (`seeded_noise`), nothing is
charged to a ledger, nothing can be released.

Choosing the recipe (`--grid`): hyperparameters are never tuned on private data outside the budget, so the
preset was chosen on public data once, by this command: each combination of `--grid` values is trained on
the `--sweep-datasets` at the `--sweep-epsilons` and scored on the tasks' PUBLIC split (rows held out of the
private records and of the test split), never on the test split; the combination and scoring (raw or
calibrated) with the best mean public accuracy is then the recipe of the table. `--examples N` keeps the
compute of every combination the same: T = round(N / batch size) unless `steps` is set.

    python benchmarks/utility.py [--datasets sst2,agnews,trec] [--epsilons 1,8,inf] [--spread agnews:1:3]
        [--test-size 300] [--set KEY=VALUE ...] [--examples N]
        [--grid KEY=V1,V2 ...] [--sweep-datasets sst2,agnews] [--sweep-epsilons 8] [--sweep-size 300]
        [--model smollm2-135m|tiny] [--device cpu] [--dtype float32] [--threads T] [--physical-batch-size B]
        [--out-dir DIR] [--json]

KEY is a `DpsgdConfig` field (length, init, clip, batch_size, steps, epochs, lr, ...). Results stream to
`<out-dir>/utility_rows.jsonl` (one JSON object per training, written as each finishes) and end in
`<out-dir>/utility.json` (default out-dir: $DPICL_HOME/benchmarks); with --json the last line printed is
that object.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (a `benchmarks` package may be installed)

from benchlib import PeakMemory  # noqa: E402

DEFAULT_DATASETS = "sst2,agnews,trec"
DEFAULT_EPSILONS = "1,8,inf"


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default=DEFAULT_DATASETS)
    parser.add_argument("--epsilons", default=DEFAULT_EPSILONS)
    parser.add_argument("--spread", default="agnews:1:3", help="DATASET:EPSILON:TRAININGS ('' for none)")
    parser.add_argument("--test-size", type=int, default=300)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a DpsgdConfig field over the CPU preset")
    parser.add_argument("--examples", type=int, default=None,
                        help="training examples per training in expectation: T = round(N / batch size)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="choose the recipe first: every combination, scored on the public split")
    parser.add_argument("--sweep-datasets", default="sst2,agnews")
    parser.add_argument("--sweep-epsilons", default="8")
    parser.add_argument("--sweep-size", type=int, default=300, help="public items that score a combination")
    parser.add_argument("--model", default="smollm2-135m", help="a model name, or `tiny` (random tiny Llama)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                        help="float32 matrix products: highest (exact fp32) or high (TF32 on a GPU)")
    parser.add_argument("--physical-batch-size", type=int, default=None,
                        help="examples per forward/backward (memory and speed only)")
    parser.add_argument("--eval-batch-size", type=int, default=16)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def _value(text: str):
    if text in ("None", "none"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _assignments(items: list[str], what: str) -> dict:
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"utility.py: {what} {item!r}: write KEY=VALUE")
        values[key.strip().replace("-", "_")] = value.strip()
    return values


def recipes(args) -> list[dict]:
    """The CPU preset with --set on top, once per --grid combination (one recipe without --grid)."""
    from dpcore.dpsgd.training import CPU_PRESET

    base = {**CPU_PRESET, **{k: _value(v) for k, v in _assignments(args.set, "--set").items()}}
    grid = {k: [_value(v) for v in values.split(",")] for k, values in _assignments(args.grid, "--grid").items()}
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())] if grid else [{}]
    out = []
    for combo in combos:
        recipe = {**base, **combo}
        if args.examples and "steps" not in combo and not any(s.startswith("steps=") for s in args.set):
            recipe.update(steps=max(1, round(args.examples / recipe["batch_size"])), epochs=None)
        if args.physical_batch_size:
            recipe["physical_batch_size"] = args.physical_batch_size
        out.append({"grid": combo, "recipe": recipe})
    return out


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(parts, default=str).encode()).digest()[:8], "big")


class Bench:
    """The model, the datasets (loaded once each) and the rows written so far."""

    def __init__(self, args):
        import torch

        from dpcore.home import configure_environment, subdir
        from dpcore.lm.model import LanguageModel

        configure_environment()
        if args.threads:
            torch.set_num_threads(args.threads)
        torch.set_float32_matmul_precision(args.matmul_precision)
        self.args = args
        self.lm = (LanguageModel.tiny_random(seed=0, device=args.device) if args.model == "tiny"
                   else LanguageModel.load(args.model, device=args.device, dtype=args.dtype))
        self.out_dir = Path(args.out_dir) if args.out_dir else subdir("benchmarks")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rows_path = self.out_dir / "utility_rows.jsonl"
        self.rows_path.write_text("")
        self.data: dict = {}
        self.zero_shot: dict = {}

    def dataset(self, name: str):
        from dpcore.data.datasets import load_dataset
        from dpcore.data.taskspec import load_task_spec
        from dpcore.dpsgd.soft_prompt import encode_examples, instruction_ids

        if name not in self.data:
            spec = load_task_spec(name)
            data = load_dataset(spec)
            train = data.train.reset_index(drop=True)
            examples = encode_examples(self.lm, spec, train["text"].astype(str).tolist(),
                                       train["label"].astype(str).tolist())
            public = data.public.sort_values("id", kind="stable").reset_index(drop=True)
            # the loss curve's examples: the first of the public split in id order (tasks.tune's rule), encoded once
            public_examples = encode_examples(self.lm, spec, public["text"].astype(str).tolist(),
                                              public["label"].astype(str).tolist()) if len(public) else []
            self.data[name] = {"spec": spec, "train": examples, "test": data.test, "public": public,
                               "public_examples": public_examples, "instruction": instruction_ids(self.lm, spec)}
        return self.data[name]

    def evaluate(self, name: str, split: str, size: int, method: str, epsilon: float, past=None) -> dict:
        from dpcore.config import EvalConfig
        from dpcore.lm import icl

        d = self.dataset(name)
        frame = d[split]
        _, metrics = icl.evaluate(self.lm, d["spec"], frame, None, method, epsilon,
                                  EvalConfig(shots=0, seeds=1, test_size=min(size, len(frame)), calibrate=True),
                                  batch_size=self.args.eval_batch_size, past=past)
        row = metrics.iloc[0]
        return {"n": int(row["n"]), "accuracy": float(row["accuracy"]),
                "calibrated_accuracy": float(row["calibrated_accuracy"])}

    def zero_shot_row(self, name: str, split: str, size: int) -> dict:
        key = (name, split, size)
        if key not in self.zero_shot:
            self.zero_shot[key] = {"phase": "zero-shot", "dataset": name, "split": split,
                                   **self.evaluate(name, split, size, "zero-shot", 0.0)}
            self._write(self.zero_shot[key])
        return self.zero_shot[key]

    def train(self, phase: str, name: str, epsilon: float, training: int, recipe: dict, grid: dict,
              split: str, size: int) -> dict:
        import torch

        from dpcore.dpsgd import training as dpsgd
        from dpcore.dpsgd.soft_prompt import init_prompt

        d = self.dataset(name)
        config = dpsgd.DpsgdConfig(**recipe)
        plan = dpsgd.dpsgd_plan(epsilon, len(d["train"]), config)
        spend = plan.spends[0]
        noise, sampling, seeded = dpsgd.generators(_seed(phase, name, epsilon, training, recipe), self.lm.device)
        prompt = init_prompt(self.lm, config.kind, config.length, config.init, sampling,
                             d["instruction"]).to(self.lm.device)
        val_examples = d["public_examples"][:config.validation_size]
        with PeakMemory(self.lm.device) as memory:
            began = time.perf_counter()
            result = dpsgd.train(self.lm, prompt, d["train"], val_examples,
                                 noise_multiplier=spend.noise_multiplier, sampling_rate=spend.sampling_rate,
                                 steps=spend.steps, clip=config.clip, lr=config.lr, delta=plan.delta,
                                 noise_generator=noise, sampling_generator=sampling, seeded=seeded,
                                 physical_batch_size=config.physical_batch_size, eval_every=config.eval_every)
            if self.lm.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - began
        scores = self.evaluate(name, split, size, "dpsgd", epsilon, past=prompt.cache_layers(self.lm))
        row = {"phase": phase, "dataset": name, "split": split, "epsilon": epsilon, "training": training,
               "grid": grid, **scores, "delta": plan.delta, "noise_multiplier": spend.noise_multiplier,
               "sampling_rate": spend.sampling_rate, "steps": spend.steps, "batch_size": config.batch_size,
               "examples_in_expectation": round(spend.sampling_rate * len(d["train"]) * spend.steps),
               "training_records": len(d["train"]), "recipe": config.model_dump(), "train_seconds": seconds,
               "peak_memory_mb": memory.peak_mb, "curve": result.curve, "seeded_noise": seeded}
        self._write(row)
        return row

    def _write(self, row: dict) -> None:
        with self.rows_path.open("a") as handle:
            handle.write(json.dumps(row, default=str) + "\n")
        if row["phase"] == "zero-shot":
            print(f"[{row['dataset']} {row['split']}] zero-shot: raw {row['accuracy']:.3f}, calibrated "
                  f"{row['calibrated_accuracy']:.3f} (n {row['n']})", flush=True)
        else:
            print(f"[{row['phase']} {row['dataset']} eps {row['epsilon']:g} #{row['training']}] {row['grid'] or ''} "
                  f"raw {row['accuracy']:.3f}, calibrated {row['calibrated_accuracy']:.3f} (n {row['n']}); "
                  f"sigma {row['noise_multiplier']:.3f}, q {row['sampling_rate']:.2e}, T {row['steps']}, "
                  f"{row['train_seconds']:.0f} s, +{row['peak_memory_mb']:.0f} MB", flush=True)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def sweep(bench: Bench, args, candidates: list[dict]) -> tuple[dict, str, list[dict]]:
    """Every candidate on the sweep datasets' public split: (the best recipe, its scoring, the rows)."""
    rows = []
    for name in _names(args.sweep_datasets):
        bench.zero_shot_row(name, "public", args.sweep_size)
    for index, candidate in enumerate(candidates):
        for name in _names(args.sweep_datasets):
            for epsilon in _floats(args.sweep_epsilons):
                rows.append({"candidate": index, **bench.train("sweep", name, epsilon, 0, candidate["recipe"],
                                                               candidate["grid"], "public", args.sweep_size)})
    best, best_score = None, -math.inf
    for index, candidate in enumerate(candidates):
        mine = [r for r in rows if r["candidate"] == index]
        for scoring in ("accuracy", "calibrated_accuracy"):
            score = sum(r[scoring] for r in mine) / len(mine)
            if score > best_score:
                best, best_score = (candidate, scoring), score
    print(f"chosen on the public split: {best[0]['grid']} scored {best[1]} (mean {best_score:.3f})", flush=True)
    return best[0], best[1], rows


def table(bench: Bench, args, recipe: dict, grid: dict) -> list[dict]:
    """One training per dataset and epsilon on the test split, the --spread trainings, zero-shot beside."""
    rows = []
    spread = {}
    if args.spread:
        name, eps, count = args.spread.split(":")
        spread[(name, float(eps))] = int(count)
    for name in _names(args.datasets):
        rows.append(bench.zero_shot_row(name, "test", args.test_size))
        for epsilon in _floats(args.epsilons):
            for training in range(spread.get((name, epsilon), 1)):
                rows.append(bench.train("table", name, epsilon, training, recipe, grid, "test", args.test_size))
    return rows


def _stat(group: list[dict], key: str) -> str:
    """Mean, and ± the sample standard deviation over trainings when there are several."""
    values = [g[key] for g in group]
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.3f}"
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return f"{mean:.3f} ± {std:.3f}"


def summary_table(rows: list[dict]) -> str:
    lines = ["| dataset | epsilon | trainings | raw | calibrated | sigma | q | T | train s | peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    zero = {r["dataset"]: r for r in rows if r["phase"] == "zero-shot"}
    for name, z in zero.items():
        lines.append(f"| {name} | zero-shot | - | {z['accuracy']:.3f} | {z['calibrated_accuracy']:.3f} "
                     "| - | - | - | - | - |")
        groups: dict = {}
        for r in rows:
            if r["phase"] == "table" and r["dataset"] == name:
                groups.setdefault(r["epsilon"], []).append(r)
        for eps, group in groups.items():
            g = group[0]
            lines.append(f"| {name} | {eps:g} | {len(group)} | {_stat(group, 'accuracy')} "
                         f"| {_stat(group, 'calibrated_accuracy')} "
                         f"| {g['noise_multiplier']:.3f} | {g['sampling_rate']:.2e} | {g['steps']} "
                         f"| {max(x['train_seconds'] for x in group):.0f} | {max(x['peak_memory_mb'] for x in group):.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(argv)
    candidates = recipes(args)
    began = time.perf_counter()
    bench = Bench(args)
    import torch

    from dpcore.dpsgd.soft_prompt import weights_hash

    result: dict = {"model": bench.lm.name, "model_weights_sha256": weights_hash(bench.lm.model),
                    "device": str(bench.lm.device), "dtype": str(bench.lm.dtype), "threads": torch.get_num_threads(),
                    "matmul_precision": args.matmul_precision, "test_size": args.test_size,
                    "argv": sys.argv[1:] if argv is None else list(argv)}
    print(f"model {result['model']} weights sha256 {result['model_weights_sha256'][:16]} on {result['device']}",
          flush=True)
    scoring = None
    if len(candidates) > 1 or args.grid:
        chosen, scoring, sweep_rows = sweep(bench, args, candidates)
        result.update(sweep=sweep_rows, chosen=chosen, chosen_scoring=scoring)
    else:
        chosen = candidates[0]
    rows = table(bench, args, chosen["recipe"], chosen["grid"]) if args.datasets else []
    result.update(recipe=chosen["recipe"], rows=rows, seconds=time.perf_counter() - began)
    text = summary_table(rows)
    print(text)
    path = bench.out_dir / "utility.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"written: {path}")
    if args.json:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
