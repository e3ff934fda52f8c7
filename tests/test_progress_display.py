"""The progress bars as a person sees them: `dpicl generate`, `dpicl audit` and `dpicl tune` on the tiny model,
their stderr a pseudo-terminal of 80 columns. Every bar ends complete (a generation whose demos all ended early,
an audit's last demo set), its times say which is elapsed and which is left, DP-SGD's bar shows with a time left
at 80 columns, and transformers' own "Loading weights" bars stay off the screen; DP-SGD without public
validation examples says so rather than logging a nan loss."""

from __future__ import annotations

import fcntl
import math
import os
import re
import shutil
import struct
import sys
import termios
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from pipeline_support import prefect_harness  # noqa: F401  (the shared harness fixture)

from dpcore.data.taskspec import TASKS_DIR

COLUMNS = 80
LABELS = ["World", "Sports", "Business", "Technology"]
# rich redraws its bars in place: back to the first bar's line, each line cleared, then the bars again
_REDRAW = re.compile(r"\r\x1b\[2K(?:\x1b\[1A\x1b\[2K)*")
_STYLE = re.compile(r"\x1b\[[0-9;]*m")
_BAR = re.compile(r"^(?P<name>\S.*?) +[━╸╺]+ +(?P<done>\d+)/(?P<total>\d+) (?P<time>.*?)\s*$")


def _dataset(folder: Path) -> dict[str, Path]:
    """A made-up 4-label dataset, a public validation file, and a task spec whose demos stop at the first
    generated 'e' (so they end before --max-tokens)."""
    words = ["market", "match", "election", "chip", "storm", "merger", "league", "rocket", "vote", "orbit"]
    rng = np.random.default_rng(0)

    def rows(per_label: int, tag: str) -> pd.DataFrame:
        return pd.DataFrame([{"id": f"{tag}{label[:2]}{i:04d}", "label": label,
                              "text": f"{label} {tag} {i}: " + " ".join(rng.choice(words, size=8))}
                             for label in LABELS for i in range(per_label)])

    rows(24, "n").to_csv(folder / "data.csv", index=False)
    rows(2, "p").to_csv(folder / "public.csv", index=False)
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="progress-display", split={"test_size": 0.2, "seed": 0},
                source={"type": "file", "path": str(folder / "data.csv"), "text_column": "text",
                        "label_column": "label", "id_column": "id"})
    spec["generation"]["stop"] = "e"
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return {"data": folder / "data.csv", "public": folder / "public.csv", "spec": folder / "spec.yaml"}


class _Terminal:
    """A pseudo-terminal of `COLUMNS` columns as this process's stderr (where the bars, the log lines and any
    library's tqdm bars go); everything written to it is read back as it comes."""

    def __init__(self, monkeypatch):
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
        self._master, self._chunks = master, []
        self.stderr = open(slave, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in `close`)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        monkeypatch.setenv("COLUMNS", str(COLUMNS))
        monkeypatch.setattr(sys, "stderr", self.stderr)

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # the terminal's other end was closed
                return
            if not data:
                return
            self._chunks.append(data)

    def close(self) -> str:
        self.stderr.close()
        self._reader.join(timeout=10)
        os.close(self._master)
        return b"".join(self._chunks).decode("utf-8", errors="replace")


def _frames(shown: str) -> list[list[str]]:
    """Every drawing of the bars, as lines without styles; the last of each command is what stays on screen."""
    frames = []
    for piece in _REDRAW.split(shown):
        lines = [_STYLE.sub("", line) for line in piece.split("\x1b[?25h")[0].split("\r\n")]
        if any(_BAR.match(line) for line in lines):
            frames.append([line for line in lines if line])
    return frames


def _final_frames(shown: str) -> list[list[str]]:
    """The bars as each command leaves them (rich shows the cursor again once it stops drawing)."""
    return [_frames(part)[-1] for part in shown.split("\x1b[?25h")[:-1] if _frames(part)]


