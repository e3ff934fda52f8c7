"""Error types shared by dpcore, and the one check of a positive parameter. Messages name files,
rows, columns and parameters, never a private record's text."""

import math
from collections.abc import Callable


class DpiclError(Exception):
    """Base class for errors reported to users with a clear message (CLI exit code 2)."""

    exit_code = 2
    kind = "error"  # how the CLI names it: "error" for bad input, "refused" for a refusal


class ConfigError(DpiclError, ValueError):
    """A parameter is out of range or inconsistent. The message names the parameter."""


class DataValidationError(DpiclError, ValueError):
    """A dataset file is unusable. The message names the file, row and column."""


class ModelNotFoundError(DpiclError, FileNotFoundError):
    """No model could be resolved from a name. The message lists everything that was tried."""


class EndpointError(DpiclError):
    """A model server cannot answer (unreachable, timed out, refused the request or the key); the message
    names the endpoint and what to check, never the API key or a prompt."""


class BudgetExceededError(DpiclError):
    """A run would spend more privacy than the dataset's budget (CLI exit code 3)."""

    exit_code = 3
    kind = "refused"


class SameRecordsError(DpiclError):
    """A charge under one dataset id on records another id already spends on (CLI exit code 3)."""

    exit_code = 3
    kind = "refused"


class ReleaseRefusedError(DpiclError):
    """A release gate condition failed; the message lists every failed condition (CLI exit code 4)."""

    exit_code = 4
    kind = "refused"


class RunStopped(DpiclError):
    """The user asked the run to stop (Ctrl-C, SIGTERM): running stages end at their next step (CLI exit 130).
    Charges already made stay charged."""

    exit_code = 130
    kind = "stopped"


def is_stop(exc: BaseException) -> bool:
    """Whether `exc` ends a run on request rather than by a fault: `RunStopped`, or what is no `Exception`
    (Ctrl-C's KeyboardInterrupt, SIGTERM as Prefect's TerminationSignal). A loop that keeps state keeps its
    last finished step on a stop, so that a resume continues from it."""
    return isinstance(exc, RunStopped) or not isinstance(exc, Exception)


def stop_if_requested(should_stop: Callable[[], bool] | None, what: str) -> None:
    """`RunStopped` when the caller's `should_stop()` says so. Long loops (the audit's forward passes) call it
    between steps: dpcore never watches signals itself, its caller passes the question in."""
    if should_stop is not None and should_stop():
        raise RunStopped(f"{what} stopped on request")


def check_positive(name: str, value) -> float:
    """`value` as a finite float > 0, else a ConfigError naming the parameter `name`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number > 0, got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value}")
    return number
