"""Benchmark: PromptDPSGD training throughput, batched exact per-example gradients vs a naive loop.

Both paths run the same DP-SGD steps (Duan et al. App. C.1 Algorithm 1 lines 5-8) on the same
examples with the same prompt:

- batched: `dpcore.dpsgd.soft_prompt.per_example_gradients` (one forward and one backward per physical
  chunk yield every example's gradient w.r.t. the prompt) and Opacus' DPOptimizer (clip, noise, AdamW);
- naive: one forward and one backward per example (batch 1), each gradient clipped by hand and summed,
  then the same noise and update.

With sigma = 0 both produce the same clipped sum, whose largest difference is reported
(`max_abs_diff`). Default workload: the embedded model, SST-2 records from the private split (in
memory only; their text is never printed or written), a soft prompt of length 10, 32 examples per
step, 2 steps. Peak memory: the largest resident-set growth above the phase's start (sampled every
5 ms; CPU; the naive loop runs first, right after the model loads, so the batched path's growth is what
it needs beyond the naive loop's peak) or `torch.cuda.max_memory_allocated` above the phase's start (CUDA).
On a CPU shared with other jobs the two phases see different loads: repeat the run before trusting a ratio.

    python benchmarks/bench_dpsgd.py [--model smollm2-135m|tiny] [--kind soft-prompt|prefix] [--length 10]
                                     [--batch 32] [--physical-batch-size 16] [--steps 2] [--threads T]
                                     [--device cpu] [--dtype auto] [--out FILE] [--json]

With --json the last line printed is one JSON object (ratio, batched_examples_per_s,
naive_examples_per_s, max_abs_diff, peak memory of each path, ...), also written to --out (default
$DPICL_HOME/benchmarks/bench_dpsgd.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (a `benchmarks` package may be installed)

from benchlib import PeakMemory  # noqa: E402


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model name, or `tiny` (random tiny Llama)")
    parser.add_argument("--dataset", default="sst2")
    parser.add_argument("--kind", default="soft-prompt", choices=["soft-prompt", "prefix"])
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32, help="examples per DP-SGD step")
    parser.add_argument("--physical-batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def _naive_step(lm, prompt, examples, clip, optimizer_step):
    """Algorithm 1 lines 5-7 one example at a time: backward, clip, sum (the noise and update follow)."""
    import torch

    from dpcore.dpsgd import soft_prompt as sp

    total = torch.zeros_like(prompt.weight)
    with sp.frozen(lm.model):
        for example in examples:
            prompt.weight.grad = None
            loss = -sp.example_logprobs(lm, prompt.kind, prompt.weight.unsqueeze(0), [example])[0]
            loss.backward()
            grad = prompt.weight.grad.detach()
            total += grad / max(1.0, float(grad.norm()) / clip)
    optimizer_step(total)
    return total


def run(args) -> dict:
    import torch

    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec
    from dpcore.dpsgd import soft_prompt as sp
    from dpcore.dpsgd import training as dpsgd
    from dpcore.lm.model import LanguageModel

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = (LanguageModel.tiny_random(seed=0, device=args.device) if args.model == "tiny"
          else LanguageModel.load(args.model, device=args.device, dtype=args.dtype))
    spec = load_task_spec(args.dataset)
    data = load_dataset(spec)
    rows = data.train.sample(n=args.batch * args.steps, random_state=0)
    examples = sp.encode_examples(lm, spec, rows["text"].astype(str).tolist(), rows["label"].astype(str).tolist())
    batches = [sorted(examples[i * args.batch:(i + 1) * args.batch], key=lambda e: len(e.context))
               for i in range(args.steps)]  # similar lengths share a chunk, as in dpcore.dpsgd.training.train
    clip, sigma = 0.1, 1.0
    init = sp.init_prompt(lm, args.kind, args.length, "vocab", torch.Generator().manual_seed(0)).weight.detach()

    def synced():
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    # naive DP-SGD steps: same noise and update (AdamW on the noisy mean)
    prompt = sp.TrainablePrompt(args.kind, init)
    adamw = torch.optim.AdamW([prompt.weight], lr=0.005, weight_decay=0.0)
    noise = torch.Generator(device=lm.device).manual_seed(1)

    def update(total):
        prompt.weight.grad = (total + torch.normal(0.0, sigma * clip, total.shape, generator=noise,
                                                   device=total.device)) / args.batch
        adamw.step()

    with PeakMemory(lm.device) as naive_memory:
        began = synced()
        for batch in batches:
            _naive_step(lm, prompt, batch, clip, update)
        naive_seconds = synced() - began

    # batched DP-SGD steps
    prompt = sp.TrainablePrompt(args.kind, init)
    optimizer = dpsgd.dp_optimizer(prompt, sigma, clip, args.batch, 0.005,
                                   torch.Generator(device=lm.device).manual_seed(1))
    with PeakMemory(lm.device) as batched_memory:
        began = synced()
        for batch in batches:
            chunks = [sp.per_example_gradients(lm, prompt, batch[i:i + args.physical_batch_size])[0]
                      for i in range(0, len(batch), args.physical_batch_size)]
            dpsgd.private_step(optimizer, prompt, chunks)
        batched_seconds = synced() - began

    # agreement (sigma = 0): the batched and naive clipped sums of the first batch
    prompt = sp.TrainablePrompt(args.kind, init)
    optimizer = dpsgd.dp_optimizer(prompt, 0.0, clip, 1.0, 0.0, torch.Generator(device=lm.device).manual_seed(0))
    chunks = [sp.per_example_gradients(lm, prompt, batches[0][i:i + args.physical_batch_size])[0]
              for i in range(0, args.batch, args.physical_batch_size)]
    dpsgd.private_step(optimizer, prompt, chunks)
    batched_sum = prompt.weight.grad.detach().clone()
    naive_sum = _naive_step(lm, sp.TrainablePrompt(args.kind, init), batches[0], clip, lambda total: None)
    max_abs_diff = float((batched_sum - naive_sum).abs().max())

    total = args.batch * args.steps
    return {
        "model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "kind": args.kind, "length": args.length,
        "trainable_parameters": int(init.numel()), "batch": args.batch, "steps": args.steps,
        "physical_batch_size": args.physical_batch_size, "examples": total,
        "batched_seconds": batched_seconds, "naive_seconds": naive_seconds,
        "batched_examples_per_s": total / batched_seconds, "naive_examples_per_s": total / naive_seconds,
        "ratio": naive_seconds / batched_seconds, "max_abs_diff": max_abs_diff,
        "batched_peak_memory_mb": batched_memory.peak_mb, "naive_peak_memory_mb": naive_memory.peak_mb,
    }


def main(argv=None) -> int:
    from dpcore.home import configure_environment, subdir

    configure_environment()
    args = _parse(argv)
    result = run(args)
    print(f"PromptDPSGD {result['kind']} (length {result['length']}, {result['trainable_parameters']} parameters) "
          f"on {result['model']} ({result['device']}, {result['dtype']}, {result['threads']} threads): "
          f"{result['steps']} steps of {result['batch']} examples")
    print(f"batched per-example gradients: {result['batched_examples_per_s']:.1f} examples/s, "
          f"peak +{result['batched_peak_memory_mb']:.0f} MB")
    print(f"naive one-example loop:        {result['naive_examples_per_s']:.1f} examples/s, "
          f"peak +{result['naive_peak_memory_mb']:.0f} MB")
    print(f"ratio batched/naive: {result['ratio']:.2f}x; clipped sums agree to {result['max_abs_diff']:.2e}")
    out = Path(args.out) if args.out else subdir("benchmarks") / "bench_dpsgd.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
