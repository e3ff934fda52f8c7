"""Progress bars and clean stops for long commands (generation steps, evaluation items, audit trials).

`showing_progress()` puts one progress bar per running stage on stderr, fed by
`tasks.common.report_progress`, which every stage calls with public counts only. A bar reads
`<stage> <bar> <done>/<total> <time> [<detail>]`, where the time is `1:02 elapsed, 3:10 left`
while the stage runs (the time left once two reports give a rate, from the average rate since
the bar's first report) and `done in 4:12` once it has ended; on a narrow terminal the stage's
name is shortened and its detail moves to a line of its own, so the bar, the counts and the
times always show (80 columns and up). The times are drawn on the terminal only, never logged.
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console, ConsoleOptions, RenderResult
from rich.progress import BarColumn, Progress, Task
from rich.table import Column, Table
from rich.text import Text

from dpcore.errors import RunStopped
from flows.temporary_server import detach_temporary_server
from tasks.common import STOP_REQUESTED, add_progress_sink, remove_progress_sink

BAR_MIN, BAR_MAX = 10, 40  # the bar's width in columns
NAME_MIN = 16  # a stage's name is shortened down to this many columns before the bar is
TIME_WIDTH = len("00:00 elapsed, 00:00 left")  # kept for the times, so bars do not jump as they change


def _is_termination(exc: BaseException) -> bool:
    """Prefect's `TerminationSignal` (SIGTERM inside a flow run), without importing Prefect for commands
    that never load it."""
    exceptions = sys.modules.get("prefect.exceptions")
    return exceptions is not None and isinstance(exc, exceptions.TerminationSignal)


def clock(seconds: float) -> str:
    """`m:ss` under an hour, `h:mm:ss` from one."""
    whole = max(0, int(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def time_text(task: Task) -> str:
    """`done in 4:12` once a stage has ended; while it runs `1:02 elapsed`, with `, 3:10 left` once the
    bar has moved since its first report (the average rate since then)."""
    if task.finished:
        return f"done in {clock(task.finished_time or 0.0)}"
    elapsed = task.elapsed or 0.0
    first = int(task.fields.get("first", 0))
    moved = task.completed - first
    if moved <= 0 or task.total is None:
        return f"{clock(elapsed)} elapsed"
    left = elapsed * (task.total - task.completed) / moved
    return f"{clock(elapsed)} elapsed, {clock(left)} left"


class _BarsView:
    """The bars laid out for the console's width: the bar, the counts and the times keep their room; the
    stage's name is shortened first, and a detail that does not fit beside the bar goes below it."""

    def __init__(self, tasks: Sequence[Task]):
        self.tasks = [task for task in tasks if task.visible]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.tasks:
            return
        width = options.max_width
        rows = [(task, str(task.description), f"{int(task.completed)}/{int(task.total or 0)}", time_text(task),
                 str(task.fields.get("detail") or "")) for task in self.tasks]
        count_w = max(len(r[2]) for r in rows)
        time_w = max(TIME_WIDTH, *(len(r[3]) for r in rows))
        name_w = max(len(r[1]) for r in rows)
        room = width - count_w - time_w - 3  # for the name, the bar and the spaces between them
        name_w = max(min(NAME_MIN, name_w), min(name_w, room - 1 - BAR_MIN))
        bar_room = max(1, room - name_w - 1)
        detail_w = max(len(r[4]) for r in rows)
        inline = detail_w > 0 and bar_room - detail_w - 1 >= BAR_MIN
        bar_w = min(BAR_MAX, bar_room - detail_w - 1 if inline else bar_room)
        for task, name, count, time, detail in rows:
            columns = [Column(width=name_w, no_wrap=True, overflow="ellipsis"), Column(width=bar_w, no_wrap=True),
                       Column(width=count_w, no_wrap=True, justify="right"), Column(width=time_w, no_wrap=True)]
            cells = [Text(name), BarColumn(bar_width=bar_w).render(task), Text(count, style="progress.download"),
                     Text(time, style="progress.elapsed")]
            if inline:
                columns.append(Column(width=detail_w, no_wrap=True, overflow="ellipsis"))
                cells.append(Text(detail))
            line = Table.grid(*columns, padding=(0, 1))
            line.add_row(*cells)
            yield line
            if detail and not inline:
                yield Text("  " + detail, no_wrap=True, overflow="ellipsis")


class _Bars(Progress):
    def get_renderables(self):
        yield _BarsView(self.tasks)


@contextmanager
def showing_progress(enabled: bool = True) -> Iterator[None]:
    """Draw a bar per stage while the block runs (stderr only, and only on a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield
        return

    bars = _Bars(console=Console(file=sys.stderr), transient=False)
    tasks: dict[str, int] = {}
    lock = threading.Lock()

    def sink(what: str, done: int, total: int, detail: str = "") -> None:
        total = max(total, 1)
        with lock:
            if what not in tasks:
                tasks[what] = bars.add_task(what, total=total, completed=done, detail=detail, first=done)
                bars.update(tasks[what], completed=done)  # a stage whose first report is its last ends here
                return
            task = next(t for t in bars.tasks if t.id == tasks[what])
            if done < task.completed or (task.finished and done < total):  # the stage anew (a retry): so is its clock
                bars.reset(tasks[what], total=total, completed=done, detail=detail, first=done)
                return
            bars.update(tasks[what], completed=done, total=total, **({"detail": detail} if detail else {}))

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
