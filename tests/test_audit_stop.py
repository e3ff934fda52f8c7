"""A stop request (SIGTERM, Ctrl-C) ends the membership audit within seconds, between forward passes, with
the ledger and the output folders consistent: the audit's charges (made before it read a record) stay,
nothing half-written is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pipeline_support import subprocess_env

from dpcore.data.taskspec import TASKS_DIR

DPICL = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]
LABELS = ["World", "Sports", "Business", "Technology"]
DEMO_SETS = 2


def _env(home: Path) -> dict:
    # The suite's shared Prefect server, as a user's configured one: a stopped run's flow run ends there like
    # any other (the temporary server a `dpicl` command starts itself is tested in test_cli_experience.py).
    return subprocess_env(home)


def _dataset(folder: Path, per_label: int = 300) -> tuple[Path, Path]:
    """A made-up user dataset large enough that the audit scores for about a minute on the tiny model: each
    label's 285 private records split into 142 members and 143 non-members, 20 of them the references', so a
    demo set scores about 265 records x 22 forward passes (100 members x 10 trials recur within the pools)."""
    words = ["market", "match", "election", "chip", "storm", "merger", "league", "rocket", "vote", "orbit"]
    rng = np.random.default_rng(0)
    rows = [{"id": f"{label[:2]}{i:05d}", "text": f"{label} note {i}: " + " ".join(rng.choice(words, size=12)),
             "label": label} for label in LABELS for i in range(per_label)]
    pd.DataFrame(rows).to_csv(folder / "data.csv", index=False)
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="audit-stop", split={"test_size": 0.05, "seed": 0},
                source={"type": "file", "path": str(folder / "data.csv"), "text_column": "text",
                        "label_column": "label", "id_column": "id"})
    (folder / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "data.csv", folder / "task.yaml"


def _wait_for_scoring(home: Path, proc: subprocess.Popen, lines: list[str], deadline: float) -> None:
    """Until the audit's scoring of its first demo set has begun (its log line), then a moment more: into the
    scoring's forward passes."""
    log = home / "logs" / "dpicl.log"
    while not (log.exists() and "audit: scoring " in log.read_text()):
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "the audit never scored:\n" + "".join(lines)
        time.sleep(0.2)
    time.sleep(0.5)


@pytest.mark.slow
def test_sigterm_stops_an_audit_between_forward_passes(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """`dpicl audit` run in this process (the command's imports are the session's: a `dpicl` process spends
    most of its CPU importing), sent SIGTERM by another thread as by `kill`: the signal reaches the main
    thread, where the command's handler runs, as in a process of its own."""
    from dpcore.audit import attacks as mia_attacks
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    assert threading.current_thread() is threading.main_thread()  # where a signal's handler runs
    data, task = _dataset(tmp_path)
    home, out = tmp_path / "home", tmp_path / "audit-out"
    _env(home)  # a fresh home with the session's converted models and accounting cache
    monkeypatch.setenv("DPICL_HOME", str(home))
    for key in ("PREFECT_LOGGING_SETTINGS_PATH", "MLFLOW_LOGGING_LEVEL"):  # the command sets them: undone after
        monkeypatch.setenv(key, os.environ.get(key, ""))
        if not os.environ[key]:
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    argv = ["audit", "--task-spec", str(task), "--data-path", str(data), "--dataset-id", "audit-stop",
            "--epsilon", "2", "--model", str(tiny_model_dir), "--max-tokens", "4", "--num-subsets", "2",
            "--subset-size", "1", "--top-k", "20", "--audit-demo-sets", str(DEMO_SETS), "--audit-members", "100",
            "--trials", "10", "--audit-reference-prompts", "20", "--seed", "1", "--out", str(out)]
    scoring, returned = threading.Event(), threading.Event()
    scores = mia_attacks.prompt_scores

    def watched(*args, **kwargs):  # every forward pass of the audit's scoring, as it was
        scoring.set()
        return scores(*args, **kwargs)

    monkeypatch.setattr(mia_attacks, "prompt_scores", watched)
    sent: list[float] = []
    waiting: list[str] = []

    def stop_once_scoring() -> None:
        # The audit's demo sets are charged before any member record is read: then it generates (tiny: under a
        # second) and scores members and non-members against each demo, batch after batch, for a minute.
        deadline = time.monotonic() + 300
        ledger = home / "ledger.db"
        while not (scoring.is_set() and ledger.exists() and Ledger(ledger).entries("audit-stop")):
            if returned.is_set() or time.monotonic() > deadline:
                waiting.append("the command returned" if returned.is_set() else "the audit never scored")
                return
            time.sleep(0.2)
        time.sleep(0.5)  # into the scoring's forward passes
        if not returned.is_set():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

    # Whatever the command leaves in place when it returns takes a late signal harmlessly (it would end the
    # test process otherwise).
    late: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: late.append(signum))
    sender = threading.Thread(target=stop_once_scoring, daemon=True)
    try:
        sender.start()
        code = main(argv)
        waited = time.monotonic() - sent[0] if sent else None
    finally:
        returned.set()
        sender.join(timeout=30)
        signal.signal(signal.SIGTERM, previous)
    err = capsys.readouterr().err
    assert sent and not late and not waiting, f"{waiting}: the audit was not stopped while it scored:\n{err}"
    # between forward passes: seconds (the whole audit scores about 530 records x 22 passes, a minute); the bound
    # leaves room for a machine shared with other test processes, where a pass of the model takes several times longer
    assert waited < 30, f"took {waited:.0f} s to stop:\n{err}"
    assert code == 130, err  # the exit status of a `dpicl audit` process
    assert "stopping..." in err and "Traceback" not in err, err
    stopped = [line for line in err.splitlines() if line.startswith("dpicl audit: stopped:")]
    assert len(stopped) == 1, err
    # The ledger: the audit's demo sets were charged at once, before any was generated; they stay charged.
    entries = Ledger(home / "ledger.db").entries("audit-stop")
    assert [e.purpose for e in entries] == ["audit"] * DEMO_SETS
    # Nothing half-written: no temporary file anywhere, no verdict for an audit that did not finish.
    leftovers = [p for p in home.rglob("*") if p.name.endswith(".tmp")] + [p for p in out.rglob("*")]
    assert leftovers == [], leftovers


