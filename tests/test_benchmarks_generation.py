"""benchmarks/bench_generation.py runs end to end at a tiny size (so it cannot rot)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_generation.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_generation", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_generation_tiny(bench, capsys, tmp_path):
    out = tmp_path / "bench.json"
    code = bench.main(["--model", "tiny-random", "--labels", "2", "--num-subsets", "2", "--subset-size", "1",
                       "--top-k", "10", "--max-tokens", "3", "--naive-max-tokens", "2", "--threads", "1",
                       "--profile", "2", "--json", "--out", str(out)])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    for key in ("ratio", "engine_tokens_per_s", "naive_tokens_per_s", "roofline_fraction", "peak_memory_mb"):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert result["naive_steps"] == 2 and result["max_tokens"] == 3
    assert result["token_agreement"] == 1.0  # same seeds, same algorithm: same tokens
    assert 0 < result["roofline_fraction"] < 1.5
    assert json.loads(out.read_text())["ratio"] == result["ratio"]
    profile = result["profile"]
    assert profile["steps"] == 2 and abs(sum(profile["groups"].values()) - 1) < 1e-6
    assert profile["top_ops"] and "matrix products" in profile["groups"]


def test_flop_counter_counts_prefix_reuse(bench, tiny_lm):
    counter = bench.FlopCounter(tiny_lm.model)
    counter.add([10, 20])
    full = counter.flops
    counter.flops = 0.0
    counter.add([10, 20], prefix=5)
    assert 0 < counter.flops < full
    body = counter.body_params
    assert body == tiny_lm.num_parameters()  # tied embeddings: the head is counted per last position


def test_engine_phases_are_reported(bench, capsys):
    assert bench.main(["--model", "tiny-random", "--labels", "1", "--num-subsets", "2", "--subset-size", "1",
                       "--top-k", "10", "--max-tokens", "2", "--skip-naive", "--threads", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    phases = result["engine_phase_seconds"]
    assert {"tokenize", "forward", "mechanism", "other"} <= set(phases)
    assert abs(sum(phases.values()) - result["engine_wall_seconds"]) < 1e-6
    assert result["engine_layout"] == "packed" and result["engine_attention"] == "per-prompt sdpa"


def test_kernel_groups_name_gemm_attention_and_copies(bench):
    assert bench._kernel_group("nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_TNT") == "matrix products"
    assert bench._kernel_group("void pytorch_flash::flash_fwd_kernel<...>") == "attention"
    assert bench._kernel_group("Memcpy DtoH (Device -> Pageable)") == "copies and indexing"
    assert bench._kernel_group("void at::native::vectorized_elementwise_kernel<8>") == \
        "elementwise, norms, activations"


def test_gpu_packing_check_compares_and_skips_without_cuda(capsys):
    spec = importlib.util.spec_from_file_location("check_gpu_packing", BENCH.parent / "check_gpu_packing.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    import torch

    reference = torch.randn(3, 200, generator=torch.Generator().manual_seed(0))
    same = check.compare(reference, reference.clone())
    assert same["max_abs_logit_diff"] == 0 and same["argmax_agreement"] == 1 and same["top100_overlap"] == 1
    moved = check.compare(reference, reference + torch.eye(3, 200) * 100)
    assert moved["argmax_agreement"] == 0 and moved["max_abs_logit_diff"] == 100
    if not torch.cuda.is_available():
        assert check.main([]) == 0 and "no CUDA device" in capsys.readouterr().out
