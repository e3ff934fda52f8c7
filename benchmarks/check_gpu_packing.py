"""GPU check: the packed varlen flash-attention forward equals one prompt at a time.

    python benchmarks/check_gpu_packing.py [--model random-llama-1b] [--prompts 48] [--json]

On CUDA `BatchedForward` packs a step's prompts into one row and runs attention as ONE
variable-length flash-attention call (`torch.nn.attention.varlen`), keys laid out as [cached
prefix, prompt]. CI has no GPU, so tests check that layout on CPU against a reference of the
kernel; this script checks the kernel itself: next-token distributions of AG News group
prompts (the shared instruction prefix cached) computed

  - one prompt at a time (batch 1, no padding, the model's own sdpa attention),
  - left-padded micro-batches (the fallback layout),
  - packed with varlen flash attention (the CUDA default), and
  - packed with per-prompt sdpa (the CPU path), in the same dtype,

and reports the largest probability difference to the one-at-a-time result and how often
the arg max and the top-100 set agree. In bf16 every layout differs from batch 1 by rounding
(different kernels, different reduction orders); the check passes when packed varlen's largest
logit difference is no more than twice the padded layout's (+ 1e-3 logit std), and, in fp32
(per-prompt sdpa), within 1e-4. Exit code 1 on failure. Random weights of a real shape (no download).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dpcore.data.datasets import load_dataset  # noqa: E402
from dpcore.data.taskspec import load_task_spec  # noqa: E402
from dpcore.lm.batching import BatchedForward  # noqa: E402
from dpcore.lm.model import LanguageModel  # noqa: E402


def compare(reference: torch.Tensor, other: torch.Tensor, top_k: int = 100) -> dict:
    p, q = torch.softmax(reference, -1), torch.softmax(other, -1)
    top_ref = torch.topk(reference, top_k, dim=-1).indices
    top_other = torch.topk(other, top_k, dim=-1).indices
    overlap = [len(set(a.tolist()) & set(b.tolist())) / top_k for a, b in zip(top_ref, top_other, strict=True)]
    return {"max_abs_prob_diff": float((p - q).abs().max()),
            "max_abs_logit_diff": float((reference - other).abs().max()),
            "argmax_agreement": float((reference.argmax(-1) == other.argmax(-1)).float().mean()),
            "top100_overlap": float(sum(overlap) / len(overlap))}


def check(shape: str, dtype: str, prompts_wanted: int) -> dict:
    lm = LanguageModel.random(shape, device="cuda", dtype=dtype)
    spec = load_task_spec("agnews")
    dataset = load_dataset(spec)
    prompts = []
    for i in range(prompts_wanted):
        label = dataset.labels[i % len(dataset.labels)]
        records = dataset.records_for(label)
        group = [records[(7 * i + j) % len(records)] for j in range(i % 3)]  # 0, 1 or 2 records
        prompts.append(lm.encode(spec.generation.build(label, group)) + lm.encode(" generated so far")[: i % 4])
    single = torch.cat([lm.next_token_logits([p]) for p in prompts])
    result = {"model": lm.name, "dtype": str(lm.dtype).replace("torch.", ""), "prompts": len(prompts),
              "prompt_tokens": sum(map(len, prompts)), "logit_std": float(single.std())}
    layouts = {"padded": {"packed": False}, "packed_sdpa": {"packed": True, "varlen": False}}
    if lm.dtype != torch.float32:
        layouts["packed_varlen"] = {"packed": True, "varlen": True}
    for name, kwargs in layouts.items():
        forward = BatchedForward(lm, **kwargs)
        logits = forward(prompts)
        result[name] = compare(single, logits) | {"prefix_tokens_reused": forward.stats.prefix_tokens_reused,
                                                  "padded_tokens": forward.stats.padded_tokens,
                                                  "tokens": forward.stats.tokens}
    if lm.dtype == torch.float32:
        result["passed"] = result["packed_sdpa"]["max_abs_logit_diff"] <= 1e-4 * max(1.0, result["logit_std"])
    else:
        limit = 2 * result["padded"]["max_abs_logit_diff"] + 1e-3 * result["logit_std"]
        result["passed"] = result["packed_varlen"]["max_abs_logit_diff"] <= limit
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random-llama-1b", help="random-llama-1b or random-smollm2-135m")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check (the CPU layout is covered by tests/test_generation.py)")
        return 0
    shape = args.model.removeprefix("random-")
    results = [check(shape, "bf16", args.prompts), check(shape, "fp32", args.prompts)]
    for r in results:
        print(f"{r['model']} {r['dtype']}: {r['prompts']} prompts, {r['prompt_tokens']} tokens; "
              f"{'PASS' if r['passed'] else 'FAIL'}")
        for name in ("padded", "packed_sdpa", "packed_varlen"):
            if name in r:
                c = r[name]
                print(f"  {name:<14} max |dlogit| {c['max_abs_logit_diff']:.2e} (logit std {r['logit_std']:.2e})"
                      f"  max |dp| {c['max_abs_prob_diff']:.2e}  argmax agree {c['argmax_agreement']:.0%}"
                      f"  top-100 overlap {c['top100_overlap']:.1%}  computed {c['padded_tokens']} "
                      f"({c['tokens']} real, prefix reused {c['prefix_tokens_reused']})")
    if args.json:
        print(json.dumps(results))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
