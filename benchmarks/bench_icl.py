"""Benchmark: ICL evaluation throughput with the shared-prefix KV cache vs naive.

Both paths score the same test items against every label of the task with the same
demonstrations and tokens (`dpcore.lm.icl.label_logprobs` vs `label_logprobs_naive`):

- cache: the prompt prefix (instruction + demos) runs once; each batch of items runs its
  query tokens on the expanded cache, and multi-token labels continue from the cache
  after the query;
- naive: one full forward (batch 1) per item and label.

Default workload: the embedded model, AG News, 4 random real demos (one per label,
drawn from the private split in memory; their text is never printed or written), 100
test items. `--naive-items N` scores only the first N items naively (the naive cost per
item is constant, so items/s is comparable) when the full naive run would take too long.

    python benchmarks/bench_icl.py [--model smollm2-135m|tiny] [--dataset agnews] [--items 100]
                                   [--shots 4] [--batch-size 16] [--naive-items N] [--threads T]
                                   [--device cpu] [--out FILE] [--json]

With --json the last line printed is one JSON object (ratio, cache_items_per_s, naive_items_per_s,
max_abs_diff, ...). The same object is written to --out (default
$DPICL_HOME/benchmarks/bench_icl.json).
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (a `benchmarks` package may be installed)

from benchlib import load, model_parser, report  # noqa: E402


def _parse(argv):
    parser = model_parser(__doc__.split("\n\n")[0], dataset="agnews")
    parser.add_argument("--items", type=int, default=100, help="test items scored by the cached path")
    parser.add_argument("--naive-items", type=int, default=None, help="items scored naively (default: --items)")
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="demo choice")
    return parser.parse_args(argv)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run(args) -> dict:
    import numpy as np
    import torch

    from dpcore.lm import icl

    spec, dataset, lm = load(args)
    rng = np.random.default_rng(args.seed)
    pool = []  # private records in memory only: a few per label
    for label in spec.label_names:
        records = dataset.records_for(label)
        pool += [(records[int(i)], label) for i in rng.choice(len(records), size=min(4, len(records)), replace=False)]
    demos = icl.choose_demos(pool, spec.label_names, args.shots, args.seed)
    queries = icl.select_test(dataset.test, args.items)["text"].tolist()
    naive_items = min(args.naive_items or args.items, len(queries))

    icl.label_logprobs(lm, spec, demos, queries[:2], batch_size=args.batch_size)  # warm-up
    began = time.perf_counter()
    cached = icl.label_logprobs(lm, spec, demos, queries, batch_size=args.batch_size)
    cache_seconds = time.perf_counter() - began
    began = time.perf_counter()
    naive = icl.label_logprobs_naive(lm, spec, demos, queries[:naive_items])
    naive_seconds = time.perf_counter() - began

    cache_rate = len(queries) / cache_seconds
    naive_rate = naive_items / naive_seconds
    label_tokens = [len(lm.encode(" " + spec.verbalizer(label))) for label in spec.label_names]
    return {
        "benchmark": "icl", "model": lm.name, "device": str(lm.device), "threads": torch.get_num_threads(),
        "dataset": spec.name, "shots": len(demos), "labels": len(spec.label_names), "label_tokens": label_tokens,
        "prefix_tokens": len(lm.encode(icl.prefix_text(spec, demos))), "batch_size": args.batch_size,
        "items": len(queries), "naive_items": naive_items,
        "cache_seconds": cache_seconds, "naive_seconds": naive_seconds,
        "cache_items_per_s": cache_rate, "naive_items_per_s": naive_rate, "ratio": cache_rate / naive_rate,
        "cache_seconds_per_100_items": 100.0 / cache_rate, "naive_seconds_per_100_items": 100.0 / naive_rate,
        "max_abs_diff": float(np.abs(cached[:naive_items] - naive).max()),
        "peak_memory_mb": _peak_rss_mb(),
    }


def format_table(result: dict) -> str:
    lines = [
        f"ICL scoring: {result['dataset']}, {result['shots']} demos ({result['prefix_tokens']} prefix tokens), "
        f"{result['labels']} labels, model {result['model']} on {result['device']} ({result['threads']} threads)",
        f"{'path':<8} {'items':>6} {'seconds':>9} {'items/s':>9} {'s/100 items':>12}",
        f"{'cache':<8} {result['items']:>6} {result['cache_seconds']:>9.2f} {result['cache_items_per_s']:>9.2f} "
        f"{result['cache_seconds_per_100_items']:>12.2f}",
        f"{'naive':<8} {result['naive_items']:>6} {result['naive_seconds']:>9.2f} {result['naive_items_per_s']:>9.2f} "
        f"{result['naive_seconds_per_100_items']:>12.2f}",
        f"ratio cache/naive: {result['ratio']:.1f}x   max |cache - naive| log-prob: {result['max_abs_diff']:.2e}   "
        f"peak RSS {result['peak_memory_mb']:.0f} MB",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(argv)
    result = run(args)
    return report(result, format_table(result), "bench_icl", args.out, args.json)


if __name__ == "__main__":
    sys.exit(main())
