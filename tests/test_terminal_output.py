"""What a person reads on the terminal: one progress line per generation step naming its label, epsilons
and deltas rounded for humans (full precision in --json), errors that name the flag the user typed, a
quiet exit on a closed pipe, PromptPATE's accuracies named for what they are, and what T counts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
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
