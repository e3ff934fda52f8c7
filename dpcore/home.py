"""The project home: everything dpicl writes lives under $DPICL_HOME (default ./.dpicl).

Layout:
    models/        converted model cache
    prefect/       PREFECT_HOME (server database, settings)
    mlflow/        mlflow.db (SQLite store) and artifacts/
    runs/          run artifacts: runs/<dataset>/<data-hash>/<run-id>/
    private/       the private store (mode 0700): private records and tables
    cache/         accounting calibration cache and task result cache
    ledger.db      the privacy budget ledger
    config/        XDG_CONFIG_HOME, so nothing is written under ~
    hf/            HF_HOME
"""

from __future__ import annotations

import os
from pathlib import Path

from dpcore.errors import ConfigError


def dpicl_home() -> Path:
    """The absolute project home, created on first use."""
    home = Path(os.environ.get("DPICL_HOME", "./.dpicl")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def subdir(name: str) -> Path:
    path = dpicl_home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_run_dir(run_id: str, home: Path) -> Path:
    """The public folder of `run_id` (`runs/<dataset>/<data-hash>/<run-id>/`); a clear error when it is missing or
    ambiguous."""
    matches = [p for p in (home / "runs").glob(f"*/*/{run_id}") if p.is_dir()]
    if not matches:
        raise ConfigError(f"run {run_id!r}: no run folder under {home / 'runs'} (see `dpicl run` output)")
    if len(matches) > 1:
        raise ConfigError(f"run {run_id!r}: several run folders match: {', '.join(str(m) for m in matches)}")
    return matches[0]


def private_dir() -> Path:
    """The private store. Only DP outputs, aggregates and configuration leave it."""
    path = dpicl_home() / "private"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def content_key() -> bytes:
    """The secret key of this home's content hashes (`private/content.key`, made once, mode 0600).

    A plain hash of the private records would be a public oracle: someone who knows all records but
    one could test candidates for the last one against the published hash. Keyed, the hash only says
    whether two runs read the same records."""
    path = private_dir() / "content.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) == 32:
            return key
        raise RuntimeError(f"{path}: not a 32-byte key; remove it to make a new one (every data hash changes)") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(os.urandom(32))
    return path.read_bytes()


def is_private_path(path: Path) -> bool:
    try:
        Path(path).resolve().relative_to(private_dir())
        return True
    except ValueError:
        return False


# A run without PREFECT_API_URL starts a temporary Prefect server for itself, on the home's SQLite file. Its
# event feed and automations would live no longer than the run, and they add writers to that file, whose lock
# (Prefect waits up to 60 s for it) made a stopped run take up to a minute to record its end under load. Flow
# runs, task runs, logs and artifacts are kept. A long-lived server (`dpicl ui`) keeps Prefect's defaults.
TEMPORARY_SERVER_SETTINGS = {
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
}
_DEFAULTED: set[str] = set()  # the keys configure_environment set (a user's own values are never in it)


def configure_environment() -> Path:
    """Point every library's state (Hugging Face, Prefect, MLflow, XDG) under $DPICL_HOME.

    Called by the CLI and tests before Prefect or MLflow are imported; values a user
    already set explicitly are kept.
    """
    home = dpicl_home()
    defaults = {
        "DPICL_HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache" / "xdg"),
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        # Child Python processes (the temporary Prefect server runs `python -m uvicorn`) must not put
        # the working directory first on sys.path: a user's `inspect.py` there would shadow the stdlib.
        "PYTHONSAFEPATH": "1",
    }
    if not os.environ.get("PREFECT_API_URL"):
        defaults.update(TEMPORARY_SERVER_SETTINGS)
    for key, value in defaults.items():
        if key not in os.environ:
            os.environ[key] = value
            _DEFAULTED.add(key)
    for key in ("HF_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "PREFECT_HOME"):
        Path(os.environ[key]).mkdir(parents=True, exist_ok=True)
    return home


def long_lived_server_environment(environment: dict[str, str]) -> dict[str, str]:
    """`environment` for a Prefect server that outlives a run (`dpicl ui`): without the temporary server's
    settings that `configure_environment` set (a user's own values stay)."""
    return {key: value for key, value in environment.items()
            if not (key in TEMPORARY_SERVER_SETTINGS and key in _DEFAULTED)}