def test_the_attack_scoring_asks_to_stop_before_every_forward_pass(tiny_lm, one_thread):
    """dpcore stays pure: the caller's `should_stop` is asked between batched forward passes, and a True ends
    the scoring with RunStopped within one pass."""
    from dpcore.audit.attacks import prompt_scores, reference_scores
    from dpcore.data.taskspec import load_task_spec
    from dpcore.errors import RunStopped

    spec = load_task_spec("agnews")
    texts = [f"record {i} about the market" for i in range(40)]
    labels = [LABELS[i % 4] for i in range(40)]
    asked = []

    def stop_at_third() -> bool:
        asked.append(1)
        return len(asked) >= 3

    with pytest.raises(RunStopped, match="the audit stopped on request"):
        prompt_scores(tiny_lm, spec, [("a demo", "World")], texts, labels, batch_size=8, should_stop=stop_at_third)
    assert len(asked) == 3  # two passes ran, the third was never started
    asked.clear()
    with pytest.raises(RunStopped):
        reference_scores(tiny_lm, spec, texts, labels, [("out one", "World"), ("out two", "Sports")], batch_size=8,
                         should_stop=stop_at_third)
    scores = prompt_scores(tiny_lm, spec, [], texts[:4], labels[:4], should_stop=lambda: False)
    assert len(scores) == 4


def test_a_dp_audit_stops_during_its_generation(tiny_lm, one_thread):
    from dpcore.audit.config import AuditConfig
    from dpcore.audit.procedures import dp_audit
    from dpcore.data.taskspec import load_task_spec
    from dpcore.errors import RunStopped
    from dpcore.fewshot.config import GenerationConfig

    def records(prefix: str) -> pd.DataFrame:
        return pd.DataFrame([{"id": f"{prefix}{label}{i}", "text": f"{label} {prefix} record {i}", "label": label}
                             for label in LABELS for i in range(12)])

    charged, asked = [], []
    with pytest.raises(RunStopped):
        dp_audit(tiny_lm, load_task_spec("agnews"), records("m"), records("n"),
                 AuditConfig(trials=2, demo_sets=2, members=3, non_members=3, reference_prompts=0),
                 GenerationConfig(num_subsets=2, subset_size=1, top_k=20, max_tokens=6), 1.0, seed=0,
                 epsilon=2.0, delta=1e-5, crosscheck_agreed=True, charge=charged.append,
                 should_stop=lambda: asked.append(1) or len(asked) > 2)
    assert charged == [0]  # the first demo set was charged before its generation began, and stays charged
    assert len(asked) == 3  # stopped at the generation's third token step


@pytest.mark.slow
def test_sigterm_stops_a_run_in_its_audit(tmp_path, tiny_model_dir):
    """In `dpicl run` the audit is a Prefect task in a worker thread, and Prefect takes SIGTERM for itself
    while its flow runs: the flow's task runner asks the running stages to stop before waiting for them."""
    from dpcore.privacy.ledger import Ledger

    data, task = _dataset(tmp_path)
    home = tmp_path / "home"
    argv = ["run", "--task-spec", str(task), "--data-path", str(data), "--dataset-id", "run-stop",
            "--model", str(tiny_model_dir), "--epsilons", "2", "--max-tokens", "4", "--shots", "4", "--seeds", "1",
            "--test-size", "20", "--num-subsets", "2", "--subset-size", "1", "--top-k", "20",
            "--audit-demo-sets", str(DEMO_SETS), "--audit-members", "100", "--audit-trials", "10",
            "--audit-reference-prompts", "20", "--audit-mode", "regenerate", "--seed", "1", "--yes"]
    proc = subprocess.Popen(DPICL + argv, cwd=tmp_path, env=_env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    drain = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    drain.start()
    try:
        deadline = time.monotonic() + 400
        ledger = home / "ledger.db"
        # the audit charges each demo set just before generating it from the members
        while not (ledger.exists() and "audit" in [e.purpose for e in Ledger(ledger).entries("run-stop")]):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the audit never started:\n" + "".join(lines)
            time.sleep(0.5)
        _wait_for_scoring(home, proc, lines, deadline)
        assert proc.poll() is None, "the run finished before it could be stopped:\n" + "".join(lines)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        waited = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    drain.join(timeout=10)
    err = "".join(lines)
    # a few seconds more than the audit alone: Prefect records the flow run's end with its server
    assert waited < 15, f"took {waited:.0f} s to stop:\n{err}"
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("dpicl run: stopped:")], err
    # the audit's task run (and any stage the stop ended with it) and the flow run end Cancelled, none Failed
    # or Crashed (red in the UI)
    log = (home / "logs" / "dpicl.log").read_text()
    assert "Finished in state Cancelled('stopped on request: " in log, log
    assert not re.search(r"Finished in state (Failed|Crashed)", log), log
    purposes = [e.purpose for e in Ledger(home / "ledger.db").entries("run-stop")]
    assert purposes[0] == "pipeline" and set(purposes[1:]) == {"audit"} and len(purposes) <= 1 + DEMO_SETS
    assert [p for p in home.rglob("*") if p.name.endswith(".tmp")] == []
    assert not list((home / "runs").rglob("manifest.json"))  # the run did not finish: no manifest claims it did
