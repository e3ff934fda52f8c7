"""`benchmarks/reproduce_tables.py`: the papers' tables as a grid of `dpicl` commands.

The dry run lists every cell with its exact command (each on the ledger id `<dataset>-tables`); one tiny
cell (DP few-shot generation on the tiny random model and the mini AG News file) runs in a subprocess,
fills tables.md and the plot, and a second run skips it; a failed cell leaves no JSON, so the next run
retries it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from pipeline_support import mini_agnews

from dpcore.privacy.ledger import Ledger

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "reproduce_tables.py"


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("reproduce_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reproduce_tables"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_lists_every_cell_and_its_command(tables, capsys, dpicl_home):
    assert tables.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # per dataset: one DP few-shot generation run, PromptPATE IID and OOD, 2 kinds x 3 epsilons of PromptDPSGD and
    # its two fine-tuning baselines at epsilon 8
    assert len(lines) == 3 * (1 + 2 + 6 + 2)
    by_name = {line.split(": ", 1)[0].split("] ", 1)[1]: line.split(": ", 1)[1] for line in lines}
    tang = by_name["tang-trec"]
    # Tang Table 1's epsilons and Duan Table 1's 3, for the PromptDPSGD table's DP few-shot column
    assert tang.startswith("dpicl run --json --methods tang --epsilons 1,2,3,4,8 "
                           "--baselines zero-shot,instruction-only,sigma-zero,random-real")
    assert "--seeds 3 " in tang
    assert "--dataset trec --dataset-id trec-tables" in tang and "--test-size 100 " in tang + " "
    assert "--public iid" in by_name["pate-iid-sst2"] and "ensemble,upper-bound" in by_name["pate-iid-sst2"]
    assert "--public ood" in by_name["pate-ood-agnews"] and "--teachers 20" in by_name["pate-ood-agnews"]
    assert "--sigma2 2" in by_name["pate-ood-agnews"]
    assert by_name["dpsgd-prefix-epsinf-sst2"].startswith("dpicl tune --json")
    assert ("--kind prefix --epsilon inf --preset cpu --steps 20 --validation-size 32 --seeds 3 "
            in by_name["dpsgd-prefix-epsinf-sst2"])
    assert "--kind lora --epsilon 8 --preset cpu" in by_name["dpsgd-lora-eps8-trec"]
    assert "--kind full --epsilon 8 --preset cpu" in by_name["dpsgd-full-eps8-agnews"]
    assert "--repeats 2 " in by_name["pate-iid-trec"]
    assert all(f"--dataset-id {name.rsplit('-', 1)[1]}-tables" in command for name, command in by_name.items())
    assert not (dpicl_home / "benchmarks" / "tables").exists()  # a dry run writes nothing

    assert tables.main(["--dry-run", "--full", "--datasets", "trec", "--tables", "tang,pate",
                        "--extra-args=--device cuda"]) == 0
    full = capsys.readouterr().out
    assert "--num-subsets 80 --subset-size 1 --no-rvp --max-tokens 15" in full  # Tang et al. Table 9, TREC
    assert "--teachers 200" in full and "--queries 492" in full and "--test-size" not in full
    assert full.count("--device cuda") == 3


def test_a_cell_runs_once_and_a_rerun_skips_it(tables, capsys, dpicl_home, tmp_path):
    data_path, spec_path, _, _ = mini_agnews()
    argv = ["--datasets", "agnews-mini", "--tables", "tang", "--model", "tiny-random", "--test-size", "6",
            "--seeds", "1", "--out", str(tmp_path),
            f"--extra-args=--task-spec {spec_path} --data-path {data_path} --num-subsets 2 --subset-size 1 "
            "--top-k 20 --max-tokens 4"]
    before = len(Ledger().entries("agnews-mini"))  # other tests of the session may have charged it
    assert tables.main(argv) == 0
    out = capsys.readouterr().out
    assert "[1/1] tang-agnews-mini: running dpicl run --json --methods tang" in out
    assert "[1/1] tang-agnews-mini: done in" in out
    cell = dpicl_home / "benchmarks" / "tables" / "tang-agnews-mini.json"
    record = json.loads(cell.read_text())
    rows = record["result"]["results"]
    assert sorted(r["epsilon"] for r in rows if r["method"] == "tang") == [1.0, 2.0, 3.0, 4.0, 8.0]
    assert {r["method"] for r in rows} >= {"zero-shot", "instruction-only", "sigma-zero", "random-real"}
    # charged to the dedicated ledger id only
    assert {e.purpose for e in Ledger().entries("agnews-mini-tables")} == {"pipeline", "baseline"}
    assert len(Ledger().entries("agnews-mini")) == before
    markdown = (tmp_path / "tables.md").read_text()
    assert "Tang et al. Table 1" in markdown and record["command"] in markdown
    ours = next(line for line in markdown.splitlines() if line.startswith("| agnews-mini | tiny-random"))
    assert ours.count("±") == 9  # 0-shot, eps 0, eps 1/2/3/4/8, sigma 0, random real
    assert (tmp_path / "accuracy_agnews-mini.png").stat().st_size > 0

    stamp = cell.stat().st_mtime_ns
    assert tables.main(argv) == 0
    assert "[1/1] tang-agnews-mini: skipped, finished" in capsys.readouterr().out
    assert cell.stat().st_mtime_ns == stamp
    assert record["command"] in (tmp_path / "tables.md").read_text()


def test_a_failed_cell_is_retried_by_the_next_run(tables, capsys, dpicl_home, tmp_path):
    argv = ["--datasets", "no-such-task", "--tables", "tang", "--out", str(tmp_path)]
    assert tables.main(argv) == 1
    out = capsys.readouterr().out
    assert "tang-no-such-task: FAILED (exit 2" in out
    cells = dpicl_home / "benchmarks" / "tables"
    assert not (cells / "tang-no-such-task.json").exists()
    assert "no-such-task" in (cells / "logs" / "tang-no-such-task.log").read_text()
    assert "not finished" in (tmp_path / "tables.md").read_text()
    assert tables.main(argv) == 1
    assert "tang-no-such-task: running" in capsys.readouterr().out


def test_report_only_writes_the_tables_and_runs_no_cell(tables, capsys, dpicl_home, tmp_path):
    argv = ["--datasets", "never-run", "--tables", "tang,pate", "--out", str(tmp_path), "--report-only"]
    assert tables.main(argv) == 0
    out = capsys.readouterr().out
    assert "tang-never-run: not finished (--report-only: not run)" in out and "running" not in out
    assert "0/3 cells finished" in out
    assert not (dpicl_home / "benchmarks" / "tables" / "logs" / "tang-never-run.log").exists()
    assert "not finished" in (tmp_path / "tables.md").read_text()


def test_the_dpsgd_table_puts_zero_shot_and_tang_at_the_same_epsilon_beside_it(tables):
    """Duan et al. Table 1's structure: each dataset's trained prompts next to its zero-shot prompt and DP
    few-shot generation at epsilon 3 and 8, read from the same dataset's Tang cell."""
    tang = tables.Cell("tang-sst2", "tang", "sst2", ["run"])
    tang.result = {"results": [
        {"method": "zero-shot", "epsilon": 0.0, "accuracy_mean": 0.5, "accuracy_std": 0.0,
         "calibrated_accuracy_mean": 0.8},
        {"method": "tang", "epsilon": 3.0, "accuracy_mean": 0.61, "accuracy_std": 0.02, "calibrated_accuracy_mean": 0.7},
        {"method": "tang", "epsilon": 8.0, "accuracy_mean": 0.66, "accuracy_std": 0.04, "calibrated_accuracy_mean": 0.75},
    ]}
    cells = []
    for kind, eps in tables.DPSGD_KEYS:
        cell = tables.Cell(f"dpsgd-{kind}-eps{eps}-sst2", "dpsgd", "sst2", ["tune"], key=(kind, eps))
        cell.result = {"accuracy": {"mean": 0.9, "std": 0.01}, "calibrated_accuracy": {"mean": 0.91},
                       "delta": 1e-5, "noise_multiplier": 0.3, "sampling_rate": 1e-4, "steps": 10}
        cells.append(cell)
    lines = tables.dpsgd_section(cells, {}, "m", tang_cells=[tang])
    header = next(line for line in lines if line.startswith("| dataset"))
    assert header.split(" | ")[2:5] == ["0-shot", "DP few-shot generation ε = 3", "DP few-shot generation ε = 8"]
    ours = next(line for line in lines if line.startswith("| sst2 | m"))
    cols = [c.strip() for c in ours.strip("|").split("|")]
    assert cols[2:5] == ["50.0 ± 0.0 [80.0]", "61.0 ± 2.0 [70.0]", "66.0 ± 4.0 [75.0]"]
    assert cols[5:] == ["90.0 ± 1.0 [91.0]"] * 8
    assert header.split(" | ")[-2:] == ["lora ε = 8", "full ε = 8 |"]
    paper = next(line for line in lines if line.startswith("| sst2 | paper"))
    assert len(paper.strip("|").split("|")) == len(cols)
    # without a finished Tang cell the reference columns say so instead of failing
    ours = next(line for line in tables.dpsgd_section(cells, {}, "m") if line.startswith("| sst2 | m"))
    assert [c.strip() for c in ours.strip("|").split("|")][2:5] == ["-", "-", "-"]
