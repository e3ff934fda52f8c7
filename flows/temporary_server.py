"""The temporary Prefect server of a run on a machine with no server configured: out of the terminal's signals,
its writes begun IMMEDIATE, its log in a file.

With no `PREFECT_API_URL`, Prefect starts a temporary API server as a child process of the run
(`prefect.server.api.server.SubprocessASGIServer`, `python -m uvicorn ...`) in the run's process group, writing
to the run's terminal. Three changes to that child, made where Prefect starts it:
- A session of its own. A Ctrl-C at the terminal is sent to the whole process group: the server died with it,
  and the run, which stops gracefully at its stages' next step, was left retrying its flow's state update
  against a dead server, never ending. Now the server stays up while the run stops, and Prefect stops it when
  the run exits.
- `flows.sqlite_server` in place of `uvicorn`: its write transactions take SQLite's write lock first instead of
  being refused it (a 503 and a 2 s client back-off; "database is locked" tracebacks from its task-run
  recorder).
- Its output goes to `$DPICL_HOME/logs/temporary-server.log`, not the run's terminal: what the server prints
  (errors Prefect retries among them, PrefectHQ/prefect#18934) is not the user's to act on, and a user promised
  one line per error got tracebacks. Its log records also go to `dpicl.log`, as the run's (`flows.cli.logs`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dpcore.home import subdir

LOG_NAME = "temporary-server.log"


def server_log() -> Path:
    """Where the temporary server's output goes."""
    return subdir("logs") / LOG_NAME


def server_command(args: list[str]) -> list[str]:
    """Prefect's `python -m uvicorn <arguments>` as `python -m flows.sqlite_server <arguments>`; any other
    command as it is."""
    if list(args[1:3]) == ["-m", "uvicorn"]:
        return [args[0], "-m", "flows.sqlite_server", *args[3:]]
    return list(args)


class _TemporaryServerSubprocess:
    """`subprocess` as Prefect's server module sees it: `Popen` starts the temporary server as described above."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args, *rest, **kwargs):  # noqa: N802 - the name Prefect calls
        kwargs.setdefault("start_new_session", True)
        with open(server_log(), "ab") as output:  # the child keeps its own descriptor
            output.write(f"--- temporary server, started by process {os.getpid()}\n".encode())
            output.flush()
            kwargs.setdefault("stdout", output)
            kwargs.setdefault("stderr", subprocess.STDOUT)
            return subprocess.Popen(server_command(args), *rest, **kwargs)


def detach_temporary_server() -> None:
    """Have Prefect start its temporary server as described above (a no-op where a server is configured:
    `PREFECT_API_URL` set, nothing is started). Idempotent."""
    # Prefect loads here, in a command already running: `dpicl` configures Prefect's settings and logging
    # before any of it loads (`flows.cli.main`)
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    # Prefect's server module (FastAPI, 2 s of imports): only for a run that will start the server anyway
    import prefect.server.api.server as prefect_server

    if not isinstance(prefect_server.subprocess, _TemporaryServerSubprocess):
        prefect_server.subprocess = _TemporaryServerSubprocess()


