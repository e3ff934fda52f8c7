"""The accountants' answers kept with the tests (`accounting_seed`): current, planted only where this code asks for
them, and equal to what the accountant computes."""

from __future__ import annotations

import gzip
import json
import math

import accounting_seed
import pytest

from dpcore.fewshot.accounting import epsilon_for
from dpcore.privacy import memo


def test_the_seed_holds_this_codes_answers():
    """A stale seed plants nothing: a fresh clone's suite then computes its 1,300 answers (241 s of CPU more than
    with them, measured on 2 cores). After a change to the accounting code, write it again from a suite's cache:
    `python tests/accounting_seed.py write .venv/dpicl-test-cache/accounting` after `make test`."""
    answers = accounting_seed.answers()
    assert len(answers) > 1000
    stale = [a["key"]["kind"] for a in answers if not accounting_seed.current(a["key"])]
    assert not stale, (f"{len(stale)} of the seed's {len(answers)} answers are of other accounting code "
                       f"(digest {memo.key('epsilon')['code']} now): write the seed again")


def test_only_answers_of_this_code_are_planted_and_they_are_read_back(tmp_path):
    mine = {"key": {**memo.key("epsilon"), "x": 1}, "value": {"epsilon": 1.5}}
    other = {"key": {**mine["key"], "code": "0" * 16, "x": 2}, "value": {"epsilon": 9.0}}
    older = {"key": {**mine["key"], "versions": {"dp-accounting": "0.0"}, "x": 3}, "value": {"epsilon": 9.0}}
    seed = tmp_path / "seed.jsonl.gz"
    with gzip.open(seed, "wt") as out:
        out.writelines(json.dumps(a) + "\n" for a in (mine, other, older))
    folder = tmp_path / "cache"
    folder.mkdir()
    assert accounting_seed.plant(folder, seed) == 1
    assert memo.get(folder, mine["key"]) == {"epsilon": 1.5}
    assert memo.get(folder, other["key"]) is None and memo.get(folder, older["key"]) is None
    assert accounting_seed.plant(folder, seed) == 0  # what the folder holds stays


def test_a_seed_written_from_a_folder_is_its_current_answers_in_a_stable_order(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    keys = [memo.key("epsilon", noise_multiplier=s, sampling_rate=0.01, steps=5, delta=1e-5, mechanism="gaussian")
            for s in (2.0, 1.0)]
    for key in keys:
        memo.put(folder, key, {"epsilon": key["noise_multiplier"]})
    memo.put(folder, {**keys[0], "code": "0" * 16}, {"epsilon": 0.0})  # another code's: left out
    first, second = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    assert accounting_seed.write(folder, first) == 2
    accounting_seed.write(folder, second)
    assert first.read_bytes() == second.read_bytes()
    assert sorted(a["value"]["epsilon"] for a in accounting_seed.answers(first)) == ["1.0", "2.0"]


@pytest.mark.parametrize("place", [0, -1])
def test_the_seeds_answers_are_what_the_accountant_computes(place):
    """Two of the seed's per-label epsilons (its first and last), computed again with no cache."""
    stored = sorted((a for a in accounting_seed.answers() if a["key"]["kind"] == "epsilon"),
                    key=lambda a: json.dumps(a["key"], sort_keys=True))[place]
    key = stored["key"]
    report = epsilon_for(float(key["noise_multiplier"]), float(key["sampling_rate"]), key["steps"],
                         float(key["delta"]), key["mechanism"], cache_dir=False)
    assert math.isclose(report.epsilon, stored["value"]["epsilon"], rel_tol=1e-9)
