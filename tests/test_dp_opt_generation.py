"""DP-OPT end to end on the tiny model: the real ensemble's votes move by one vote when one record is removed,
a fixed seed writes the same instruction, only DP outputs are in the public stats, the instruction is used as a
zero-shot prompt prefix."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.data.taskspec import load_task_spec
from dpcore.dp_opt import ensemble, sampling, selection
from dpcore.dp_opt.instruction import (
    classify,
    flatten_records,
    generation_record_count,
    instruction_spec,
    split_records,
    write_instruction,
)
from dpcore.dp_opt.presets import SMOKE
from dpcore.dp_opt.privacy import dp_opt_plan, planned_params
from dpcore.lm.icl import prefix_text


@pytest.fixture(scope="module")
def spec():
    return load_task_spec("sst2")


def _records(n: int = 16) -> dict[str, list[tuple[str, str]]]:
    return {"Negative": [(f"n{i}", f"an awful dull film, number {i}") for i in range(n)],
            "Positive": [(f"p{i}", f"a great moving film, number {i}") for i in range(n)]}


def test_ensemble_votes_move_by_one_when_a_record_is_removed(tiny_lm, spec, one_thread):
    records = flatten_records(_records(8))
    by_id = {rid: (text, label) for rid, text, label in records}
    ids = list(by_id)

    def histogram(keep, seed):
        rng = np.random.default_rng(seed)
        parts = sampling.step_subsets(keep, 6, 2, 0.7, rng)
        votes = ensemble.subset_votes(tiny_lm, spec, [[by_id[r] for r in p] for p in parts], [], 1.0, rng)
        return selection.vote_histogram(votes, tiny_lm.vocab_size)

    moved = 0
    for seed in range(3):
        full = histogram(ids, seed)
        for removed in ids[::4]:
            diff = np.abs(full - histogram([r for r in ids if r != removed], seed))
            assert diff.max() <= selection.SENSITIVITY
            moved += diff.sum() > 0
    assert moved > 0


def test_write_instruction_fixed_seed_and_public_stats(tiny_lm, spec, one_thread):
    records = _records()
    n = generation_record_count(records, SMOKE)
    generation, holdout = split_records(flatten_records(records), SMOKE)
    assert n == len(generation) and holdout and not {r for r, _, _ in generation} & {r for r, _, _ in holdout}
    plan = dp_opt_plan(4.0, 1e-5, SMOKE.max_tokens, SMOKE.subsets, shots=SMOKE.shots, records=n,
                       candidates=SMOKE.candidates)
    params = planned_params(plan, SMOKE)
    first = write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3))
    again = write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3))
    assert first == again
    instruction, stats = first
    assert instruction == stats["candidates"][stats["chosen"]]
    assert len(stats["candidates"]) == SMOKE.candidates
    assert all(t <= SMOKE.max_tokens for t in stats["tokens"])
    assert stats["sampling_rate"] == pytest.approx(plan.parameters["sampling_rate"])
    assert stats["steps_used"] <= plan.parameters["steps"]
    texts = [text for recs in records.values() for _, text in recs]
    public = repr(stats)
    assert not any(text in public for text in texts)  # no record; votes and counts are not in the stats either
    assert set(stats) == {"method", "candidates", "tokens", "stopped", "chosen", "noise_multiplier",
                          "selection_noise_multiplier", "sampling_rate", "steps_planned", "steps_used", "subsets",
                          "shots", "noise"}
    other = write_instruction(tiny_lm, spec, records, params, np.random.default_rng(4))
    assert other[1]["candidates"] != stats["candidates"]  # the noise comes from the generator


def test_instruction_is_a_zero_shot_prompt_prefix(tiny_lm, spec, one_thread):
    with_instruction = instruction_spec(spec, "  classify the review's sentiment. ")
    assert prefix_text(with_instruction, []).startswith("classify the review's sentiment.")
    predictions = classify(tiny_lm, spec, "classify the review's sentiment.", ["a fine film", "dull"])
    assert len(predictions) == 2 and set(predictions) <= set(spec.label_names)


def test_progress_counts_every_token_step_and_a_stop_request_ends_the_writing(tiny_lm, spec, one_thread):
    """The bar goes over every candidate's T steps to its total; a stop request ends the writing at the next token
    (`RunStopped`), and during the candidates' scoring on the holdout at the next batch."""
    from dpcore.errors import RunStopped

    records = _records()
    n = generation_record_count(records, SMOKE)
    plan = dp_opt_plan(4.0, 1e-5, SMOKE.max_tokens, SMOKE.subsets, shots=SMOKE.shots, records=n,
                       candidates=SMOKE.candidates)
    params = planned_params(plan, SMOKE)
    seen = []
    write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3), progress=lambda d, t: seen.append((d, t)))
    total = SMOKE.candidates * SMOKE.max_tokens
    assert seen and {t for _, t in seen} == {total} and seen[-1][0] == total
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    with pytest.raises(RunStopped, match="writing the instruction"):
        write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3), should_stop=lambda: True)
    asked = []

    def stop_when_scoring() -> bool:  # no stop while the tokens are written: only in the candidates' scoring
        asked.append(1)
        return len(asked) > total
    with pytest.raises(RunStopped, match="scoring the candidates"):
        write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3), should_stop=stop_when_scoring)
