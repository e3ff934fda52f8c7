"""The suite's one Prefect server under xdist: the controller starts it first thing (`start`), every worker and
the `dpicl` subprocesses their tests start send their flow runs to it.

Its URL is known before it answers (its port is chosen first), so the workers import and collect while it
migrates its database, and wait for it (`wait_until_ready`) only before their first test. Standard library
only: the controller imports neither Prefect nor torch to start it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

URL = "DPICL_TEST_PREFECT_URL"  # the server's API URL, set before it answers
READY_FILE = "DPICL_TEST_PREFECT_READY"  # the path of a file written once it answers: "ok" or why it did not start
# Beside the ready file, a copy of the server's database as it started (migrated, no flow run yet), for the
# `dpicl` subprocesses whose temporary server should not run Prefect's 113 migrations again.
MIGRATED_DATABASE = "migrated-prefect.db"
STARTUP_TIMEOUT = 180.0

# Prefect's SQLite server sometimes leaves a write transaction waiting on a writer that waits on it
# (PrefectHQ/prefect#18934): only SQLite's busy timeout (60 s; 30 s in Prefect's test mode) breaks the wait,
# and every worker's tests wait meanwhile. The waiter that gives up gets "database is locked", which the
# server answers with a 503 that Prefect's client retries, and the task-run recorder retries its flush: so
# this server waits 3 s instead (benchmarks/RESULTS.md, the test suite).
BUSY_TIMEOUT_MS = 3000
# Its write transactions begin IMMEDIATE, as a run's temporary server's do (`flows.sqlite_server`, where the
# refusals they avoid are measured).

# Prefect's task-run recorder writes each task-run event in a transaction of its own (batch size 1): with every
# worker's runs on one server, that is a third of the server's CPU (test_ledger_pipeline, test_pipeline and
# test_compare on 2 workers: the server's 48 s of CPU -> 32 s). Batched, a second's events go in one.
RECORDER_BATCHING = {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "500",
                     "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1"}


def start() -> Callable[[], None]:
    """Start the server (Prefect's own command line for a temporary server, `prefect.server.api.server.
    SubprocessASGIServer`, on its own SQLite file, in Prefect's test mode) and return the function that stops
    it. URL and READY_FILE are set in this process's environment, which the workers inherit. Like a run's
    temporary server it neither persists events nor runs automations (`dpcore.home.TEMPORARY_SERVER_SETTINGS`,
    in the environment from conftest's `configure_environment`)."""
    folder = Path(tempfile.mkdtemp(prefix="dpicl-test-prefect-"))
    database = folder / "prefect-test.db"
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    ready = folder / "ready"
    os.environ[URL], os.environ[READY_FILE] = url, str(ready)
    site_packages = Path(importlib.util.find_spec("prefect").origin).parent.parent  # Prefect's own --app-dir
    # What the server prints (among it the task-run recorder's retried "database is locked", at this busy
    # timeout under load) goes to a file beside its database, not into the suite's output; a server that
    # does not start is reported with the file's end.
    log = folder / "server.log"
    with open(log, "ab") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "flows.sqlite_server", "--busy-timeout-ms", str(BUSY_TIMEOUT_MS),
             "--app-dir", str(site_packages), "--factory", "prefect.server.api.server:create_app",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"],
            env={**os.environ, "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{database}",
                 "PREFECT_TESTING_UNIT_TEST_MODE": "1", "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                 "PREFECT__SERVER_FINAL": "1", **RECORDER_BATCHING},
            stdout=output, stderr=subprocess.STDOUT)

    def announce() -> None:
        try:
            _wait_for_health(url, server, log)
            _copy_database(database, folder / MIGRATED_DATABASE)
            outcome = "ok"
        except Exception as exc:  # noqa: BLE001 (written for the workers, which raise it)
            outcome = f"the shared Prefect test server did not start: {exc}"
        partial = ready.with_suffix(".partial")
        partial.write_text(outcome)
        partial.replace(ready)

    watcher = threading.Thread(target=announce, name="prefect-test-server", daemon=True)
    watcher.start()

    def stop() -> None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        watcher.join(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)

    return stop


def wait_until_ready() -> str:
    """The server's URL once it answers; a RuntimeError naming why when it did not start."""
    ready = Path(os.environ[READY_FILE])
    began = time.monotonic()
    while not ready.exists():
        if time.monotonic() - began > STARTUP_TIMEOUT + 10:
            raise RuntimeError(f"the shared Prefect test server did not start within {STARTUP_TIMEOUT:.0f} s")
        time.sleep(0.1)
    outcome = ready.read_text()
    if outcome != "ok":
        raise RuntimeError(outcome)
    return os.environ[URL]


def migrated_database() -> Path | None:
    """The copy of the server's database as it started, once it answers; None where it could not be copied."""
    wait_until_ready()
    copy = Path(os.environ[READY_FILE]).with_name(MIGRATED_DATABASE)
    return copy if copy.exists() else None


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the suite's servers, and the tests' own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_health(url: str, server: subprocess.Popen, log: Path) -> None:
    began = time.monotonic()
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        if server.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"it exited with code {server.returncode}; its output ends:\n{tail}")
        if time.monotonic() - began > STARTUP_TIMEOUT:
            raise RuntimeError(f"no answer within {STARTUP_TIMEOUT:.0f} s")
        time.sleep(0.2)


def _copy_database(database: Path, target: Path) -> None:
    """SQLite's online backup of the started database: Prefect's schema at its last migration and the block
    types it registers on start, no run yet (no worker has waited for the server yet). Without a copy, the
    subprocesses' servers migrate their own."""
    try:
        with contextlib.closing(sqlite3.connect(database)) as started, \
                contextlib.closing(sqlite3.connect(target)) as copy:
            started.backup(copy)
    except sqlite3.Error:
        target.unlink(missing_ok=True)
