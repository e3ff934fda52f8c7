"""Parquet tables and run manifests: atomic writes and content hashes.

Every file is written to a temporary name in the same folder and renamed into place,
so a crash never leaves a half-written table and never clobbers a good one.
Tables named in `PRIVATE_TABLES` may only be written under the private store.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dpcore.errors import ConfigError
from dpcore.home import is_private_path
from dpcore.names import current_method_names
from dpcore.public_outputs import Kind, declare

# A run's public record of what it was made from, written when its data is ingested and sealed by the run's
# manifest with its other files: the task spec's content and resolved path, the run's delta and where it came
# from (`tasks.run_plans.DELTA_SOURCES`). What a release of the run needs, from any working directory.
RUN_INPUTS_FILE = "run_inputs.json"

# Tables holding private record text, the ids of the real demos of the random-real baseline, or
# per-record functions of private data (test predictions with ids and probabilities, membership scores).
PRIVATE_TABLES = frozenset({"records", "partitions", "real_demos", "predictions", "mia_scores", "teacher_assignments",
                            "vote_histograms", "pate_predictions"})


def _atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    return _atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_text_atomic(path: Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def jsonable(value: Any) -> Any:
    """Infinity is written as the string "inf" (JSON has no infinity); NaN as null."""
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return None
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if hasattr(value, "item") and callable(value.item):
        return jsonable(value.item())
    return value


def write_json_atomic(path: Path, obj) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_table(frame: pd.DataFrame, path: Path) -> Path:
    """Write a DataFrame as Parquet atomically. A private table outside the private store is refused."""
    path = Path(path)
    if path.stem in PRIVATE_TABLES and not is_private_path(path):
        raise PermissionError(f"table {path.stem!r} holds private records and must be written under $DPICL_HOME/private")
    table = pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False)
    return _atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_table(path: Path) -> pd.DataFrame:
    """A Parquet table; a `method` column written under an old name (`dp`) reads as today's (`tang`)."""
    return current_method_names(pd.read_parquet(path))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# a manifest's digests: of the folder's public files, each compared in full where it is read (`dpcore.public_outputs`)
declare("file:*manifest.json", Kind.DP, "/files/**")
declare("file:*manifest.json", Kind.IDENTITY, "/data_hash", "/content_hash")


def write_manifest(folder: Path, extra: dict | None = None) -> Path:
    """`manifest.json`: the sha256 of every file under `folder` (except the manifest itself)."""
    folder = Path(folder)
    files = {
        str(path.relative_to(folder)): file_sha256(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != "manifest.json" and not path.name.startswith(".")
    }
    return write_json_atomic(folder / "manifest.json", {"files": files, **(extra or {})})


def verify_manifest(folder: Path) -> list[str]:
    """Files whose content no longer matches the manifest (empty when all match)."""
    manifest = json.loads((Path(folder) / "manifest.json").read_text())
    return [name for name, digest in manifest["files"].items()
            if not (Path(folder) / name).exists() or file_sha256(Path(folder) / name) != digest]


def check_writable_place(path: Path, flag: str, value: Any) -> None:
    """What a command will write at `path` can be made: the first folder on the path that exists is a folder
    this process can write (ConfigError naming `flag` and the `value` given). Checked before any work."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{flag} {value}: {probe} is a file, so the folder cannot be made")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {value}: {probe} is not writable")
