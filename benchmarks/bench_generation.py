"""Benchmark: DP generation, naive reference vs the batched engine, same model/settings/seeds.

    python benchmarks/bench_generation.py [--dataset agnews] [--labels 4] [--shots-per-label 1]
        [--num-subsets 10] [--subset-size 2] [--top-k 100] [--no-rvp] [--max-tokens 40]
        [--naive-max-tokens T] [--noise-multiplier 0.39] [--mechanism gaussian|rnm]
        [--model smollm2-135m | random-smollm2-135m | random-llama-1b | --tiny] [--device auto] [--dtype auto] [--threads N] [--seed 0]
        [--skip-naive] [--profile STEPS] [--out FILE.json] [--json]

Workload (default): Tang et al. Algorithm 1 on AG News, 4 labels x 1 shot, M=10, N=2, RVP
K=100, T_max=40, Poisson sampling, sigma 0.39 (about epsilon 4 at the paper's q and T).

- naive: the reference way: one forward pass per group prompt (and per public prompt) per
  token, batch 1, full logits over the whole prompt, labels one after another.
- engine: `dpcore.fewshot.generation.generate_demos` with `dpcore.lm.batching.BatchedForward` (one
  batched call per step over every active prompt of every label, run as separate passes for
  the public prompts and for each label's group prompts, last position only, shared prefix
  cached per pass, length-bucketed micro-batches).
Both run the same algorithm code with the same per-(label, shot) random streams, so they
generate the same tokens (up to float rounding; `token_agreement` reports it). With
`--naive-max-tokens k < T_max` the naive run stops after k steps and is compared with the
engine's first k steps (same prompts): the ratio is then over those k steps.

Reported: wall seconds, forward (prompt) tokens/s = non-padding prompt tokens served per
second of wall time, synthetic tokens/s, ratio = naive wall / engine wall over the same
steps, model FLOP/s and roofline fraction. Model FLOPs count the work actually computed,
excluding padding: 2 * non-embedding parameters per token run through the layers (a cached
prefix is not run again and not counted), the LM head (2 * hidden * vocabulary) once per
prompt (the last position; naive's full-prompt logits are counted as waste, not useful
work), and causal attention scores and values (4 * layers * heads * head_dim per query-key
pair). The roofline is the best of a few large square matrix products (n = 2048 on CPU,
8192 on GPU) on the same device and dtype, measured in the same run before and after.
`--profile STEPS` also runs the engine for STEPS steps under the torch profiler and prints
where its time goes (operator self time, grouped: matrix products, attention, the rest).
Peak memory: torch.cuda.max_memory_allocated per phase on GPU; on CPU the process's peak
resident set (ru_maxrss, monotone: each phase's value includes the phases before it).
Nothing private is printed: counts, timings and the synthetic demos only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dpcore.fewshot.config import GenerationConfig  # noqa: E402
from dpcore.fewshot.generation import generate_demos  # noqa: E402
from dpcore.lm.batching import BatchedForward  # noqa: E402
from dpcore.names import MECHANISMS  # noqa: E402

# --------------------------------------------------------------------------- measurement helpers


def matmul_roofline(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    """FLOP/s of a large square matrix product on `device` in `dtype` (best of `repeats`)."""
    n = 8192 if device.type == "cuda" else 2048
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    best = 0.0
    with torch.inference_mode():
        a @ b
        for _ in range(repeats):
            _sync(device)
            began = time.perf_counter()
            a @ b
            _sync(device)
            best = max(best, 2 * n**3 / (time.perf_counter() - began))
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class FlopCounter:
    """Useful model FLOPs of forward passes, from prompt lengths and the cached prefix length."""

    def __init__(self, model):
        config = model.config
        self.layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        self.attention_width = heads * head_dim
        self.hidden = int(config.hidden_size)
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        total = sum(p.numel() for p in model.parameters())
        self.body_params = total - model.get_input_embeddings().weight.numel()
        if not getattr(config, "tie_word_embeddings", False):
            self.body_params -= model.get_output_embeddings().weight.numel()
        self.flops = 0.0

    def add(self, lengths, prefix: int = 0) -> None:
        lengths = np.asarray(lengths, dtype=np.float64)
        new = lengths - prefix
        # keys seen by query i (1-based position p) = p: sum over p in (prefix, L]
        pairs = (lengths * (lengths + 1) - prefix * (prefix + 1)) / 2
        self.flops += float(2 * self.body_params * new.sum() + 2 * self.hidden * self.vocab * len(lengths)
                            + 4 * self.layers * self.attention_width * pairs.sum())


class NaiveForward:
    """The reference approach: batch 1, full logits over the whole prompt, one prompt at a time."""

    def __init__(self, lm, counter: FlopCounter):
        self.lm, self.counter = lm, counter
        self.tokens = 0
        self.prompts = 0

    @torch.inference_mode()
    def __call__(self, prompts):
        rows = []
        for prompt in prompts:
            ids = torch.as_tensor([prompt], dtype=torch.long, device=self.lm.device)
            logits = self.lm.model(input_ids=ids, use_cache=False).logits  # [1, L, V]: every position
            rows.append(logits[0, -1].float().cpu())
            self.tokens += len(prompt)
            self.prompts += 1
        self.counter.add([len(p) for p in prompts])
        _sync(self.lm.device)
        return torch.stack(rows)


class CountingEngineForward:
    """The engine's BatchedForward (public prompts and each label in separate passes, as in
    production), recording lengths for the FLOP count."""

    accepts_passes = True

    def __init__(self, lm, counter: FlopCounter):
        self.inner = BatchedForward(lm)
        self.counter = counter
        self.device = lm.device
        self.stats = self.inner.stats

    def __call__(self, prompts, passes=None):
        reused_before = self.inner.stats.prefix_tokens_reused
        out = self.inner(prompts, passes=passes)
        _sync(self.device)
        reused = self.inner.stats.prefix_tokens_reused - reused_before
        self.counter.add([len(p) for p in prompts], prefix=reused // max(1, len(prompts)))
        return out


def _op_group(name: str) -> str:
    if name in {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"}:
        return "matrix products"
    if "scaled_dot_product" in name or "flash" in name or "attention" in name:
        return "attention"
    if name in {"aten::copy_", "aten::cat", "aten::index", "aten::index_put_", "aten::contiguous", "aten::clone",
                "aten::to", "aten::_to_copy", "aten::empty", "aten::expand", "aten::view", "aten::transpose"}:
        return "copies and indexing"
    return "elementwise, norms, activations"


def _kernel_group(name: str) -> str:
    """A CUDA kernel's group, by name (cuBLAS/cuBLASLt GEMMs, flash attention, copies)."""
    lower = name.lower()
    if any(k in lower for k in ("gemm", "nvjet", "cutlass", "xmma", "gemv")):
        return "matrix products"
    if any(k in lower for k in ("flash", "fmha", "sdpa", "attention")):
        return "attention"
    if any(k in lower for k in ("copy", "cat", "index", "gather", "scatter", "memcpy", "memset")):
        return "copies and indexing"
    return "elementwise, norms, activations"


