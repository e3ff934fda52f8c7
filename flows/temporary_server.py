"""The temporary Prefect server of a run on a machine with no server configured, out of the terminal's signals.

With no `PREFECT_API_URL`, Prefect starts a temporary API server as a child process of the run
(`prefect.server.api.server.SubprocessASGIServer`) in the run's process group. A Ctrl-C at the terminal is
sent to that whole group: the server died with it, and the run, which stops gracefully at its stages' next
step, was left retrying its flow's state update against a dead server, never ending. Started in a session of
its own, the server stays up while the run stops, and Prefect stops it when the run exits.
"""

from __future__ import annotations

import subprocess


class _SessionSubprocess:
    """`subprocess` as Prefect's server module sees it: `Popen` starts the child in a new session."""

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args, **kwargs):  # noqa: N802 - the name Prefect calls
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(*args, **kwargs)


def detach_temporary_server() -> None:
    """Have Prefect start its temporary server in a session of its own (a no-op where a server is configured:
    `PREFECT_API_URL` set, nothing is started). Idempotent."""
    # Prefect loads here, in a command already running: `dpicl` configures Prefect's settings and logging
    # before any of it loads (`flows.cli.main`)
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    # Prefect's server module (FastAPI, 2 s of imports): only for a run that will start the server anyway
    import prefect.server.api.server as prefect_server

    if not isinstance(prefect_server.subprocess, _SessionSubprocess):
        prefect_server.subprocess = _SessionSubprocess()
