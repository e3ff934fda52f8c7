"""Shared CLI plumbing: flags built from `RunConfig` fields, JSON output, error exits.

Flag names are RunConfig field names with dashes (`num_subsets` -> `--num-subsets`),
so the CLI, flow parameters, prefect.yaml and MLflow params share one vocabulary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import typing
from typing import Any

from dpcore.config import RunConfig

# CLI spellings the issue contracts fix, where they differ from the field name.
FLAG_ALIASES = {"rvp": "--no-rvp"}


def _is_bool(annotation) -> bool:
    return annotation is bool


def add_config_flags(parser: argparse.ArgumentParser, fields: list[str]) -> None:
    """Add `--field-name` flags for the given RunConfig fields; unset flags keep RunConfig defaults."""
    for name in fields:
        info = RunConfig.model_fields[name]
        annotation = info.annotation
        help_text = (info.description or "").replace("%", "%%")
        if _is_bool(annotation):
            if name == "rvp":
                parser.add_argument("--no-rvp", dest="rvp", action="store_false", default=None,
                                    help="turn off reduce-vocabulary-publicly (Algorithm 1 lines 7-10)")
                parser.add_argument("--rvp", dest="rvp", action="store_true", default=None, help=argparse.SUPPRESS)
            else:
                flag = "--" + name.replace("_", "-")
                parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                                    help=help_text)
            continue
        flag = "--" + name.replace("_", "-")
        args = typing.get_args(annotation)
        choices = None
        if typing.get_origin(annotation) is typing.Literal:
            choices = list(args)
        parser.add_argument(flag, dest=name, default=None, choices=choices, help=help_text,
                            metavar=name.upper() if choices is None else None)


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    values = {name: getattr(args, name) for name in RunConfig.model_fields if getattr(args, name, None) is not None}
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("seed", "test_size", "num_subsets", "subset_size", "top_k", "max_tokens", "shots", "seeds",
                "audit_trials", "audit_demo_sets", "audit_members", "overlap_threshold"):
        if isinstance(values.get(key), str):
            values[key] = None if values[key].lower() == "none" else int(values[key])
    return RunConfig.model_validate(values)


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


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(obj), sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_epsilon(text: str) -> float:
    """`inf` means sigma = 0 (epsilon = infinity); `0` means instruction-only generation."""
    value = float(text)
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"epsilon must be >= 0 or inf, got {text!r}")
    return value