def profile_engine(lm, spec, records, labels, config, sigma, seed, steps: int) -> dict:
    """Engine time by operator over the first `steps` steps (torch profiler): on CPU the operators'
    self time; on CUDA the kernels' device time (and `device_busy` = kernel time / wall time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = lm.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    forward = BatchedForward(lm)
    began = time.perf_counter()
    with profile(activities=activities) as prof:
        generate_demos(lm, spec, records, config.model_copy(update={"max_tokens": steps}), sigma, seed=seed,
                       labels=labels, forward=forward)
    wall = time.perf_counter() - began
    groups: dict[str, float] = {}
    ops = []
    for event in prof.key_averages():
        if cuda:  # kernels only: CPU-side operators would count their kernels a second time
            if event.device_type != DeviceType.CUDA:
                continue
            seconds, group = event.self_device_time_total / 1e6, _kernel_group(event.key)
        else:
            seconds, group = event.self_cpu_time_total / 1e6, _op_group(event.key)
        if seconds <= 0:
            continue
        groups[group] = groups.get(group, 0.0) + seconds
        ops.append((seconds, event.key, event.count))
    ops.sort(reverse=True)
    total = sum(groups.values())
    return {"steps": steps, "wall_seconds": wall, "profiled_seconds": total,
            "device_busy": total / wall if cuda else None,
            "groups": {k: v / total for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top_ops": [{"op": name, "seconds": sec, "calls": calls, "share": sec / total}
                        for sec, name, calls in ops[:12]]}


# --------------------------------------------------------------------------- workload


def load_workload(args):
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    spec = load_task_spec(args.dataset)
    dataset = load_dataset(spec)
    labels = dataset.labels[: args.labels]
    records = {label: dataset.records_for(label) for label in labels}
    return spec, labels, records


def load_model(args):
    from dpcore.lm.model import LanguageModel

    if args.tiny:
        return LanguageModel.tiny_random(seed=0, device="cuda" if args.device == "cuda" else "cpu")
    if args.model.startswith("random-"):  # random weights of a real shape: speed only (GPU, 1B)
        return LanguageModel.random(args.model.removeprefix("random-"), device=args.device, dtype=args.dtype)
    return LanguageModel.load(args.model, args.device, args.dtype)


def run_phase(name, lm, spec, records, labels, config, sigma, seed, forward, sequential):
    """Generate; returns (demos, per-step seconds, wall seconds, peak memory, CPU seconds, wall by phase)."""
    if lm.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(lm.device)
    step_seconds = {}
    phases: dict[str, float] = {}
    cpu_began = _cpu_seconds()
    began = time.perf_counter()
    demos = []
    label_groups = [[label] for label in labels] if sequential else [labels]
    for group in label_groups:
        def progress(info, group=tuple(group)):
            step_seconds.setdefault(info["step"], 0.0)
            # Record-dependent counters (a benchmark's own output, never a run's public files).
            private = info["private"]
            step_seconds[info["step"]] += private["step_seconds"]
            print(f"{name} {','.join(group) if len(group) < 2 else 'all labels'} step {info['step']}/"
                  f"{info['max_steps']}: {private['prompt_tokens']} prompt tokens, {private['step_seconds']:.2f} s",
                  file=sys.stderr, flush=True)
        result = generate_demos(lm, spec, records, config, sigma, seed=seed, labels=list(group), progress=progress,
                                forward=forward)
        demos.extend(result.demos)
        for key in ("tokenize_seconds", "forward_seconds", "mechanism_seconds"):
            phases[key.removesuffix("_seconds")] = phases.get(key.removesuffix("_seconds"), 0.0) + result.private_stats[key]
    wall = time.perf_counter() - began
    if lm.device.type == "cuda":  # the engine prepares prompts a step ahead, in a background thread (overlapped)
        phases["tokenize (background)"] = phases.pop("tokenize")
    phases["other"] = wall - sum(v for k, v in phases.items() if k != "tokenize (background)")
    return demos, step_seconds, wall, peak_memory_mb(lm.device), _cpu_seconds() - cpu_began, phases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="agnews")
    parser.add_argument("--labels", type=int, default=4, help="first L labels of the dataset")
    parser.add_argument("--shots-per-label", type=int, default=1)
    parser.add_argument("--num-subsets", type=int, default=10)
    parser.add_argument("--subset-size", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--no-rvp", dest="rvp", action="store_false")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--naive-max-tokens", type=int, default=None,
                        help="run naive for only this many steps (compared with the engine's first steps)")
    parser.add_argument("--noise-multiplier", type=float, default=0.39, help="sigma (0.39: about epsilon 4)")
    parser.add_argument("--mechanism", choices=list(MECHANISMS), default="gaussian")
    parser.add_argument("--model", default="smollm2-135m",
                        help="a model name, or random-smollm2-135m / random-llama-1b (random weights, speed only)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (tests): --model tiny-random too")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also profile the engine over this many steps and print where the time goes")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON result as the last line")
    args = parser.parse_args(argv)
    args.tiny = args.tiny or args.model == "tiny-random"
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    spec, labels, records = load_workload(args)
    lm = load_model(args)
    config = GenerationConfig(num_subsets=args.num_subsets, subset_size=args.subset_size, top_k=args.top_k,
                              rvp=args.rvp, max_tokens=args.max_tokens, mechanism=args.mechanism,
                              demos_per_label=args.shots_per_label)
    naive_steps = min(args.naive_max_tokens or args.max_tokens, args.max_tokens)
    naive_config = config.model_copy(update={"max_tokens": naive_steps})

    # Warm-up (allocator, thread pool, kernels) outside the timed phases.
    BatchedForward(lm)([lm.encode(spec.generation.build(labels[0], records[labels[0]][:2]))] * 2)
    roofline_before = matmul_roofline(lm.device, lm.dtype)

    engine_counter = FlopCounter(lm.model)
    engine_forward = CountingEngineForward(lm, engine_counter)
    engine_demos, engine_steps, engine_wall, engine_peak, engine_cpu, engine_phases = run_phase(
        "engine", lm, spec, records, labels, config, args.noise_multiplier, args.seed, engine_forward, False)
    engine_stats = engine_forward.stats
    engine_prompt_tokens = engine_stats.tokens + engine_stats.prefix_tokens_reused

    naive = None
    if not args.skip_naive:
        naive_counter = FlopCounter(lm.model)
        naive_forward = NaiveForward(lm, naive_counter)
        naive_demos, naive_steps_s, naive_wall, naive_peak, naive_cpu, _ = run_phase(
            "naive", lm, spec, records, labels, naive_config, args.noise_multiplier, args.seed, naive_forward, True)
        engine_same_steps = sum(s for step, s in engine_steps.items() if step <= naive_steps)
        engine_total_steps = sum(engine_steps.values())
        # Demos agree when naive ran the whole workload; with fewer steps naive's text starts the engine's.
        agree = sum(a.text == b.text if naive_steps == args.max_tokens else b.text.startswith(a.text)
                    for a, b in zip(naive_demos, engine_demos, strict=True))
        naive = {
            "wall_seconds": naive_wall, "steps": naive_steps, "prompt_tokens": naive_forward.tokens,
            "prompts": naive_forward.prompts, "tokens_per_s": naive_forward.tokens / naive_wall,
            "model_flops": naive_counter.flops, "flops_per_s": naive_counter.flops / naive_wall,
            "peak_memory_mb": naive_peak, "cpu_seconds": naive_cpu,
            "engine_cpu_seconds_same_steps": engine_cpu * engine_same_steps / max(engine_total_steps, 1e-9),
            "engine_seconds_same_steps": engine_same_steps * engine_wall
            / max(engine_total_steps, 1e-9), "token_agreement": agree / max(1, len(engine_demos)),
        }
    roofline = max(roofline_before, matmul_roofline(lm.device, lm.dtype))

    synthetic = sum(d.tokens for d in engine_demos)
    engine_flops_per_s = engine_counter.flops / engine_wall
    result = {
        "model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "dataset": args.dataset, "labels": len(labels),
        "shots_per_label": args.shots_per_label, "num_subsets": args.num_subsets, "subset_size": args.subset_size,
        "top_k": args.top_k, "rvp": args.rvp, "max_tokens": args.max_tokens, "noise_multiplier": args.noise_multiplier,
        "mechanism": args.mechanism, "load_average": os.getloadavg()[0],
        "engine_wall_seconds": engine_wall, "engine_cpu_seconds": engine_cpu, "engine_prompt_tokens": engine_prompt_tokens,
        "engine_computed_tokens": engine_stats.tokens, "engine_padded_tokens": engine_stats.padded_tokens,
        "engine_tokens_per_s": engine_prompt_tokens / engine_wall,
        "engine_synthetic_tokens_per_s": synthetic / engine_wall, "engine_model_flops": engine_counter.flops,
        "engine_flops_per_s": engine_flops_per_s, "roofline_flops_per_s": roofline,
        "roofline_fraction": engine_flops_per_s / roofline, "peak_memory_mb": engine_peak,
        "engine_peak_memory_mb": engine_peak, "engine_phase_seconds": engine_phases,
        "engine_layout": "packed" if engine_forward.inner.packed else "padded",
        "engine_attention": "varlen flash" if engine_forward.inner.packed and engine_forward.inner.varlen
        else "per-prompt sdpa" if engine_forward.inner.packed else "padded sdpa",
        "demos": [{"label": d.label, "text": d.text, "tokens": d.tokens, "stop_reason": d.stop_reason}
                  for d in engine_demos],
    }
    if naive is not None:
        result.update({
            "naive_wall_seconds": naive["wall_seconds"], "naive_steps": naive["steps"],
            "naive_tokens_per_s": naive["tokens_per_s"], "naive_flops_per_s": naive["flops_per_s"],
            "naive_roofline_fraction": naive["flops_per_s"] / roofline,
            "naive_peak_memory_mb": naive["peak_memory_mb"], "token_agreement": naive["token_agreement"],
            "engine_seconds_same_steps": naive["engine_seconds_same_steps"],
            "ratio": naive["wall_seconds"] / naive["engine_seconds_same_steps"],
            "ratio_tokens_per_s": (engine_prompt_tokens / engine_wall) / naive["tokens_per_s"],
            "naive_cpu_seconds": naive["cpu_seconds"],
            "ratio_cpu": naive["cpu_seconds"] / max(naive["engine_cpu_seconds_same_steps"], 1e-9),
        })
    if args.profile:
        result["profile"] = profile_engine(lm, spec, records, labels, config, args.noise_multiplier, args.seed,
                                           min(args.profile, args.max_tokens))
    _print_table(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    return 0


def _print_table(r: dict) -> None:
    print(f"DP generation: {r['model']} on {r['device']} ({r['dtype']}, {r['threads']} threads, "
          f"load avg {r['load_average']:.1f}); {r['dataset']} {r['labels']} labels x {r['shots_per_label']} shot, "
          f"M={r['num_subsets']} N={r['subset_size']} K={r['top_k']} RVP={r['rvp']} T_max={r['max_tokens']}; "
          f"engine layout {r['engine_layout']}, attention {r['engine_attention']}")
    print(f"{'impl':<8}{'steps':>6}{'wall s':>10}{'prompt tok/s':>14}{'synth tok/s':>13}{'GFLOP/s':>10}"
          f"{'roofline':>10}{'peak MB':>10}")
    print(f"{'engine':<8}{r['max_tokens']:>6}{r['engine_wall_seconds']:>10.2f}{r['engine_tokens_per_s']:>14.0f}"
          f"{r['engine_synthetic_tokens_per_s']:>13.2f}{r['engine_flops_per_s'] / 1e9:>10.1f}"
          f"{r['roofline_fraction']:>10.1%}{r['engine_peak_memory_mb']:>10.0f}")
    if "ratio" in r:
        print(f"{'naive':<8}{r['naive_steps']:>6}{r['naive_wall_seconds']:>10.2f}{r['naive_tokens_per_s']:>14.0f}"
              f"{'':>13}{r['naive_flops_per_s'] / 1e9:>10.1f}{r['naive_roofline_fraction']:>10.1%}"
              f"{r['naive_peak_memory_mb']:>10.0f}")
        print(f"ratio (naive wall / engine wall over the same {r['naive_steps']} steps): {r['ratio']:.2f}x; "
              f"tokens/s ratio {r['ratio_tokens_per_s']:.2f}x; CPU-time ratio {r['ratio_cpu']:.2f}x; "
              f"demos agreeing: {r['token_agreement']:.0%}")
    print(f"matmul roofline {r['roofline_flops_per_s'] / 1e9:.1f} GFLOP/s; engine "
          f"{r['engine_prompt_tokens']} prompt tokens ({r['engine_computed_tokens']} computed, "
          f"{r['engine_padded_tokens']} with padding)")
    for demo in r["demos"][:3]:
        print(f"  [{demo['label']}] ({demo['tokens']} tokens, {demo['stop_reason']}) {demo['text']}")
    if math.isnan(r["roofline_fraction"]):
        print("warning: roofline not measured")
    if "profile" in r:
        p = r["profile"]
        busy = f", device busy {p['device_busy']:.0%} of {p['wall_seconds']:.2f} s wall" if p.get("device_busy") else ""
        print(f"engine profile ({p['steps']} steps, {p['profiled_seconds']:.2f} s of "
              f"{'kernel' if p.get('device_busy') else 'operator self'} time{busy}): "
              + ", ".join(f"{name} {share:.0%}" for name, share in p["groups"].items()))
        for op in p["top_ops"][:8]:
            print(f"  {op['op'][:60]:<60}{op['seconds']:>8.2f} s{op['share']:>7.1%}{op['calls']:>8} calls")
    phases = r.get("engine_phase_seconds")
    if phases:
        print("engine wall by phase: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))


if __name__ == "__main__":
    sys.exit(main())
