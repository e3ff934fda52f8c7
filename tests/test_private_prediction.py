"""The hook point of `dpicl serve --private` and `dpicl predict --private` (`flows.cli.private_prediction`): the
generic commands name no method, DP-ICL fills it from its own CLI module, and any method registered there gets
`--private`, its flags and its handlers."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from flows.cli import private_prediction

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ("flows/cli/serve.py", "flows/cli/release.py", "flows/cli/private_prediction.py")
METHOD_MODULES = ("dpcore.dp_icl", "tasks.dp_icl", "flows.dp_icl", "flows.cli.dp_icl")


def _imported(path: Path) -> set[str]:
    """Every module `path` imports, at module level or in a function (`from a import b`: a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", GENERIC)
def test_the_generic_commands_import_no_method_of_their_own(name):
    imported = _imported(ROOT / name)
    named = sorted(m for m in imported if any(m == own or m.startswith(f"{own}.") for own in METHOD_MODULES))
    assert named == [], f"{name} imports {named}"


def test_serve_and_predict_still_take_private_with_dp_icls_flags():
    from flows.cli import build_parser

    parser = build_parser()  # imports every command module: DP-ICL's fills the hook point
    assert private_prediction.registered().name == "dp-icl"
    commands = _subparsers(parser)
    assert {"--private", "--epsilon", "--noise-multiplier", "--dataset"} <= set(commands["serve"]._option_string_actions)
    assert "--private" in commands["predict"]._option_string_actions
    assert parser.parse_args(["serve", "--private", "--epsilon", "1"]).private is True
    assert parser.parse_args(["predict", "--private", "--input", "q.jsonl"]).private is True
    assert parser.parse_args(["predict", "--input", "q.jsonl"]).private is False


def test_any_registered_method_gets_private_its_flags_and_its_handlers(monkeypatch, cli):
    """A method other than DP-ICL in the hook point: the commands add its `--private` help and flags, refuse its
    serve flags without `--private`, and hand `predict --private` to it."""
    from flows.cli import build_parser

    build_parser()  # every command module imported (DP-ICL's registered) before the hook point is swapped
    calls = []

    def add_flag(parser):
        parser.add_argument("--votes", type=int, default=None, help="votes per answer")

    method = private_prediction.PrivatePrediction(
        name="other", serve_help="serve OTHER", predict_help="ask an OTHER server",
        serve=lambda args, listener: calls.append(("serve", listener.url)) or 0,
        predict=lambda args: calls.append(("predict", args.input)) or 0,
        add_serve_flags=add_flag, serve_only=("votes",))
    monkeypatch.setattr(private_prediction, "_METHODS", {})
    private_prediction.register(method)
    with pytest.raises(ValueError, match="--private already serves other"):
        private_prediction.register(private_prediction.PrivatePrediction(
            name="third", serve_help="", predict_help="", serve=method.serve, predict=method.predict))

    commands = _subparsers(build_parser())
    assert commands["serve"]._option_string_actions["--private"].help == "serve OTHER"
    assert commands["predict"]._option_string_actions["--private"].help == "ask an OTHER server"
    assert "--votes" in commands["serve"]._option_string_actions and "--epsilon" not in commands["serve"]._option_string_actions
    code, out, err = cli(["predict", "--private", "--input", "q.jsonl"])
    assert (code, out, calls) == (0, "", [("predict", "q.jsonl")]), err
    code, out, err = cli(["serve", "--votes", "3", "--port", "1"])
    assert code == 2 and err.strip() == "dpicl serve: error: --votes: apply to --private only", err

    monkeypatch.setattr(private_prediction, "_METHODS", {})  # no method: no --private at all
    commands = _subparsers(build_parser())
    assert "--private" not in commands["serve"]._option_string_actions
    assert "--private" not in commands["predict"]._option_string_actions
