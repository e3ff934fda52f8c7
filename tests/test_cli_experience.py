"""The command line as a newcomer meets it: quiet refusals, logs in a file, ports, clean stops."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipeline_support import subprocess_env
from prefect_test_server import free_port

REPO = Path(__file__).resolve().parent.parent
DPICL = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]


def _env(home: Path, **kwargs) -> dict:
    return subprocess_env(home, temporary_prefect_server=True, **kwargs)


def test_a_release_of_an_unknown_run_is_refused_in_one_line_before_prefect_starts(tmp_path):
    began = time.monotonic()
    done = subprocess.run(DPICL + ["release", "--run", "no-such-run"], cwd=tmp_path, env=_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("dpicl release: error: run 'no-such-run'"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    log = tmp_path / "home" / "logs" / "dpicl.log"  # Prefect's lines, in the file: the Ctrl-C test below
    assert "temporary server" not in (log.read_text() if log.exists() else "") and time.monotonic() - began < 60


def test_refusals_have_their_own_exit_code():
    from dpcore.errors import BudgetExceededError, ConfigError, ReleaseRefusedError

    codes = {ConfigError("x").exit_code, BudgetExceededError("x").exit_code, ReleaseRefusedError("x").exit_code}
    assert codes == {2, 3, 4}
    assert ReleaseRefusedError("x").kind == BudgetExceededError("x").kind == "refused"


def test_ui_names_a_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(DPICL + ["ui", "--no-prefect", "--mlflow-port", str(port)], cwd=tmp_path,
                              env=_env(tmp_path / "home"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--mlflow-port {port}: 127.0.0.1:{port} is already in use" in done.stderr


@pytest.mark.slow
def test_sigterm_stops_ui_and_its_servers(tmp_path):
    from flows.cli.ui import port_in_use

    port = free_port()
    proc = subprocess.Popen(DPICL + ["ui", "--no-prefect", "--mlflow-port", str(port)], cwd=tmp_path,
                            env=_env(tmp_path / "home"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not port_in_use("127.0.0.1", port):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the MLflow UI did not start"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "stopping" in err
    deadline = time.monotonic() + 10
    while port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not port_in_use("127.0.0.1", port), "a server outlived dpicl ui"


def test_every_flag_has_help():
    import argparse

    from flows.cli import build_parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif action.option_strings and action.help != argparse.SUPPRESS and not (action.help or "").strip():
                missing.append(f"{path} {action.option_strings[0]}")

    walk(build_parser(), "dpicl")
    assert missing == []


def test_the_cli_reaches_the_model_the_engine_the_ledger_and_the_accountant_only_through_tasks():
    """Every command parses arguments, calls the tasks or flows the pipeline uses, and formats output: no
    module of `flows/cli/` imports the language model, the generation engine, the ledger or the accountant."""
    import ast

    forbidden = {"dpcore.lm.model", "dpcore.fewshot.generation", "dpcore.privacy.ledger", "dpcore.privacy.composition", "dpcore.fewshot.accounting",
                 "dpcore.privacy.events", "transformers", "torch"}
    found = []
    for path in sorted((REPO / "flows" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            found += [f"{path.name}: {name}" for name in names
                      if any(name == bad or name.startswith(bad + ".") for bad in forbidden)]
    assert found == []


def test_the_cli_starts_without_the_model_stack_prefect_or_the_accountants(tmp_path):
    """`dpicl --help`, `dpicl ledger show` and every command's flags are read without importing torch,
    transformers, Prefect, MLflow or the accountants (seconds of start-up): those load when a command runs, and
    not for a command refused on its task."""
    probe = ("import sys; from flows.cli import build_parser; build_parser(); "
             "print(sorted(m for m in ('torch', 'transformers', 'prefect', 'mlflow', 'dp_accounting', "
             "'prv_accountant', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=subprocess_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    # a misspelt task is refused before the ledger, the accountants or the model's stack load
    refusal = ("import sys; from flows.cli import main; code = main(['run', '--dataset', 'agnwes', '--yes']); "
               "print(code, sorted(m for m in ('torch', 'dp_accounting', 'prv_accountant') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", refusal], cwd=REPO, env=subprocess_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "2 []", done.stderr
    assert done.stderr.startswith("dpicl run: error: dataset: unknown task 'agnwes'"), done.stderr


def test_bad_numbers_name_their_flag(capsys):
    from flows.cli import main

    for argv, flag in ((["generate", "--epsilon", "abc"], "--epsilon"),
                       (["generate", "--epsilon", "1", "--max-tokens", "abc"], "--max-tokens"),
                       (["run", "--delta", "tiny"], "--delta")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: expected" in err, err


# --------------------------------------------------------------------------- progress and stopping


def test_progress_reports_reach_the_sinks_and_a_stop_request_ends_the_stage():
    from dpcore.errors import RunStopped
    from tasks.common import STOP_REQUESTED, add_progress_sink, remove_progress_sink, report_progress

    seen = []
    sink = lambda what, done, total, detail="": seen.append((what, done, total))  # noqa: E731
    add_progress_sink(sink)
    try:
        report_progress("generate tang World eps=1", 3, 40)
        STOP_REQUESTED.set()
        with pytest.raises(RunStopped) as stopped:
            report_progress("generate tang World eps=1", 4, 40)
    finally:
        STOP_REQUESTED.clear()
        remove_progress_sink(sink)
    assert seen == [("generate tang World eps=1", 3, 40)]
    assert stopped.value.exit_code == 130 and stopped.value.kind == "stopped"


def test_evaluation_reports_items_over_all_seeds(tiny_lm):
    import pandas as pd

    from dpcore.data.taskspec import load_task_spec
    from dpcore.lm.config import EvalConfig
    from dpcore.lm.icl import evaluate

    spec = load_task_spec("agnews")
    test = pd.DataFrame({"id": [f"t{i}" for i in range(5)], "text": [f"news item {i}" for i in range(5)],
                         "label": ["World", "Sports", "Business", "Technology", "World"]})
    pool = [("a demo", "World"), ("another", "Sports"), ("third", "Business"), ("fourth", "Technology")]
    calls = []
    evaluate(tiny_lm, spec, test, pool, "tang", 1.0, EvalConfig(shots=2, seeds=3), batch_size=2,
             items_progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (15, 15) and all(total == 15 for _, total in calls)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)  # never goes back


@pytest.mark.slow
def test_ctrl_c_stops_a_run_within_a_step_and_keeps_the_charge(tmp_path):
    from pipeline_support import mini_agnews

    data_path, spec_path, _, _ = mini_agnews()
    home = tmp_path / "home"
    argv = ["run", "--task-spec", spec_path, "--data-path", data_path, "--model", "tiny-random", "--epsilons", "2",
            "--num-subsets", "2", "--subset-size", "1", "--top-k", "20", "--max-tokens", "1500", "--shots", "4",
            "--seeds", "1", "--test-size", "4", "--no-audit", "--dataset-id", "ctrl-c"]
    # A user's own `inspect.py` in the working directory must not shadow the stdlib in the temporary Prefect
    # server the run starts.
    (tmp_path / "inspect.py").write_text("raise SystemExit('a user file named inspect.py was imported')\n")
    # its own process group, as a terminal's foreground job: Ctrl-C reaches every process of it, the run's
    # temporary Prefect server too unless that runs in a session of its own
    proc = subprocess.Popen(DPICL + argv, cwd=tmp_path, env=_env(home, migrated_prefect_database=True),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stderr:  # wait until generation is under way (the tasks' step lines)
            lines.append(line)
            if "step 10/" in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)[1], None
    finally:
        if proc.poll() is None:
            proc.kill()
    waited = time.monotonic() - signalled
    err = "".join(lines) + (rest or "")
    assert proc.returncode == 130, err
    assert "stopping..." in err and "dpicl run: stopped:" in err and "Traceback" not in err
    assert "Error logging to API" not in err  # the server it logs to outlived the Ctrl-C
    # the temporary server's own output is in its file, never on the user's terminal
    assert "started by process" in (home / "logs" / "temporary-server.log").read_text()
    log = (home / "logs" / "dpicl.log").read_text()  # Prefect's own lines are kept, in the file
    assert "Starting temporary server" in log and "HTTP Request: POST" in log and "HTTP Request" not in err
    # the stopped stages' task runs and the flow run end Cancelled, none Failed or Crashed (red in the UI)
    assert "Finished in state Cancelled('stopped on request: generate tang" in log, log
    assert not re.search(r"Finished in state (Failed|Crashed)", log), log
    assert waited < 60, f"took {waited:.0f} s to stop"
    from dpcore.privacy.ledger import Ledger

    ledger_path = home / "ledger.db"
    assert [e.purpose for e in Ledger(ledger_path).entries("ctrl-c")] == ["pipeline"]  # the charge stays


def test_the_results_show_the_audit_verdict_and_never_its_figures():
    """The run's summary shows the gate's verdict beside the non-private contrast's; the figures (AUC, TPR,
    the strongest attack) are statistics of private records and stay in the private audit table."""
    from flows.cli.run import format_results

    summary = {
        "results": [], "delta": 1e-5, "seeded_noise": False, "run_id": "r", "mlflow_run_id": "m",
        "tracking_uri": "sqlite://", "run_dir": "/x",
        "audit": {"ran": True, "passed": True, "reasons": [],
                  "summary": [{"epsilon": 1.0, "verdict": "passed", "passed": True}],
                  "reference": {"verdict": "failed", "passed": False}},
    }
    text = format_results(summary)
    assert "audit: PASSED" in text
    assert "real records as demos (non-private): failed" in text
    assert "AUC" not in text.replace("the audit's figures", "") and "text-calibrated" not in text
    assert "private run folder's audit.parquet" in text


def test_a_runs_default_delta_is_its_budgets_delta(capsys):
    """A budget set at delta 1e-5 and a run without --delta: the run is planned at 1e-5, not 1/|D| (which
    would be charged at another delta and eat the budget); a --delta that differs is said before any charge."""
    import argparse

    from dpcore.privacy.ledger import Ledger
    from flows.cli.common import config_from_args

    Ledger().set_budget("delta-from-budget", 10.0, 1e-5)
    config = config_from_args(argparse.Namespace(dataset="agnews", dataset_id="delta-from-budget"))
    assert config.delta == 1e-5
    assert "delta = 1e-05, the delta of the budget of ledger id 'delta-from-budget'" in capsys.readouterr().err
    config = config_from_args(argparse.Namespace(dataset="agnews", dataset_id="delta-from-budget", delta=1e-3))
    assert config.delta == 1e-3 and "differs from the delta 1e-05" in capsys.readouterr().err
    assert config_from_args(argparse.Namespace(dataset="agnews", dataset_id="no-budget-here")).delta is None
