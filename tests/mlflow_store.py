"""The MLflow store of a fresh test home: a copy of one empty store migrated to this environment's MLflow schema,
made once per environment (beside the converted models) by the first process that needs it, as a home that has
run before has one, instead of MLflow's migrations in every test home (about 2.5 s of CPU each). Standard library
only until a store has to be made."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path


def migrated(cache: Path) -> Path | None:
    """The environment's empty migrated store under `cache`, made now if missing; None where `cache` cannot be
    written."""
    template = cache / f"mlflow-{metadata.version('mlflow')}-empty.db"
    if template.exists():
        return template
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / "mlflow-store.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one maker; the others wait for it
            if not template.exists():
                folder = Path(tempfile.mkdtemp(prefix="mlflow-store-", dir=cache))
                from mlflow.tracking import MlflowClient

                MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments(max_results=1)
                os.replace(folder / "mlflow.db", template)
                shutil.rmtree(folder, ignore_errors=True)
    except OSError:
        return None
    return template


def seed(home: Path, cache: Path) -> None:
    """Give `home` (a `$DPICL_HOME`) the migrated empty store unless it has a store already."""
    target = home / "mlflow" / "mlflow.db"
    template = None if target.exists() else migrated(cache)
    if template is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, target)
