"""benchmarks/bench_dpsgd.py runs at a tiny size (so it cannot rot) and its two paths agree."""

from __future__ import annotations

import json

from benchmark_support import run_benchmark


def test_bench_dpsgd_tiny(tmp_path, capsys):
    code = run_benchmark("bench_dpsgd", [
        "--model", "tiny", "--batch", "6", "--physical-batch-size", "4", "--steps", "1", "--length", "3",
        "--kind", "prefix", "--threads", "1", "--out", str(tmp_path / "r.json"), "--json"
    ])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    for key in ("ratio", "batched_examples_per_s", "naive_examples_per_s", "max_abs_diff", "batched_peak_memory_mb",
                "naive_peak_memory_mb"):
        assert key in result
    assert result["examples"] == 6 and result["kind"] == "prefix"
    assert result["max_abs_diff"] < 1e-5  # the batched per-example path clips and sums what the naive loop does
    assert json.loads((tmp_path / "r.json").read_text())["ratio"] == result["ratio"]
