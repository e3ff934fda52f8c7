"""The hook point of `dpicl serve --private` and `dpicl predict --private`: a private-prediction method (one whose
answers are computed on private records, each batch of queries charged to the ledger before it is answered) fills
it from its own CLI module, when that module is imported (`flows.cli` imports every command module before any
registers its parser); `serve` and `predict` then add `--private` and the method's flags, and hand the parsed
arguments to the method. Without a registered method neither command has `--private`.

`--private` names one method: a second registered under another name is refused (it would need `--private NAME`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Listener:
    """Where `dpicl serve` listens (its port checked free) and how it serves an app there."""

    url: str  # http://127.0.0.1:PORT
    serve: Callable[[Any, str], int]  # (ASGI app, its start line on stderr) -> exit status, once Ctrl-C or SIGTERM


def _no_flags(parser: argparse.ArgumentParser) -> None:
    """A command the method adds no flag to (apart from `--private`)."""


@dataclass(frozen=True)
class PrivatePrediction:
    """A method's `serve --private` and `predict --private`: their help, its flags and what runs them."""

    name: str  # the method (`dpcore.names.METHODS`)
    serve_help: str  # `serve --private`'s help
    predict_help: str  # `predict --private`'s help
    serve: Callable[[argparse.Namespace, Listener], int]  # after serve's own checks (port free, its flags unused)
    predict: Callable[[argparse.Namespace], int]  # predict's arguments; every check of them is the method's
    add_serve_flags: Callable[[argparse.ArgumentParser], None] = _no_flags  # after `--private`
    add_predict_flags: Callable[[argparse.ArgumentParser], None] = _no_flags  # after `--private`
    serve_only: tuple[str, ...] = ()  # the destinations of serve flags that apply to `--private` only


_METHODS: dict[str, PrivatePrediction] = {}


def register(method: PrivatePrediction) -> None:
    """Fill the hook point (again, under the same name: replaced)."""
    others = sorted(set(_METHODS) - {method.name})
    if others:
        raise ValueError(f"--private already serves {others[0]}; {method.name} would need `--private NAME`")
    _METHODS[method.name] = method


def registered() -> PrivatePrediction | None:
    """The method `--private` runs, if one is registered."""
    return next(iter(_METHODS.values()), None)
