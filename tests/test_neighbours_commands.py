"""The neighbouring-dataset test, its second half: the commands test_neighbours.py does not run (the split lets
xdist run the two halves in two processes at once; the comparison, the variants and the declared fields are
test_neighbours.py's)."""

from __future__ import annotations

import pytest
from pipeline_support import home, prefect_harness  # noqa: F401  (the fixtures the runs use)
from test_neighbours import (
    CHANGED_TOO,
    COMMANDS,
    MASKED_ADDED,
    MASKED_CHANGED,
    _compare,
    _file_named,
    _planted,
    collect_neighbour_runs,
)
from test_neighbours import COMMANDS_HERE as FIRST_HALF
from test_neighbours import (
    test_adding_one_record_changes_no_public_output_but_declared_dp_outputs_and_counts as _adding,
)
from test_neighbours import (
    test_changing_one_record_changes_no_public_output_but_declared_dp_outputs as _changing,
)

COMMANDS_HERE = ("generate", "evaluate", "hub", "audit", "tune", "tune-lora", "tune-full", "pate", "pate-dd",
                 "refused")


def test_the_two_halves_run_every_command_once():
    assert sorted(FIRST_HALF + COMMANDS_HERE) == sorted(COMMANDS)
    assert CHANGED_TOO <= set(COMMANDS)


@pytest.fixture(scope="module")
def neighbour_runs(tiny_lm, tmp_path_factory):
    return collect_neighbour_runs(tiny_lm, tmp_path_factory, COMMANDS_HERE)


@pytest.mark.parametrize("command", [c for c in COMMANDS_HERE if c in CHANGED_TOO])
def test_changing_one_record_changes_no_public_output_but_declared_dp_outputs(neighbour_runs, command):
    _changing(neighbour_runs, command)


@pytest.mark.parametrize("command", COMMANDS_HERE)
def test_adding_one_record_changes_no_public_output_but_declared_dp_outputs_and_counts(neighbour_runs, command):
    _adding(neighbour_runs, command)


def test_a_timing_planted_in_a_declared_dp_file_is_caught(neighbour_runs):
    """The trained prompt's manifest is declared field by field (its loss curve on public examples is DP): a
    training time written into it (it depends on the Poisson batches' sizes and the records' lengths) is not
    declared, and fails the comparison."""
    planted = _planted(neighbour_runs, "tune")
    assert not _compare(planted, "added", MASKED_ADDED)
    for variant, seconds in (("D", 41), ("added", 43)):
        run = planted[variant][0]
        run["files"][_file_named(run, "prompts/dpsgd-eps1-0.json")]["seconds"] = seconds
    assert any("dpsgd-eps1-0.json: /seconds" in p for p in _compare(planted, "added", MASKED_ADDED))


def test_a_private_value_under_a_declared_name_in_an_undeclared_place_is_caught(neighbour_runs):
    """`accuracy` is a DP output where the writers declare it (an evaluation's, PromptPATE's results); the same
    name elsewhere (a statistic of the private records in the generation summary's settings, say) is not
    masked, and fails."""
    for where in ("json", "file"):
        planted = _planted(neighbour_runs, "generate")
        assert not _compare(planted, "changed", MASKED_CHANGED)
        for variant, value in (("D", 0.712), ("changed", 0.734)):
            run = planted[variant][0]
            target = run["json"] if where == "json" else run["files"][_file_named(run, "generation.json")]
            target["config"]["accuracy"] = value
        assert any("/config/accuracy" in p for p in _compare(planted, "changed", MASKED_CHANGED)), where


def test_a_count_that_moves_with_a_changed_record_is_caught(neighbour_runs):
    """What the changed record checks that the added one cannot: a `COUNT` field (sigma follows from |D_y|) is
    masked for an added record, and fails the comparison when it moves with a changed one."""
    planted = _planted(neighbour_runs, "generate")
    for variant, sigma in (("D", 3.1), ("added", 3.2), ("changed", 3.3)):
        planted[variant][0]["json"]["noise_multiplier"] = sigma
    assert not _compare(planted, "added", MASKED_ADDED)
    assert any("/noise_multiplier" in p for p in _compare(planted, "changed", MASKED_CHANGED))
