"""benchmarks/bench_icl.py runs at a tiny size (so it cannot rot) and reports a consistent result."""

from __future__ import annotations

import json

from benchmark_support import run_benchmark


def test_bench_icl_tiny(tmp_path, capsys):
    code = run_benchmark("bench_icl", [
        "--model", "tiny", "--items", "6", "--naive-items", "3", "--batch-size", "4", "--dataset", "trec",
        "--threads", "1", "--out", str(tmp_path / "r.json"), "--json"
    ])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert "ratio cache/naive" in out
    for key in ("ratio", "cache_items_per_s", "naive_items_per_s", "max_abs_diff", "peak_memory_mb"):
        assert key in result
    assert result["items"] == 6 and result["naive_items"] == 3 and result["shots"] == 4
    assert max(result["label_tokens"]) > 1  # TREC's Abbreviation: the multi-token path is exercised
    assert result["max_abs_diff"] < 1e-4
    assert json.loads((tmp_path / "r.json").read_text())["ratio"] == result["ratio"]
