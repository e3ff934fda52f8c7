"""Change detection for scheduled regeneration.

The scheduled flow regenerates demonstrations only when the private records changed
since the last successful run of the same dataset id; otherwise it spends no privacy.
State lives in `$DPICL_HOME/regeneration/<dataset_id>.json` (written atomically after
a successful run, so a failed run is retried on the next schedule).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dpcore.data.artifacts import write_json_atomic
from dpcore.home import subdir


@dataclass(frozen=True)
class RefreshDecision:
    dataset_id: str
    content_hash: str
    last_hash: str | None
    last_run_id: str | None

    @property
    def changed(self) -> bool:
        return self.content_hash != self.last_hash


def _state_path(dataset_id: str, folder: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", dataset_id)
    return (folder or subdir("regeneration")) / f"{safe}.json"


def decide(dataset_id: str, content_hash: str, folder: Path | None = None) -> RefreshDecision:
    """Compare the current content hash of the private records with the last successful run's."""
    path = _state_path(dataset_id, folder)
    state = json.loads(path.read_text()) if path.exists() else {}
    return RefreshDecision(dataset_id, content_hash, state.get("content_hash"), state.get("run_id"))


def record_success(dataset_id: str, content_hash: str, run_id: str, folder: Path | None = None) -> Path:
    return write_json_atomic(
        _state_path(dataset_id, folder),
        {"dataset_id": dataset_id, "content_hash": content_hash, "run_id": run_id,
         "at": datetime.now(UTC).isoformat(timespec="seconds")},
    )
