"""benchmarks/bench_dpsgd.py runs at a tiny size (so it cannot rot) and its two paths agree."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_dpsgd.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_dpsgd", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_dpsgd_tiny(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        code = _load().main(["--model", "tiny", "--batch", "6", "--physical-batch-size", "4", "--steps", "1",
                             "--length", "3", "--kind", "prefix", "--threads", "1", "--out", str(tmp_path / "r.json"),
                             "--json"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    for key in ("ratio", "batched_examples_per_s", "naive_examples_per_s", "max_abs_diff", "batched_peak_memory_mb",
                "naive_peak_memory_mb"):
        assert key in result
    assert result["examples"] == 6 and result["kind"] == "prefix"
    assert result["max_abs_diff"] < 1e-5  # the batched per-example path clips and sums what the naive loop does
    assert json.loads((tmp_path / "r.json").read_text())["ratio"] == result["ratio"]
