"""benchmarks/bench_accounting.py still runs (tiny size, subprocess) and ends with one JSON object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_accounting_runs_and_reports_json():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_accounting.py"), "--epsilons", "4", "--steps", "10",
         "--json"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert any("cold s" in line for line in lines)  # the human table
    summary = json.loads(lines[-1])
    assert summary["benchmark"] == "accounting.calibrate" and summary["steps"] == 10
    (row,) = summary["rows"]
    assert row["target_epsilon"] == 4.0 and 0 < row["noise_multiplier"] < 1
    assert row["epsilon"] <= 4.0 and row["crosscheck_agreed"]
    assert summary["all_cache_identical"]  # cached vs cold seconds: the benchmark's figures, printed
