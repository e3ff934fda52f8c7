"""benchmarks/bench_pate.py runs at a tiny size (so it cannot rot) and its paths agree."""

from __future__ import annotations

import json

from benchmark_support import run_benchmark


def test_bench_pate_tiny(tmp_path, capsys):
    code = run_benchmark("bench_pate", [
        "--model", "tiny", "--dataset", "trec", "--teachers", "3", "--queries", "3", "--naive-teachers",
        "1", "--threads", "1", "--out", str(tmp_path / "r.json"), "--json"
    ])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["scorings"] == 3 * 6 and result["labels"] == 6
    assert result["max_abs_diff_vs_per_prompt"] < 1e-4 and result["max_abs_diff_vs_naive"] < 1e-4
    assert result["flock_scorings_per_s"] > 0 and 0 < result["flock_roofline_fraction"] < 1
