"""Shared CLI plumbing: flags built from `RunConfig` fields, JSON output, error exits.

Flag names are RunConfig's flat field names with dashes (`num_subsets` -> `--num-subsets`; a section's field
under its prefix, `pate_teachers` -> `--pate-teachers`), so the CLI, flow parameters, prefect.yaml and MLflow params
share one vocabulary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dpcore.config import FLAT_FIELDS, SECTIONS, RunConfig
from dpcore.data.artifacts import check_writable_place, jsonable
from dpcore.data.datasets import read_jsonl
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import ConfigError, DataValidationError, DpiclError
from dpcore.flags import FLAG_SPELLINGS, flag

__all__ = ["add_config_flags", "add_output_flags", "check_out_file", "checked_config", "command", "config_from_args",
           "fmt_value", "parse_epsilon", "print_json", "read_queries", "say"]

# CLI spellings that differ from the RunConfig field name (documented in docs/).
FLAG_ALIASES = FLAG_SPELLINGS
# RunConfig fields that every command reading private records takes: where the records are, whose budget
# they spend, and the model that reads them.
DATA_FLAGS = ["dataset", "data_path", "test_path", "task_spec", "dataset_id", "new_budget_for_same_records", "model",
              "device", "dtype"]
# Algorithm 1's generation parameters (Tang et al.), for the commands that generate demos.
GENERATION_FLAGS = ["mechanism", "sampler", "num_subsets", "subset_size", "top_k", "rvp", "max_tokens",
                    "max_record_tokens"]


def _is_bool(annotation) -> bool:
    return annotation is bool


def _flag_type(name: str, annotation) -> Any:
    """argparse `type=` for a RunConfig field: a bad value is reported with the flag's own name
    ("argument --max-tokens: expected an integer, got 'abc'")."""
    base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    origin = typing.get_origin(annotation)
    if origin is list:  # comma-separated lists (epsilons, baselines): RunConfig validates the items
        return None
    optional = type(None) in typing.get_args(annotation)
    if int in base and float not in base:
        kind, convert = "an integer", int
    elif float in base or int in base:
        kind, convert = "a number", float
    else:
        return None

    def parse(text: str):
        if optional and text.strip().lower() == "none":
            return None
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}{' or none' if optional else ''}, got {text!r}") from None

    parse.__name__ = name
    return parse


def command(subparsers, name: str, handler, *, help: str, description: str | None = None,
            **options) -> argparse.ArgumentParser:
    """One `dpicl NAME` subcommand: its parser, with the function that handles it."""
    parser = subparsers.add_parser(name, help=help, description=description, **options)
    parser.set_defaults(handler=handler)
    return parser


def add_output_flags(parser: argparse.ArgumentParser, *, out: bool = False, run_id: bool = False,
                     json_help: str = "print one JSON object") -> None:
    """The flags that say where a command writes (`--out`, `--run-id`) and `--json`, last in its help."""
    if out:
        parser.add_argument("--out", default=None, help="output folder (default: under $DPICL_HOME/runs/)")
    if run_id:
        parser.add_argument("--run-id", default=None,
                            help="name of the run folder (default: <UTC start>-<flow run id>)")
    parser.add_argument("--json", action="store_true", help=json_help)


def add_config_flags(parser: argparse.ArgumentParser, fields: list[str], aliases: dict[str, str] | None = None) -> None:
    """Add `--field-name` flags for the given RunConfig fields (flat names); unset flags keep RunConfig defaults.

    Each flag's help is the field's description (paper symbol included) and its default. `aliases`:
    a shorter spelling shown first for some fields (`{"pate_teachers": "--teachers"}`).
    """
    aliases = aliases or {}
    for name in fields:
        info = RunConfig.flat_field(name)
        annotation = info.annotation
        default = info.get_default(call_default_factory=True)
        shown = ",".join(str(v) for v in default) if isinstance(default, list) else default
        description = info.description or ""
        help_text = description if "default" in description else f"{description} (default: {shown})".strip()
        help_text = help_text.replace("%", "%%")
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
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType) and \
                [typing.get_origin(a) for a in args if a is not type(None)] == [typing.Literal]:  # Literal | None
            # (a list of Literals, `--methods tang,pate`, is a comma-separated value: no choices)
            choices = [v for a in args if a is not type(None) for v in typing.get_args(a)]
        parser.add_argument(*([aliases[name]] if name in aliases else []), flag, dest=name, default=None, choices=choices, help=help_text,
                            type=_flag_type(name, annotation),
                            metavar=name.upper() if choices is None else None)


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    """The command's `RunConfig`; its delta, when not given, is the dataset's budget delta (if a budget is
    set): a run composes with its budget at one delta. A --delta that differs from the budget's is said
    here, before anything is charged. A task that does not load (a misspelt name, a bad YAML) is refused first."""
    values = {name: getattr(args, name) for name in RunConfig.flat_names() if getattr(args, name, None) is not None}
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = RunConfig.model_validate(values)
    load_task_spec(config.task_spec or config.dataset)
    # dp-accounting (through the ledger) loads here, not for `dpicl --help` nor for a task that does not load
    from tasks.charge import budget_delta

    budget = budget_delta(config.ledger_id)
    if budget is not None and config.delta is None:
        say(f"note: delta = {budget:.3g}, the delta of the budget of ledger id '{config.ledger_id}' (pass --delta "
            "to choose another)")
        return config.with_updates(delta=budget)
    if budget is not None and config.delta != budget:
        say(f"note: --delta {config.delta:.3g} differs from the delta {budget:.3g} of the budget of ledger id "
            f"'{config.ledger_id}': the budget check composes this run's spends at {budget:.3g}")
    return config


def checked_config(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    """`config_from_args`, a bad value a `ConfigError` naming the field (`num_subsets: Input should be ...`)."""
    try:
        return config_from_args(args, **overrides)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None
    except DpiclError:  # a task that does not load: said as it is
        raise
    except ValueError as exc:  # an int flag that is not an int
        raise ConfigError(str(exc)) from None


def check_out_file(flag: str, value: str | None) -> Path | None:
    """A file a command will write (`--out FILE`), checked before any work: not a folder, and the first folder
    on its path that exists is a writable folder (the file is written atomically, its folders made)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_dir():
        raise ConfigError(f"{flag} {value}: is a folder; name the file to write")
    check_writable_place(path.parent, flag, value)
    return path


