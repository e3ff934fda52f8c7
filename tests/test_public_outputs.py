"""The declarations of what of a public output may differ between neighbouring datasets."""

from __future__ import annotations

import re

from dpcore import public_outputs
from dpcore.public_outputs import Kind


def test_paths_match_part_by_part_with_globs_and_any_depth():
    match = public_outputs.matches
    assert match(("*", "metrics", "accuracy*"), ("0", "metrics", "accuracy_mean"))
    assert not match(("*", "metrics", "accuracy*"), ("0", "params", "accuracy_mean"))
    assert not match(("results", "*", "accuracy"), ("results", "0", "accuracy", "mean"))
    assert match(("**", "ledger_entries", "*", "id"), ("method_summaries", "pate", "ledger", "ledger_entries", "3", "id"))
    assert match(("**", "id"), ("id",)) and not match(("**", "id"), ("ids",))
    assert match((), ()) and not match((), ("a",))


def test_a_log_format_declares_its_arguments_by_position():
    fmt = public_outputs.declare_log("trained %s: %d steps, loss %.4f in %d s (100%%)", dp=(2,),
                                     public_timing=(3,))
    assert fmt == "trained %s: %d steps, loss %.4f in %d s (100%%)"
    lines = {pattern: kind for pattern, kind in public_outputs.declared_lines().items()
             if "trained" in pattern and "loss" in pattern}
    assert sorted(lines.values()) == [Kind.DP, Kind.PUBLIC_TIMING]
    line = "trained p: 3 steps, loss 1.2345 in 7 s (100%)"
    masked = {kind: re.search(pattern, line) for pattern, kind in lines.items()}
    assert masked[Kind.DP].group(1) == "1.2345" and masked[Kind.PUBLIC_TIMING].group(1) == "7"
    assert re.search(next(iter(lines)), "trained p: 3 steps, loss 1.2345 in 7 s (100%) and more") is None


def test_declarations_are_kept_by_output():
    public_outputs.declare("json:example", Kind.COUNT, "/records", "/labels/*")
    assert public_outputs.declared("json:example") == {("records",): Kind.COUNT, ("labels", "*"): Kind.COUNT}
    assert public_outputs.declared("json:nothing-declared") == {}
