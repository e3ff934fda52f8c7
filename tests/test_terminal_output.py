"""What a person reads on the terminal: one progress line per generation step naming its label, epsilons
and deltas rounded for humans (full precision in --json), errors that name the flag the user typed, a
quiet exit on a closed pipe, PromptPATE's accuracies named for what they are, and what T counts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DPICL = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]


def _env(home: Path) -> dict:
    env = dict(os.environ, DPICL_HOME=str(home), PYTHONPATH=str(REPO))
    for key in ("PREFECT_HOME", "HF_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "PREFECT_LOGGING_SETTINGS_PATH"):
        env.pop(key, None)
    return env


# --------------------------------------------------------------------------- a closed pipe


def test_a_closed_stdout_ends_the_command_quietly(tmp_path):
    """`dpicl ledger show | head`: the reader goes away before dpicl writes; no traceback, exit 141."""
    from dpcore.ledger import ChargeRequest, Ledger

    home = tmp_path / "home"
    home.mkdir()
    book = Ledger(home / "ledger.db")
    book.charge_many([ChargeRequest("pipe", "c" * 64, f"run-{i}", "gaussian", 1.0, 0.01, 10, 1e-5, "generate")
                      for i in range(300)])  # more lines than a pipe buffer holds
    proc = subprocess.Popen(DPICL + ["ledger", "show", "--dataset", "pipe"], cwd=tmp_path, env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # `head -1`: one line read, then the pipe is closed
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert proc.returncode == 141, (proc.returncode, err)


# --------------------------------------------------------------------------- one line per generation step


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not any(record is seen for seen in self.records):  # seen by two watched loggers
            self.records.append(record)


@pytest.fixture()
def logs():
    """Every log record of dpicl's loggers (a handler on each: Prefect's logging set-up may stop them from
    propagating to the root logger, where caplog listens)."""
    captured = _Collect()
    watched = [logging.getLogger(name) for name in ("", "dpcore", "dpicl", "tasks", "flows", "prefect")]
    levels = [logger.level for logger in watched]
    for logger in watched:
        logger.addHandler(captured)
        logger.setLevel(logging.DEBUG)
    try:
        yield captured.records
    finally:
        for logger, level in zip(watched, levels, strict=True):
            logger.removeHandler(captured)
            logger.setLevel(level)


def _step_lines(records, steps: int) -> dict[int, list[str]]:
    """The INFO lines of each generation step k ("step k/steps"), from any logger."""
    lines: dict[int, list[str]] = {k: [] for k in range(1, steps + 1)}
    for record in records:
        if record.levelno < logging.INFO:
            continue
        message = record.getMessage()
        for k in lines:
            if f"step {k}/{steps}" in message:
                lines[k].append(message)
    return lines


def test_the_generate_stage_logs_each_step_once_with_its_label(tiny_lm, logs, one_thread):
    """In a pipeline run, labels generate in parallel tasks: a step line that does not name its label (or two
    lines for one step) cannot be told apart."""
    import pandas as pd
    from pipeline_support import share_tiny_model

    from dpcore.artifacts import write_table
    from dpcore.config import GenerationConfig
    from dpcore.home import private_dir
    from tasks import generate as generate_stage

    share_tiny_model(tiny_lm)
    rows = [{"split": "train", "id": f"{label}-{i}", "text": f"{label} record {i} about markets", "label": label}
            for label in ("World", "Sports") for i in range(12)]
    records = write_table(pd.DataFrame(rows), private_dir() / "tests" / "step-lines" / "records.parquet")
    generate_stage.generate.fn(
        records_path=str(records), data_hash="d" * 64, task_spec="agnews", method="dp", label="Sports",
        epsilon=1.0, noise_multiplier=2.0, generation=GenerationConfig(num_subsets=2, subset_size=2, top_k=20,
                                                                       max_tokens=4),
        model="tiny-random", seed=3, noise_scope="seed:3", noise_charged=True)
    lines = _step_lines(logs, 4)
    assert all(len(found) == 1 for found in lines.values()), lines
    assert all("Sports" in found[0] and "eps=1" in found[0] for found in lines.values()), lines


def test_dpicl_generate_logs_each_step_once_with_the_labels(tiny_model_dir, cli, logs, one_thread):
    code, out, err = cli(["generate", "--dataset", "agnews", "--dataset-id", "step-lines", "--epsilon", "2",
                          "--model", str(tiny_model_dir), "--shots", "8", "--max-tokens", "3", "--num-subsets",
                          "2", "--subset-size", "1", "--top-k", "20", "--seed", "1"])
    assert code == 0, err
    lines = _step_lines(logs, 3)
    assert all(len(found) == 1 for found in lines.values()), lines
    assert all("World" in found[0] and "Technology" in found[0] for found in lines.values()), lines
    # 8 shots over 4 labels: 2 demos per label of 3 tokens each, so 6 mechanism steps per label: said as such
    first = out.splitlines()[0]
    assert "T = 6 mechanism steps (3 tokens per demo x 2 demos per label)" in first, first


# --------------------------------------------------------------------------- what T counts


def test_the_calibration_log_says_what_t_counts_and_rounds_its_epsilons(logs):
    """T is every mechanism step of a label: tokens per demo x demos per label, not the tokens of one demo."""
    from dpcore.config import GenerationConfig
    from tasks.calibrate import calibrate

    calibrate.fn(epsilons=[3.0], label_counts={"a": 30000, "b": 30000},
                 generation=GenerationConfig(num_subsets=10, subset_size=2, max_tokens=20, demos_per_label=2),
                 delta=1e-5, baselines=[], audit_reference=False)
    (line,) = [r.getMessage() for r in logs if r.getMessage().startswith("epsilon 3:")]
    assert "T = 40 mechanism steps (20 tokens per demo x 2 demos per label)" in line, line
    upper = line.split("accountant upper ")[1].split(",")[0]
    assert len(upper.replace(".", "")) <= 4, line  # not 2.998361328681111
    assert "delta 1e-05" in line, line
