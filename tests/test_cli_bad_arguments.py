"""Every subcommand of `dpicl`, given a bad argument: exit code 2, one line on stderr naming what is wrong, no
traceback, nothing on stdout, before anything is loaded, read or written (`docs/cli.md`: a user error prints one
line). The table names a row for every subcommand the parser has: a new subcommand needs its row here."""

from __future__ import annotations

import argparse

import pytest

# (argv, what the one line names); FOLDER is an existing folder, QUERIES a valid queries file, LEDGER a fresh ledger
BAD_ARGUMENTS = [
    (["epsilon", "--noise-multiplier", "abc", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
     "argument --noise-multiplier"),
    (["calibrate", "--target-epsilon", "1e300", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
     "target_epsilon 1e+300 is above 100"),
    (["generate", "--epsilon", "abc"], "argument --epsilon"),
    (["evaluate", "--baseline", "zero-shot", "--batch-size", "abc"], "argument --batch-size"),
    (["audit", "--epsilon", "1", "--confidence", "2"], "--confidence: must lie in (0, 1)"),
    (["ledger"], "required: ACTION"),
    (["ledger", "show", "--delta", "abc"], "argument --delta"),
    (["ledger", "set-budget", "--dataset", "x", "--epsilon", "1e300", "--delta", "1e-5", "--ledger", "LEDGER"],
     "epsilon: a budget is at most 100"),
    (["ledger", "charge", "--dataset", "x", "--run-id", "r", "--content-hash", "h", "--noise-multiplier", "1",
      "--sampling-rate", "2", "--steps", "10", "--delta", "1e-5", "--ledger", "LEDGER"], "sampling_rate"),
    (["run", "--epsilons", "-1"], "--epsilons"),
    (["demo", "--delta", "tiny"], "argument --delta"),
    (["pate", "--epsilon", "abc"], "argument --epsilon"),
    (["dp-icl", "--epsilon", "0"], "argument --epsilon"),
    (["tune", "--epsilon", "1", "--length", "x"], "argument --length"),
    (["release", "--run", "no-such-run"], "run 'no-such-run'"),
    (["predict", "--input", "QUERIES", "--out", "FOLDER"], "--out FOLDER: is a folder"),
    (["predict", "--input", "FOLDER/missing.jsonl"], "missing.jsonl: file not found"),
    (["export", "--out", "FOLDER"], "--out FOLDER: is a folder"),
    (["serve", "--port", "abc"], "argument --port"),
    (["ui", "--mlflow-port", "abc"], "argument --mlflow-port"),
]


def _subcommands() -> set[str]:
    from flows.cli import build_parser

    def names(parser: argparse.ArgumentParser) -> set[str]:
        found = set()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found |= set(action.choices)
        return found

    parser = build_parser()
    top = names(parser)
    choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return top | {f"{name} {action}" for name in top for action in names(choices[name])}


def test_the_table_names_every_subcommand():
    covered = {argv[0] for argv, _ in BAD_ARGUMENTS} | {" ".join(argv[:2]) for argv, _ in BAD_ARGUMENTS}
    assert _subcommands() <= covered, sorted(_subcommands() - covered)


@pytest.mark.parametrize("argv, names", BAD_ARGUMENTS, ids=[" ".join(argv[:2]) for argv, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_one_line_and_exit_code_2(argv, names, tmp_path, capsys):
    from flows.cli import main

    folder = tmp_path / "folder"
    folder.mkdir()
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "a query"}\n')
    where = {"FOLDER": str(folder), "QUERIES": str(queries), "LEDGER": str(tmp_path / "ledger.db")}

    def filled(text: str) -> str:
        for key, value in where.items():
            text = text.replace(key, value)
        return text

    try:
        code = main([filled(arg) for arg in argv])
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and captured.out == "", captured.err
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"dpicl {argv[0]}") and filled(names) in lines[0], lines[0]
    assert [p.name for p in folder.iterdir()] == []  # nothing written