def read_queries(value: str) -> list[dict]:
    """`predict --input FILE`: a row per JSONL line, its `line` number and its fields, a non-empty `text` in each."""
    path = Path(value)
    if not path.exists():
        raise DataValidationError(f"{path}: file not found")
    rows = []
    for obj in read_jsonl(path):
        line_no = obj.pop("__line__")
        if not isinstance(obj.get("text"), str) or not obj["text"].strip():
            raise DataValidationError(f"{path}: line {line_no}: column 'text': expected a non-empty string")
        rows.append({"line": line_no, **obj})
    return rows


def say(line: str) -> None:
    """A line a person must read before anything is spent (a warning), on stderr at once."""
    print(line, file=sys.stderr, flush=True)


def validation_problems(exc) -> str:
    """A pydantic ValidationError of RunConfig as one line naming each flag and its field
    (`--dpsgd-clip (dpsgd_clip): Input should be greater than 0`); a section's field by its flat name."""
    problems = []
    for err in exc.errors():
        message = err["msg"].removeprefix("Value error, ")
        field = str(err["loc"][0]) if err["loc"] else ""
        if field in SECTIONS:  # (section, field): the field's flat name; (section,): its own check, which names it
            field = SECTIONS[field].flat_name(str(err["loc"][1])) if len(err["loc"]) > 1 else ""
        if field in FLAT_FIELDS:
            message = message.removeprefix(f"{field}: ")  # a validator that names its own field
            problems.append(f"{flag(field)}: {message}")
        else:
            problems.append(f"{field}: {message}" if field else message)
    return "; ".join(problems) or str(exc)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(jsonable(obj), sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_epsilon(text: str) -> float:
    """`inf` means sigma = 0 (epsilon = infinity); `0` means instruction-only generation."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or inf, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"epsilon must be >= 0 or inf, got {text!r}")
    return value


def fmt_value(value, spec: str = ".3f") -> str:
    """A number for a terminal table: `-` for none, `inf`, a string as it is, else `format(value, spec)`."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)
