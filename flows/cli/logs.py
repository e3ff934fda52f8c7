"""Where the CLI's logs go: the command's own output on the terminal, library logs in a file.

`dpicl` writes a logging configuration for Prefect (`PREFECT_LOGGING_SETTINGS_PATH`, read by
this process and inherited by the temporary Prefect server it may start) under
`$DPICL_HOME/logs/` on every start:

- the terminal (stderr) shows dpicl's own loggers (`dpicl.*`, `dpcore.*`, `tasks.*`,
  `flows.*`) and the pipeline's flow/task run messages at INFO, and errors of any library;
- everything at INFO and above, Prefect's HTTP and server logs included, goes to
  `$DPICL_HOME/logs/dpicl.log`;
- `dpicl -v COMMAND` shows everything at DEBUG on the terminal too.

User errors and refusals (`DpiclError`) are printed without a traceback on the terminal (the log
file keeps it): a refusal is an answer, not a crash.
"""

from __future__ import annotations

import copy
import functools
import logging
import logging.config
import os
import sys
from pathlib import Path

import yaml

from dpcore.errors import DpiclError
from dpcore.home import subdir

LOG_FILENAME = "dpicl.log"
OWN_LOGGERS = ("dpicl", "dpcore", "tasks", "flows")
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
QUIET_LIBRARY_LOGGERS = ("uvicorn", "fastapi", "prefect._internal", "prefect.extra")


@functools.cache
def _prefect_dir() -> str:
    import prefect

    return str(Path(prefect.__file__).parent)


class TerminalHandler(logging.StreamHandler):
    """stderr, with no traceback for a `DpiclError` (a clear refusal or user error).

    Flow and task run loggers carry both dpicl's own task messages and Prefect's engine
    messages ("Beginning flow run", "Finished in state Failed(...)"); the terminal keeps the
    former only: the engine's lines repeat what the command itself prints, and stay in the log
    file.
    """

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # the current stderr: while progress bars show, rich prints above them
        if record.name.startswith(RUN_LOGGERS) and record.pathname.startswith(_prefect_dir()):
            return
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, DpiclError):
            record = copy.copy(record)
            record.exc_info, record.exc_text = None, None
        super().emit(record)


def logging_config(log_file: Path, verbose: bool) -> dict:
    """A `logging.config.dictConfig` mapping in Prefect's logging.yml shape."""
    terminal_level = "DEBUG" if verbose else "INFO"
    fmt = "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "standard": {
                "()": "prefect.logging.formatters.PrefectFormatter",
                "format": fmt,
                "flow_run_fmt": "%(asctime)s.%(msecs)03d | %(levelname)-7s | Flow run %(flow_run_name)r - %(message)s",
                "task_run_fmt": "%(asctime)s.%(msecs)03d | %(levelname)-7s | Task run %(task_run_name)r - %(message)s",
                "datefmt": "%H:%M:%S",
            },
        },
        "handlers": {
            "terminal": {"level": terminal_level, "class": "flows.cli.logs.TerminalHandler", "formatter": "standard",
                         "stream": "ext://sys.stderr"},
            "terminal_errors": {"level": "DEBUG" if verbose else "ERROR", "class": "flows.cli.logs.TerminalHandler",
                                "formatter": "standard", "stream": "ext://sys.stderr"},
            "file": {"level": "DEBUG" if verbose else "INFO", "class": "logging.FileHandler",
                     "filename": str(log_file), "encoding": "utf-8", "formatter": "standard"},
            "api": {"level": 0, "class": "prefect.logging.handlers.APILogHandler"},
            "worker_api": {"level": 0, "class": "prefect.logging.handlers.WorkerAPILogHandler"},
        },
        "loggers": {
            "prefect": {"level": "${PREFECT_LOGGING_LEVEL}"},
            **{name: {"level": terminal_level, "handlers": ["terminal", "file"], "propagate": False}
               for name in OWN_LOGGERS},
            **{name: {"level": "NOTSET", "handlers": ["api", "terminal", "file"], "propagate": False}
               for name in RUN_LOGGERS},
            "prefect.workers": {"level": "NOTSET", "handlers": ["worker_api", "file"], "propagate": False},
            **{name: {"level": "INFO", "handlers": ["file"], "propagate": False} for name in QUIET_LIBRARY_LOGGERS},
        },
        "root": {"level": "DEBUG" if verbose else "INFO", "handlers": ["file", "terminal_errors"]},
    }


def configure_cli_logging(verbose: bool) -> Path:
    """Write the logging configuration under $DPICL_HOME/logs/ and apply it; returns the log file.

    Prefect applies the whole configuration itself when a command first imports it (`prefect.main` reads
    PREFECT_LOGGING_SETTINGS_PATH at import); until then the same routing without Prefect's handlers is in force,
    so a command that never starts a flow (`dpicl epsilon`, `ledger`, `export`, a refused argument) does not import
    Prefect (seconds) to log."""
    folder = subdir("logs")
    log_file = folder / LOG_FILENAME
    settings = folder / "logging.yml"
    config = logging_config(log_file, verbose)
    tmp = settings.with_suffix(f".yml.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    tmp.replace(settings)
    os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = str(settings)
    if not verbose:  # MLflow installs its own stderr handler at import: keep its INFO lines off the terminal
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if "prefect.main" in sys.modules:  # imported already: it read the settings before they were written
        from prefect.logging.configuration import setup_logging

        setup_logging(incremental=False)
    else:
        logging.config.dictConfig(_without_prefect(config))
    return log_file


def _without_prefect(config: dict) -> dict:
    """`config` with a plain formatter and without Prefect's API handlers (the same lines to the same places)."""
    config = copy.deepcopy(config)
    standard = config["formatters"]["standard"]
    config["formatters"]["standard"] = {"format": standard["format"], "datefmt": standard["datefmt"]}
    prefect_handlers = {name for name, handler in config["handlers"].items()
                        if handler["class"].startswith("prefect.")}
    for name in prefect_handlers:
        del config["handlers"][name]
    config["loggers"].pop("prefect", None)  # its level is a Prefect setting, read by Prefect
    for logger in (*config["loggers"].values(), config["root"]):
        if "handlers" in logger:
            logger["handlers"] = [h for h in logger["handlers"] if h not in prefect_handlers]
    return config
