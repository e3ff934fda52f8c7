"""Benchmark: PromptPATE flock scoring throughput (teacher-query scorings per second) vs naive loops.

One run, three paths over the same E teacher prompts (k real private records each, drawn in memory;
their text is never printed or written) and Q public queries, every label scored (`dpcore.pate.flock`):

- flock: every teacher's prefix run once (`prefix_cache.StackedPrefixes`), (teacher, query) rows batched
  across teachers (`flock.flock_scores`);
- per-prompt: one `icl.label_logprobs` call per teacher (its own prefix cache, queries batched
  within the teacher only; `flock.flock_scores_naive`);
- naive: one full forward per (teacher, query, label) with no cache (`icl.label_logprobs_naive`),
  timed on the first `--naive-teachers` teachers (its cost per scoring is constant).

Also printed: the model's achieved matmul throughput (2 x non-embedding parameters x tokens / s) as
a fraction of a measured dense-matmul roofline on the same device (a square float32/bf16 matmul).

    python benchmarks/bench_pate.py [--model smollm2-135m|tiny] [--dataset sst2] [--teachers 20]
                                    [--queries 30] [--shots 1] [--naive-teachers 2] [--threads T]
                                    [--device cpu] [--out FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model name, or `tiny` (random tiny Llama)")
    parser.add_argument("--dataset", default="sst2")
    parser.add_argument("--teachers", type=int, default=20)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--shots", type=int, default=1)
    parser.add_argument("--max-rows", type=int, default=64, help="(teacher, query) rows per forward")
    parser.add_argument("--naive-teachers", type=int, default=2, help="teachers scored by the naive loop")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    return parser.parse_args(argv)


def matmul_roofline(device, dtype, size: int = 2048, repeats: int = 5) -> float:
    """Measured dense-matmul FLOP/s on this device (the best of a few square matmuls)."""
    import torch

    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - began)
    return 2.0 * size ** 3 / best


def _timed(lm, work):
    lm.stats.tokens, lm.stats.seconds, lm.stats.forward_calls = 0, 0.0, 0
    began = time.perf_counter()
    result = work()
    return result, time.perf_counter() - began, lm.stats.tokens


def run(args) -> dict:
    import numpy as np
    import torch

    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec
    from dpcore.lm import icl
    from dpcore.lm.model import LanguageModel
    from dpcore.pate import flock
    from dpcore.pate.teachers import assign_teachers

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = LanguageModel.tiny_random(seed=0) if args.model == "tiny" else LanguageModel.load(args.model,
                                                                                            device=args.device)
    spec = load_task_spec(args.dataset)
    data = load_dataset(spec)
    labels = spec.label_names
    train = data.train.set_index("id")
    teachers = assign_teachers(train.index.tolist(), args.teachers, args.shots, np.random.default_rng(0))
    prompts = [[(train.at[r, "text"], train.at[r, "label"]) for r in demos] for demos in teachers.demos]
    queries = data.public["text"].head(args.queries).tolist() if len(data.public) else \
        data.test["text"].head(args.queries).tolist()

    flock.flock_scores(lm, spec, prompts[:2], queries[:2], labels)  # warm-up (allocator, kernels), not timed
    fast, fast_s, fast_tokens = _timed(lm, lambda: flock.flock_scores(lm, spec, prompts, queries, labels,
                                                                       max_rows=args.max_rows))
    per_prompt, per_s, per_tokens = _timed(lm, lambda: flock.flock_scores_naive(lm, spec, prompts, queries, labels))
    n_naive = max(1, min(args.naive_teachers, len(prompts)))
    naive_items = queries + list(icl.CONTENT_FREE_INPUTS)
    naive, naive_s, naive_tokens = _timed(lm, lambda: np.stack([
        icl.label_logprobs_naive(lm, spec, demos, naive_items, labels) for demos in prompts[:n_naive]]))
    both = np.concatenate([fast.logprobs, fast.content_free], axis=1)
    scorings = len(prompts) * len(naive_items)
    naive_scorings = n_naive * len(naive_items)
    params = lm.num_parameters(include_embeddings=False)
    roofline = matmul_roofline(lm.device, lm.dtype)
    result = {
        "model": lm.name, "dataset": args.dataset, "teachers": len(prompts), "queries": len(queries),
        "shots": args.shots, "labels": len(labels), "device": str(lm.device), "threads": torch.get_num_threads(),
        "scorings": scorings,
        "flock_scorings_per_s": scorings / fast_s, "flock_seconds": fast_s,
        "per_prompt_scorings_per_s": scorings / per_s, "per_prompt_seconds": per_s,
        "naive_scorings_per_s": naive_scorings / naive_s, "naive_seconds": naive_s, "naive_teachers": n_naive,
        "speedup_vs_naive": (scorings / fast_s) / (naive_scorings / naive_s),
        "speedup_vs_per_prompt": per_s / fast_s,
        "max_abs_diff_vs_per_prompt": float(np.abs(both - per_prompt).max()),
        "max_abs_diff_vs_naive": float(np.abs(both[:n_naive] - naive).max()),
        "flock_tokens": fast_tokens, "per_prompt_tokens": per_tokens, "naive_tokens": naive_tokens,
        "matmul_roofline_flops": roofline,
        "flock_roofline_fraction": 2.0 * params * fast_tokens / fast_s / roofline,
        "naive_roofline_fraction": 2.0 * params * naive_tokens / naive_s / roofline,
    }
    return result


def main(argv=None) -> int:
    args = _parse(argv)
    result = run(args)
    print(f"PromptPATE flock scoring: {result['teachers']} teachers x {result['queries']} queries (+3 content-free) "
          f"x {result['labels']} labels on {result['model']} ({result['device']}, {result['threads']} threads)")
    print(f"  flock (prefixes cached once, queries batched across teachers): "
          f"{result['flock_scorings_per_s']:.1f} scorings/s ({result['flock_seconds']:.1f} s)")
    print(f"  per-prompt (icl.label_logprobs per teacher):                  "
          f"{result['per_prompt_scorings_per_s']:.1f} scorings/s ({result['per_prompt_seconds']:.1f} s)")
    print(f"  naive (a full forward per teacher, query and label):          "
          f"{result['naive_scorings_per_s']:.1f} scorings/s (on {result['naive_teachers']} teachers)")
    print(f"  speed-up vs naive {result['speedup_vs_naive']:.1f}x, vs per-prompt "
          f"{result['speedup_vs_per_prompt']:.2f}x; max |diff| {result['max_abs_diff_vs_per_prompt']:.2e}")
    print(f"  matmul roofline {result['matmul_roofline_flops'] / 1e9:.1f} GFLOP/s: flock at "
          f"{100 * result['flock_roofline_fraction']:.1f}%, naive at {100 * result['naive_roofline_fraction']:.1f}%")
    out = Path(args.out) if args.out else None
    if out is None:
        from dpcore.home import subdir

        out = subdir("benchmarks") / "bench_pate.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
