"""What the resumable stages' tests share (`tasks.kept.KeptStage`): a stage marked right after its charge."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dpcore.errors import DpiclError


def assert_a_marked_stage_draws_once(keep_charged: Callable, draw: Callable, call: Callable, folder: Path) -> None:
    """Marked right after the charge and never begun (`folder` holds its `.pending` mark), a stage is drawn once
    and its mark gives way to the kept state; a stage no attempt charged is refused. `call(run, charged)`: the
    stage's keyword arguments for run `run` ("marked", then "never-charged")."""
    keep_charged(call("marked", True))
    assert [p.suffix for p in folder.iterdir()] == [".pending"]
    draw(**call("marked", False))
    assert [p.suffix for p in folder.iterdir()] == [".json"]
    with pytest.raises(DpiclError, match="did not charge the spend"):
        draw(**call("never-charged", False))