@pytest.mark.usefixtures("prefect_harness")
def test_the_bars_at_80_columns_end_complete_with_their_times_named(tiny_model_dir, tmp_path, monkeypatch,
                                                                   capsys, one_thread):
    from flows.cli import main

    files = _dataset(tmp_path)
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")  # a folder no test loaded yet: this run loads it
    common = ["--task-spec", str(files["spec"]), "--data-path", str(files["data"]), "--model", str(model),
              "--seed", "1", "--dataset-id", "progress-display"]
    commands = [["generate", "--epsilon", "8", "--max-tokens", "20", "--num-subsets", "2", "--subset-size", "2",
                 "--top-k", "20", *common],
                ["audit", "--epsilon", "8", "--max-tokens", "6", "--num-subsets", "2", "--subset-size", "2",
                 "--top-k", "20", "--audit-demo-sets", "3", "--trials", "2", "--audit-members", "4",
                 "--audit-reference-prompts", "2", "--audit-max-record-tokens", "8", *common],
                ["tune", "--epsilon", "8", "--steps", "4", "--kind", "soft-prompt", "--length", "2",
                 "--batch-size", "16", "--test-size", "4", "--validation-path", str(files["public"]),
                 "--validation-size", "8", *common]]
    terminal = _Terminal(monkeypatch)
    try:
        codes = [main(argv) for argv in commands]
    finally:
        shown = terminal.close()
    capsys.readouterr()
    assert codes[0] == 0 and codes[2] == 0 and codes[1] in (0, 1), (codes, shown[-3000:])  # audit: 1 = failed gate

    plain = _STYLE.sub("", shown)
    assert "Loading weights" not in plain and "Writing model shards" not in plain
    # the times are named: no bare elapsed time followed by "left" and another time (the old "0:05:19 left -:--:--")
    assert not re.search(r"\d:\d\d left +(-|\d)", plain)
    finals = _final_frames(shown)
    assert len(finals) == 3, finals
    for frame in finals:
        assert all(len(line) <= COLUMNS for line in frame), frame
        bars = [m for m in map(_BAR.match, frame) if m]
        assert bars, frame
        for bar in bars:  # every bar ends complete, its clock stopped
            assert bar["done"] == bar["total"] and bar["time"].startswith("done in "), frame
    generate, audit, tune = finals
    steps = next(m for m in map(_BAR.match, generate) if m and "token steps" in m["name"])
    assert int(steps["total"]) < 20 and "  every demo ended before step 20" in generate, generate
    assert any(m and "demo sets" in m["name"] and m["total"] == "3"
               for m in map(_BAR.match, audit)), audit
    assert any(m and "DP-SGD steps" in m["name"] for m in map(_BAR.match, tune)), tune
    # while it trains, DP-SGD's bar shows at 80 columns with its time named (its time left once it has moved:
    # which frames the terminal drew between four quick steps depends on the machine's load, so the time left is
    # checked on the bar's own text below, `test_a_running_bar_names_its_time_left_once_it_has_moved`)
    running = [m for frame in _frames(shown) for m in map(_BAR.match, frame)
               if m and "DP-SGD steps" in m["name"] and m["done"] != m["total"]]
    assert running and all(re.fullmatch(r"\d+:\d\d elapsed(, \d+:\d\d left)?", m["time"]) for m in running), running


def test_a_running_bar_names_its_time_left_once_it_has_moved():
    """A stage's time: elapsed only until the bar moves past its first report, then elapsed and left at the
    average rate since that report; `done in` once it ends."""
    from rich.progress import Progress

    from flows.cli.progress import time_text

    progress = Progress(auto_refresh=False)
    task_id = progress.add_task("DP-SGD steps", total=8, first=0)
    task = progress.tasks[0]
    task.start_time = task.get_time() - 30.0  # it started 30 s ago
    assert re.fullmatch(r"0:3\d elapsed", time_text(task))
    progress.update(task_id, completed=2)
    assert re.fullmatch(r"0:3\d elapsed, 1:3\d left", time_text(task)), time_text(task)  # 6 more at 15 s each
    progress.update(task_id, completed=8)
    progress.stop_task(task_id)
    assert time_text(task).startswith("done in ")


def test_dpsgd_without_public_validation_examples_says_so_instead_of_a_nan_loss():
    from tasks.tune import UNVALIDATED_LOG, _training_progress

    lines: list[str] = []

    class Logger:
        def info(self, fmt, *args):
            lines.append(fmt % args)

    progress = _training_progress("dpsgd-eps8-0", 8.0, 0, Logger(), validated=False)
    for step in (1, 2):
        progress(step, 2, {"val_loss": math.nan, "epsilon": 4.0 * step})
    lines.append(UNVALIDATED_LOG % ("dpsgd-eps8-0", 2))
    assert lines and not any("nan" in line for line in lines), lines
    assert lines[-1].startswith("dpsgd-eps8-0: 2 steps, no validation loss: no public validation examples"), lines
    assert "epsilon spent 8.000" in lines[1], lines
