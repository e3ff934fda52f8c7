"""Benchmark: what PromptDPSGD's soft prompt is worth, per dataset and epsilon, on the embedded model.

The table of the CPU preset (`dpcore.dpsgd.training.CPU_PRESET`, the recipe `dpicl tune` and `dpicl run
--methods dpsgd` use on a CPU): for each dataset and epsilon one training of Duan et al. Algorithm 1
(`dpcore.dpsgd.training.train`, Opacus' clipping and noise, the accountant's sigma for (epsilon, 1/N)),
then raw and contextually calibrated accuracy of the trained prompt on the first `--test-size` items of the
test split (`dpcore.lm.icl.evaluate`, the pipeline's scoring), beside the zero-shot prompt on the same
items; wall time and peak memory per training. `--spread D:E:K` trains K prompts of dataset D at epsilon E
(the spread over trainings). Every row is an experiment: the noise is seeded (`seeded_noise`), nothing is
charged to a ledger, nothing can be released.

The DP fine-tuning baselines of Duan et al. Table 1 train through the same function: `--set kind=prefix`,
`--set kind=lora` or `--set kind=full` (each kind starts from its `KIND_PRESETS` learning rate and chunk
size, as `dpicl tune` does; the trained adapter is scored as `dpicl predict` scores a release, on the
adapted copy of the model).

PromptPATE (`--pate-datasets`): one row per dataset at `--pate-teachers` x `--pate-queries` (Duan et al.
Table 7: 200 x 500 on a GPU), R repeats of Confident-GNMax, the best of `--pate-candidates` students scored on
the same test items, and three epsilons: the data-independent bound the ledger charges, the data-dependent
bound of Papernot et al. 2018 (not DP; the figure of Duan et al. Table 2) and that bound released through
smooth sensitivity at parameters fixed in this file.

Choosing the recipe (`--grid`): hyperparameters are never tuned on private data outside the budget, so the
preset was chosen on public data once, by this command: each combination of `--grid` values is trained on
the `--sweep-datasets` at the `--sweep-epsilons` and scored on the tasks' PUBLIC split (rows held out of the
private records and of the test split), never on the test split; the combination and scoring (raw or
calibrated) with the best mean public accuracy is then the recipe of the table. `--examples N` keeps the
compute of every combination the same: T = round(N / batch size) unless `steps` is set.

    python benchmarks/utility.py [--datasets sst2,agnews,trec] [--epsilons 1,8,inf] [--spread agnews:1:3]
        [--test-size 300] [--set KEY=VALUE ...] [--examples N]
        [--grid KEY=V1,V2 ...] [--sweep-datasets sst2,agnews] [--sweep-epsilons 8] [--sweep-size 300]
        [--pate-datasets sst2,agnews] [--pate-teachers E] [--pate-queries Q] [--pate-repeats R]
        [--pate-shots K] [--pate-sigma2 S] [--pate-candidates C] [--pate-max-rows N]
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
    parser.add_argument("--pate-datasets", default="", help="PromptPATE rows on these datasets ('' for none)")
    parser.add_argument("--pate-teachers", type=int, default=20, help="E (Duan et al. Table 7: 200)")
    parser.add_argument("--pate-queries", type=int, default=50, help="Q per repeat (Table 7: 500)")
    parser.add_argument("--pate-repeats", type=int, default=3)
    parser.add_argument("--pate-shots", type=int, default=1)
    parser.add_argument("--pate-sigma2", type=float, default=20.0, help="GNMax noise (Table 7: 20)")
    parser.add_argument("--pate-candidates", type=int, default=50, help="candidate students (Table 7: 50)")
    parser.add_argument("--pate-max-rows", type=int, default=64, help="(teacher, query) rows per forward")
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
    from dpcore.dpsgd.training import CPU_PRESET, KIND_PRESETS

    settings = {k: _value(v) for k, v in _assignments(args.set, "--set").items()}
    # a kind starts from its own learning rate and chunk size (`KIND_PRESETS`), as `dpicl tune` does
    base = {**CPU_PRESET, **KIND_PRESETS.get(settings.get("kind"), {}).get("cpu", {}), **settings}
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

    def dataset(self, name: str) -> dict:
        """The task's spec and splits, loaded once."""
        from dpcore.data.datasets import load_dataset
        from dpcore.data.taskspec import load_task_spec

        if name not in self.data:
            spec = load_task_spec(name)
            data = load_dataset(spec)
            public = data.public.sort_values("id", kind="stable").reset_index(drop=True)
            self.data[name] = {"spec": spec, "loaded": data, "train_frame": data.train.reset_index(drop=True),
                               "test": data.test, "public": public}
        return self.data[name]

    def examples(self, name: str) -> dict:
        """`dataset` with the training records and the loss curve's public examples encoded (once; a PromptPATE
        row needs the raw splits only)."""
        from dpcore.dpsgd.soft_prompt import encode_examples, instruction_ids

        d = self.dataset(name)
        if "train" not in d:
            spec, train, public = d["spec"], d["train_frame"], d["public"]
            d["train"] = encode_examples(self.lm, spec, train["text"].astype(str).tolist(),
                                         train["label"].astype(str).tolist())
            # the loss curve's examples: the first of the public split in id order (tasks.tune's rule)
            d["public_examples"] = encode_examples(self.lm, spec, public["text"].astype(str).tolist(),
                                                   public["label"].astype(str).tolist()) if len(public) else []
            d["instruction"] = instruction_ids(self.lm, spec)
        return d

    def evaluate(self, name: str, split: str, size: int, method: str, epsilon: float, past=None, lm=None,
                 demos=None, shots: int = 0) -> dict:
        from dpcore.lm import icl
        from dpcore.lm.config import EvalConfig

        d = self.dataset(name)
        frame = d[split]
        _, metrics = icl.evaluate(lm or self.lm, d["spec"], frame, demos, method, epsilon,
                                  EvalConfig(shots=shots, seeds=1, test_size=min(size, len(frame)), calibrate=True),
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

        from dpcore.dpsgd import adapters
        from dpcore.dpsgd import training as dpsgd
        from dpcore.dpsgd.soft_prompt import init_prompt
        from dpcore.names import ADAPTER_KINDS

        d = self.examples(name)
        config = dpsgd.DpsgdConfig(**recipe)
        plan = dpsgd.dpsgd_plan(epsilon, len(d["train"]), config)
        spend = plan.spends[0]
        noise, sampling, seeded = dpsgd.generators(_seed(phase, name, epsilon, training, recipe), self.lm.device)
        if config.kind in ADAPTER_KINDS:  # LoRA or full fine-tuning: a trainable copy of the model
            prompt = adapters.init_adapter(self.lm, config.kind, sampling, config.rank)
        else:
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
        curve = result.curve
        if config.kind in ADAPTER_KINDS:  # scored as `dpicl predict` scores a release: the adapted model
            path = self.out_dir / "adapter.safetensors"
            adapters.save_adapter(result.prompt, path, {"kind": config.kind})
            adapted, _ = adapters.trained_scoring(self.lm, path)
            scores = self.evaluate(name, split, size, "dpsgd", epsilon, lm=adapted)
            del adapted, result
            if self.lm.device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            scores = self.evaluate(name, split, size, "dpsgd", epsilon, past=prompt.cache_layers(self.lm))
        row = {"phase": phase, "dataset": name, "split": split, "epsilon": epsilon, "training": training,
               "grid": grid, **scores, "delta": plan.delta, "noise_multiplier": spend.noise_multiplier,
               "sampling_rate": spend.sampling_rate, "steps": spend.steps, "batch_size": config.batch_size,
               "examples_in_expectation": round(spend.sampling_rate * len(d["train"]) * spend.steps),
               "training_records": len(d["train"]), "recipe": config.model_dump(), "train_seconds": seconds,
               "peak_memory_mb": memory.peak_mb, "curve": curve, "seeded_noise": seeded}
        self._write(row)
        return row

    def _write(self, row: dict) -> None:
        with self.rows_path.open("a") as handle:
            handle.write(json.dumps(row, default=str) + "\n")
        if row["phase"] == "pate":
            print(f"[pate {row['dataset']}] E {row['teachers']}, Q {row['queries']} x {row['repeats']}: answered "
                  f"{[r['answered'] for r in row['per_repeat']]}, calibrated accuracy {row['calibrated_accuracy']} "
                  f"(raw {row['accuracy']}); epsilon charged {row['epsilon_charged']:.1f}, data-dependent "
                  f"{row['epsilon_data_dependent']:.3f}, released bound {row['epsilon_released_bound']}; flock "
                  f"{row['flock_seconds']:.0f} s, {row['seconds']:.0f} s", flush=True)
        elif row["phase"] == "zero-shot":
            print(f"[{row['dataset']} {row['split']}] zero-shot: raw {row['accuracy']:.3f}, calibrated "
                  f"{row['calibrated_accuracy']:.3f} (n {row['n']})", flush=True)
        else:
            print(f"[{row['phase']} {row['recipe']['kind']} {row['dataset']} eps {row['epsilon']:g} "
                  f"#{row['training']}] {row['grid'] or ''} "
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


def pate_row(bench: Bench, args, name: str) -> dict:
    """PromptPATE (Duan et al. Algorithm 2) on one dataset at the --pate-* sizes, as `dpicl pate` runs it
    (disjoint one-shot teachers keyed by record id, calibrated votes on IID public queries, Confident-GNMax
    with sigma1 from the task YAML, R repeats of fresh noise, the best of the candidate students on its
    answered queries), scored on the first --test-size test items. Three epsilons per row: the
    data-independent bound the ledger charges (all repeats), the data-dependent bound (Papernot et al. 2018,
    not DP: Duan et al. Table 2's figure), and what `--accounting data-dependent` charges: the GNSS release of an
    upper bound on it with its failure probability (`dpcore.pate.released_cost`, its default order, beta,
    sigma_ss and delta0). Votes, histograms and noise never leave this process."""
    import numpy as np
    import torch

    from dpcore.pate import flock, gnmax, public_queries
    from dpcore.pate.data_dependent import data_dependent_epsilon, epsilon_from_rdp
    from dpcore.pate.privacy import data_independent_epsilon
    from dpcore.pate.released_cost import (
        labelling_spend,
        release_parameters,
        release_spends,
        released_labelling_rdp,
    )
    from dpcore.pate.smooth_sensitivity import smooth_sensitivity
    from dpcore.pate.student import select_student, student_candidates
    from dpcore.pate.teachers import assign_teachers
    from dpcore.privacy.composition import compose
    from dpcore.privacy.events import RenyiDpEvent

    zero_shot = bench.zero_shot_row(name, "test", args.test_size)
    d = bench.dataset(name)
    spec, train = d["spec"], d["train_frame"]
    teachers, shots, repeats = args.pate_teachers, args.pate_shots, args.pate_repeats
    threshold, sigma1, sigma2 = gnmax.default_threshold(teachers), float(spec.pate.sigma1), args.pate_sigma2
    delta = 1.0 / len(train)
    labels = list(spec.labels)
    began = time.perf_counter()
    ids = train["id"].astype(str).tolist()
    texts = dict(zip(ids, train["text"].astype(str), strict=True))
    gold = dict(zip(ids, train["label"].astype(str), strict=True))
    assignment = assign_teachers(ids, teachers, shots, np.random.default_rng(_seed("pate-teachers", name)))
    prompts = [[(texts[i], gold[i]) for i in members] for members in assignment.demos]
    pool, where = public_queries.public_texts(d["loaded"], "iid")
    queries = public_queries.select_queries(pool, args.pate_queries, where)["text"].tolist()
    scores = flock.flock_scores(bench.lm, spec, prompts, queries, labels, calibrate=True,
                                max_rows=args.pate_max_rows)
    histograms = gnmax.vote_histograms(flock.votes(bench.lm, spec, scores, labels, "calibrated"), len(labels))
    flock_seconds = time.perf_counter() - began
    print(f"[pate {name}] flock of {teachers} teachers x {len(queries)} queries scored in {flock_seconds:.0f} s",
          flush=True)
    rng = np.random.default_rng(_seed("pate-gnmax", name))
    repeats_out, total_rdp, masks = [], None, []
    for repeat in range(repeats):
        answers = gnmax.confident_gnmax(histograms, threshold, sigma1, sigma2, rng)
        answered = answers >= 0
        masks.append(answered)
        report = data_dependent_epsilon(histograms, threshold, sigma1, sigma2, delta, answered=answered)
        total_rdp = report.rdp if total_rdp is None else total_rdp + report.rdp
        student_texts = [q for q, a in zip(queries, answered, strict=True) if a]
        noisy = np.asarray([int(a) for a in answers if a >= 0])
        groups = student_candidates(len(student_texts), shots, args.pate_candidates, np.random.default_rng(repeat))
        out = {"repeat": repeat, "answered": int(answered.sum()), "accuracy": None, "calibrated_accuracy": None}
        if groups:
            candidates = [[(student_texts[i], labels[noisy[i]]) for i in g] for g in groups]
            cand_scores = flock.flock_scores(bench.lm, spec, candidates, student_texts, labels, calibrate=True,
                                             max_rows=args.pate_max_rows)
            choice = select_student(flock.votes(bench.lm, spec, cand_scores, labels, "calibrated"), noisy, groups)
            demos = [(student_texts[i], labels[noisy[i]]) for i in choice.members]
            out.update(bench.evaluate(name, "test", args.test_size, "pate", math.inf, demos=demos, shots=shots))
        repeats_out.append(out)
        print(f"[pate {name}] repeat {repeat}: {out}", flush=True)
    try:  # the charge `--accounting data-dependent` makes: the release, its failure and the released bound
        gnss_release = release_parameters(sigma2, len(labels), delta)
        bound = released_labelling_rdp(histograms, masks, teachers=teachers, threshold=threshold, sigma1=sigma1,
                                       sigma2=sigma2, delta=delta, release=gnss_release,
                                       rng=np.random.default_rng(_seed("pate-gnss", name)))
        released = compose([*(s.event for s in release_spends(gnss_release)),
                            labelling_spend(gnss_release, bound).event], delta).epsilon
        # beside it, on the same votes and noise draw: the unshifted estimate R + SS_beta sigma_ss Z (Papernot et
        # al.'s published figure, below R half the time), as an earlier mode charged it
        stacked, mask = np.concatenate([histograms] * repeats), np.concatenate(masks)
        exact = data_dependent_epsilon(stacked, threshold, sigma1, sigma2, delta, orders=[gnss_release.order],
                                       answered=mask).rdp[0]
        ss = smooth_sensitivity(stacked, mask, teachers=teachers, threshold=threshold, sigma1=sigma1, sigma2=sigma2,
                                order=gnss_release.order, beta=gnss_release.beta)
        z = np.random.default_rng(_seed("pate-gnss", name)).standard_normal()
        estimate = max(0.0, exact + ss * gnss_release.sigma_ss * z)
        gnss = {"order": gnss_release.order, "beta": gnss_release.beta, "sigma_ss": gnss_release.sigma_ss,
                "delta0": gnss_release.delta0, "released_rdp": bound, "rdp_data_dependent": float(exact),
                "smooth_sensitivity": ss, "rdp_estimate": estimate,
                "epsilon_estimate": compose([RenyiDpEvent(gnss_release.order, gnss_release.cost + estimate)],
                                            delta).epsilon}
    except Exception as error:  # noqa: BLE001 - the analysis's conditions can fail at these parameters
        released, gnss = f"not applicable: {error}", {}
    if bench.lm.device.type == "cuda":
        torch.cuda.synchronize()
    done = [r for r in repeats_out if r["accuracy"] is not None]
    row = {"phase": "pate", "dataset": name, "teachers": teachers, "shots": shots, "queries": len(queries),
           "repeats": repeats, "threshold": threshold, "sigma1": sigma1, "sigma2": sigma2, "delta": delta,
           "public": where, "student_candidates": args.pate_candidates,
           "epsilon_charged": data_independent_epsilon(sigma1, sigma2, len(queries) * repeats, delta),
           "epsilon_data_dependent": epsilon_from_rdp(report.orders, total_rdp, delta)[0],
           "epsilon_released_bound": released, "gnss": gnss,
           "per_repeat": repeats_out, "n": done[0]["n"] if done else 0,
           "zero_shot": {k: zero_shot[k] for k in ("accuracy", "calibrated_accuracy")},
           "accuracy": float(np.mean([r["accuracy"] for r in done])) if done else None,
           "accuracy_std": float(np.std([r["accuracy"] for r in done])) if done else None,
           "calibrated_accuracy": float(np.mean([r["calibrated_accuracy"] for r in done])) if done else None,
           "calibrated_accuracy_std": float(np.std([r["calibrated_accuracy"] for r in done])) if done else None,
           "flock_seconds": flock_seconds, "seconds": time.perf_counter() - began,
           "scorings": teachers * len(queries)}
    bench._write(row)
    return row


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
    pate = [pate_row(bench, args, name) for name in _names(args.pate_datasets)]
    result.update(recipe=chosen["recipe"], rows=rows, pate=pate, seconds=time.perf_counter() - began)
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
