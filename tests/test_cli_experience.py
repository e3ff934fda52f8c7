"""The command line as a newcomer meets it: quiet refusals, logs in a file, ports, clean stops."""

from __future__ import annotations

import os
import signal
import socket
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_refused_release_prints_one_line_and_logs_go_to_a_file(tmp_path):
    # A user's own `inspect.py` in the working directory must not shadow the stdlib in the temporary
    # Prefect server that the release flow starts.
    (tmp_path / "inspect.py").write_text("raise SystemExit('a user file named inspect.py was imported')\n")
    done = subprocess.run(DPICL + ["release", "--run", "no-such-run"], cwd=tmp_path, env=_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("dpicl release: error: run 'no-such-run'"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    log = (tmp_path / "home" / "logs" / "dpicl.log").read_text()
    assert "audited-release" in log and "no-such-run" in log  # Prefect's own lines are kept, in the file


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

    port = _free_port()
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
