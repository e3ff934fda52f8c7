"""benchmarks/bench_audit.py runs at a tiny size (so it cannot rot) and reports a consistent result."""

from __future__ import annotations

import json

from benchmark_support import run_benchmark


def test_bench_audit_tiny(tmp_path, capsys):
    # TREC (5,000 records): every audit's verbatim check tokenizes its label's members, 16,000 on SST-2
    code = run_benchmark("bench_audit", [
        "--model", "tiny", "--dataset", "trec", "--members", "2", "--trials", "2", "--demo-sets", "3", "--lira", "2",
        "--max-tokens", "3", "--threads", "1", "--out", str(tmp_path / "r.json"), "--json"
    ])
    assert code == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert "default audit / single attack" in out
    rows = {row["attack_set"]: row for row in result["rows"]}
    assert list(rows) == ["duan", "calibrated", "calibrated, next epsilon", "lira (R=2)"]
    assert [rows[name]["attacks"] for name in rows] == [1, 3, 3, 5]
    # the cost in forward passes per scored record: 1, 2 (+ the reference), 1 (references reused), 2 + R
    assert [rows[name]["passes_per_record"] for name in rows] == [1.0, 2.0, 1.0, 4.0]
    assert rows["duan"]["records"] == rows["calibrated"]["records"] == 2 * 2 * 2 * 3
    assert rows["duan"]["scoring_ratio"] == 1.0 and all(r["scoring_seconds"] > 0 for r in rows.values())
    assert result["same_records_and_prompts"] and result["ratio_default_to_duan"] == rows["calibrated"]["ratio"]
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == result["rows"]
