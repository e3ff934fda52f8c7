"""The accountants' answers on disk: `$DPICL_HOME/cache/accounting/<kind>-<digest>.json`.

A composition or a calibration is a pure function of public parameters (mechanism, sigma, q, T, delta)
and of the code that computes it, and costs seconds to minutes; a scheduled run repeats the same
calibrations on every refresh, and the ledger composes the same entries again for a dry run, its charge
and every report. Each answer is stored
under its full key: the inputs, this format, the accountants' versions and a digest of the code that
computes it (`composition.py`, where every accountant call lives, the events it reads, this module and
Algorithm 1's front `dpcore/fewshot/accounting.py`), so a change to any of them is a miss, never a
stale answer. A file is read back only when its stored key equals the key asked for;
an unreadable file is a miss (with a warning), and files are written atomically, so processes that
share a home (the pipeline's workers, a CLI beside a scheduled run) never read half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from dpcore.home import subdir

logger = logging.getLogger(__name__)

FORMAT = 4  # bump when what is stored changes shape
CacheDir = Path | str | None | Literal[False]  # None: the home's cache/accounting; False: no disk cache


def accountant_versions() -> dict[str, str]:
    """Versions of the two accountants (for release manifests and cache keys)."""
    return dict(_versions())


@cache  # installed packages do not change under a running process
def _versions() -> tuple[tuple[str, str], ...]:
    versions = []
    for name in ("prv-accountant", "dp-accounting"):
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, "unknown"))
    return tuple(versions)


# The code an answer depends on: the numerics, the events they read, this store and Algorithm 1's front.
_CODE = ("privacy/composition.py", "privacy/events.py", "privacy/memo.py", "fewshot/accounting.py")


@cache
def _code_digest() -> str:
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in _CODE:
        digest.update((package / name).read_bytes())
    return digest.hexdigest()[:16]


def folder(cache_dir: CacheDir = None) -> Path | None:
    if cache_dir is False:
        return None
    if cache_dir is None:
        return subdir("cache/accounting")
    path = Path(cache_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def key(kind: str, **inputs: Any) -> dict[str, Any]:
    """The full key of an answer; floats by `repr` (exact: 0.1 and 0.1000000001 are other answers)."""
    full = {"kind": kind, "format": FORMAT, "versions": accountant_versions(), "code": _code_digest()}
    full.update({name: _exact(value) for name, value in inputs.items()})
    return full


def _exact(value: Any) -> Any:
    """A key's value with every float, also inside lists and tuples, as its `repr`."""
    if isinstance(value, list | tuple):
        return [_exact(item) for item in value]
    return repr(value) if isinstance(value, float) else value


def _path(where: Path, full_key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(full_key, sort_keys=True).encode()).hexdigest()[:32]
    return where / f"{full_key['kind']}-{digest}.json"


def get(where: Path | None, full_key: dict[str, Any]) -> dict[str, Any] | None:
    """The stored answer of `full_key`, or None (no folder, no file, another key, an unreadable file)."""
    if where is None:
        return None
    path = _path(where, full_key)
    try:
        data = json.loads(path.read_text())
        if data.get("key") != full_key:
            return None
        return data["value"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring unreadable accounting cache file %s (%s)", path, type(exc).__name__)
        return None


def put(where: Path | None, full_key: dict[str, Any], value: dict[str, Any]) -> None:
    """Store an answer (atomically: a temporary file renamed over the target); a failure is a warning."""
    if where is None:
        return
    path = _path(where, full_key)
    try:
        with tempfile.NamedTemporaryFile("w", dir=where, prefix=f".{path.name}.", delete=False) as handle:
            json.dump({"key": full_key, "value": value}, handle, sort_keys=True)
        os.replace(handle.name, path)
    except OSError as exc:
        logger.warning("could not write the accounting cache in %s (%s)", where, exc)
