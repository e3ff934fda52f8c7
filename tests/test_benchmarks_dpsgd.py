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


def test_utility_chooses_on_the_public_split_and_tables_the_test_split(tmp_path, capsys):
    code = run_benchmark("utility", [
        "--model", "tiny", "--datasets", "trec", "--epsilons", "2,inf", "--spread", "trec:2:2", "--test-size", "6",
        "--set", "batch_size=4", "--set", "validation_size=2", "--examples", "8", "--grid", "lr=0.01,0.3",
        "--sweep-datasets", "trec", "--sweep-size", "5", "--threads", "1", "--out-dir", str(tmp_path), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sweep = result["sweep"]
    assert {r["split"] for r in sweep} == {"public"} and len(sweep) == 2  # choosing never reads the test split
    assert {json.dumps(r["grid"]) for r in sweep} == {'{"lr": 0.01}', '{"lr": 0.3}'}
    best = max(sweep, key=lambda r: r[result["chosen_scoring"]])
    assert result["chosen"]["grid"] == best["grid"] and result["recipe"]["lr"] == best["grid"]["lr"]
    table = [r for r in result["rows"] if r["phase"] == "table"]
    assert {r["split"] for r in table} == {"test"} and len(table) == 3  # two trainings at 2, one at inf
    assert all(r["steps"] == 2 and r["batch_size"] == 4 and r["seeded_noise"] for r in table)  # T = 8 / 4
    assert [r["noise_multiplier"] > 0 for r in table] == [True, True, False]
    rows = [json.loads(line) for line in (tmp_path / "utility_rows.jsonl").read_text().splitlines()]
    assert len(rows) == len(sweep) + len(table) + 2  # streamed as they finished, zero-shot rows included


def test_utility_trains_an_adapter_and_tables_promptpate(tmp_path, capsys):
    from dpcore.dpsgd.training import KIND_PRESETS
    from dpcore.pate.privacy import data_independent_epsilon

    code = run_benchmark("utility", [
        "--model", "tiny", "--datasets", "sst2", "--epsilons", "8", "--spread=", "--test-size", "6",
        "--set", "kind=lora", "--set", "batch_size=4", "--set", "steps=1", "--set", "validation_size=2",
        "--pate-datasets", "sst2", "--pate-teachers", "4", "--pate-queries", "6", "--pate-repeats", "2",
        "--pate-candidates", "2", "--threads", "1", "--out-dir", str(tmp_path), "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (lora,) = [r for r in result["rows"] if r["phase"] == "table"]
    assert lora["recipe"]["kind"] == "lora" and lora["recipe"]["lr"] == KIND_PRESETS["lora"]["cpu"]["lr"]
    assert lora["n"] == 6 and lora["noise_multiplier"] > 0
    (pate,) = result["pate"]
    assert (pate["teachers"], pate["queries"], pate["repeats"], pate["threshold"]) == (4, 6, 2, 4.0)
    # the charged epsilon is the ledger's data-independent bound for every query of every repeat
    assert pate["epsilon_charged"] == data_independent_epsilon(pate["sigma1"], pate["sigma2"], 12, pate["delta"])
    assert pate["epsilon_data_dependent"] > 0 and len(pate["per_repeat"]) == 2
    assert all(0 <= r["answered"] <= 6 for r in pate["per_repeat"])
    assert set(pate["zero_shot"]) == {"accuracy", "calibrated_accuracy"}
