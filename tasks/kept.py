"""A noisy stage's kept state and charge mark in a run's private folder: what lets a stopped run resume under its
id without drawing any step twice (tang's and AdaDPSyn's generations, DP-OPT's instruction, DP-ICL's answers).

`<folder>/<name>.json` holds the stage's state after its last finished step (its DP outputs so far and its noise
generators' states: private, they predict every later draw) under the fingerprint of the stage's public inputs;
`<folder>/<name>.pending` marks a stage this attempt charged that has not begun (written right after the charge,
removed at the first kept step). A retry continues from a state of the same fingerprint, draws a marked stage
once, and refuses anything else the run charged before.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dpcore.data.artifacts import write_text_atomic
from dpcore.home import is_private_path
from tasks.common import digest


@dataclass(frozen=True)
class KeptStage:
    """One stage's kept state and mark (`folder`: under the run's private folder; `fields`: the fingerprint of its
    public inputs)."""

    folder: Path
    name: str
    fields: str

    @classmethod
    def at_epsilon(cls, private_run_dir: str, method: str, epsilon: float, inputs: dict) -> KeptStage:
        """A method's stage at one epsilon: `<method>/eps<E>-<digest>` in the run's private folder, its fingerprint
        the digest of `inputs` (the stage's public inputs)."""
        text = "inf" if math.isinf(epsilon) else f"{epsilon:g}"
        return cls(Path(private_run_dir) / method, f"eps{text}-{digest([method, epsilon])[:8]}", digest(inputs))

    def __post_init__(self) -> None:
        if not is_private_path(self.folder / self.name):
            raise PermissionError(f"{self.name}: a stage's kept state belongs in the private store")

    @property
    def state_path(self) -> Path:
        return self.folder / f"{self.name}.json"

    @property
    def mark_path(self) -> Path:
        return self.folder / f"{self.name}.pending"

    def state(self) -> dict | None:
        """The kept state, when it was kept for these inputs."""
        kept = _read(self.state_path)
        return kept["state"] if kept is not None and kept.get("fields") == self.fields else None

    def marked(self) -> bool:
        """Charged by an earlier attempt of the run for these inputs, and not begun."""
        mark = _read(self.mark_path)
        return mark is not None and mark.get("fields") == self.fields

    def keep(self, state: dict) -> None:
        """The state after a finished step; the stage has begun, so its mark goes."""
        write_text_atomic(self.state_path, json.dumps({"fields": self.fields, "state": state}) + "\n")
        self.mark_path.unlink(missing_ok=True)

    def mark(self) -> None:
        """Right after the charge: charged and not begun (nothing to mark once a state is kept)."""
        if not self.state_path.exists():
            write_text_atomic(self.mark_path, json.dumps({"fields": self.fields}) + "\n")


def mark_if_charged(call: dict, kept: KeptStage | None) -> None:
    """Right after the charge: mark the stage of `call` when this attempt charged it (`noise_charged`)."""
    if call.get("noise_charged") and kept is not None:
        kept.mark()


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


__all__ = ["KeptStage", "mark_if_charged"]
