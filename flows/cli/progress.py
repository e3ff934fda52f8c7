"""Progress bars and clean stops for long commands (generation steps, evaluation items, audit trials).

`showing_progress()` puts one rich progress bar per running stage on stderr (rate, elapsed, time
left), fed by `tasks.common.report_progress`, which every stage calls with public counts only.
Log lines printed meanwhile go above the bars (rich redirects stderr while they are shown). With
stderr not a terminal (a pipe, CI, `--json` scripts) nothing is drawn.

`stopping_on_signals()`: the first Ctrl-C or SIGTERM prints "stopping..." and asks every stage
to stop at its next progress report or forward pass (`tasks.common.STOP_REQUESTED`): the command
then ends with `RunStopped` (exit 130) within a step, and what was charged to the ledger stays
charged. A second Ctrl-C interrupts at once. While a Prefect flow runs, Prefect takes SIGTERM
itself (it raises `TerminationSignal` in the flow, and hands the signal back to this handler once
the flow has ended); the flow's task runner (`flows.runner.running`) then asks the running
stages to stop, and the command ends the same way.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dpcore.errors import RunStopped
from flows.temporary_server import detach_temporary_server
from tasks.common import STOP_REQUESTED, add_progress_sink, remove_progress_sink


def _is_termination(exc: BaseException) -> bool:
    """Prefect's `TerminationSignal` (SIGTERM inside a flow run), without importing Prefect for commands
    that never load it."""
    exceptions = sys.modules.get("prefect.exceptions")
    return exceptions is not None and isinstance(exc, exceptions.TerminationSignal)


@contextmanager
def showing_progress(enabled: bool = True) -> Iterator[None]:
    """Draw a bar per stage while the block runs (stderr only, and only on a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield
        return

    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[detail]}"),
                    console=Console(file=sys.stderr), transient=False)
    tasks: dict[str, int] = {}
    lock = threading.Lock()

    def sink(what: str, done: int, total: int, detail: str = "") -> None:
        with lock:
            if what not in tasks:
                tasks[what] = bars.add_task(what, total=max(total, 1), detail=detail)
            bars.update(tasks[what], completed=done, total=max(total, 1), **({"detail": detail} if detail else {}))

    add_progress_sink(sink)
    try:
        with bars:
            yield
    finally:
        remove_progress_sink(sink)


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """First SIGINT/SIGTERM: ask the stages to stop; second SIGINT: interrupt now."""
    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        yield
        return
    detach_temporary_server()  # a terminal's Ctrl-C reaches the run, not the server it stops through

    received: list[int] = []

    def on_signal(signum, frame):
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        STOP_REQUESTED.set()
        print("\nstopping... running stages end at their next step (charges already made stay charged; "
              "Ctrl-C again to interrupt at once)", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    STOP_REQUESTED.clear()
    try:
        yield
    except BaseException as exc:
        if _is_termination(exc):  # SIGTERM during a Prefect flow: its stages have stopped
            raise RunStopped("SIGTERM: the running stages ended at their next step") from None
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        STOP_REQUESTED.clear()
