"""DP-OPT end to end on the tiny model: the real ensemble's votes move by one vote when one record is removed,
a fixed seed writes the same instruction, only DP outputs are in the public stats, the instruction is used as a
zero-shot prompt prefix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kept_stages import assert_a_marked_stage_draws_once

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


def _smoke_params(records) -> object:
    """SMOKE's parameters with the noise of a plan at epsilon 4 on `records`' generation records."""
    n = generation_record_count(records, SMOKE)
    plan = dp_opt_plan(4.0, 1e-5, SMOKE.max_tokens, SMOKE.subsets, shots=SMOKE.shots, records=n,
                       candidates=SMOKE.candidates)
    return planned_params(plan, SMOKE)


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
    params = _smoke_params(records)
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


@pytest.mark.parametrize("stop_at", [3, 6, 8, 12])
def test_a_stopped_writing_resumes_after_its_last_kept_step_and_writes_the_same_instruction(tiny_lm, spec,
                                                                                           one_thread, stop_at,
                                                                                           monkeypatch):
    """The state kept after every token step (the finished candidates, the current one's tokens, the generator's
    state) lets a stopped writing continue after its last step, in the first candidate, at a candidate's end, in
    the second or after the last (before the private choice): the instruction and stats are those of the
    unstopped call, and no step before the stop is drawn again."""
    import json

    from dpcore.errors import RunStopped

    records = _records()
    params = _smoke_params(records)
    from dpcore.dp_opt import instruction

    drawn = []
    real = instruction.private_token
    monkeypatch.setattr(instruction, "private_token", lambda *a, **k: drawn.append(1) or real(*a, **k))
    whole = write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3))
    every = len(drawn)
    states = []
    asked = []

    def stop() -> bool:  # asked once per token step (then per scoring batch): stop after step `stop_at`
        asked.append(1)
        return len(asked) >= stop_at

    with pytest.raises(RunStopped):
        write_instruction(tiny_lm, spec, records, params, np.random.default_rng(3), should_stop=stop,
                          checkpoint=states.append)
    kept = json.loads(json.dumps(states[-1]))  # as the private store keeps it
    drawn.clear()
    resumed = write_instruction(tiny_lm, spec, records, params, np.random.default_rng(99), resume=kept)
    assert resumed == whole
    assert len(drawn) == every - len(states)  # only the steps after the last kept one are drawn


def test_a_runs_stopped_instruction_resumes_from_the_private_folder_and_is_never_drawn_twice(tiny_lm, monkeypatch,
                                                                                           tmp_path, one_thread):
    """`tasks.dp_opt.write` in a run: stopped after its third token step and retried under the same run (the first
    attempt charged it), it continues from the state it kept in the private folder and writes the unstopped
    instruction; a charge marked but not begun is written once; without either a retry is refused."""
    import json

    import pandas as pd
    from pipeline_support import share_tiny_model

    from dpcore.config import RunConfig
    from dpcore.data.artifacts import write_table
    from dpcore.errors import RunStopped
    from dpcore.home import private_dir
    from tasks import dp_opt as stage

    share_tiny_model(tiny_lm)
    folder = private_dir() / "test-dp-opt-resume" / tmp_path.name
    rows = [(rid, text, label) for label, items in _records().items() for rid, text in items]
    records = write_table(pd.DataFrame(rows, columns=["id", "text", "label"]).assign(split="train"),
                          folder / "records.parquet")
    config = RunConfig(dataset="sst2", model="tiny-random", dp_opt_preset="cpu")
    p = stage.params(config)
    parameters = {"noise_multiplier": 1.0, "selection_noise_multiplier": 1.0, "max_tokens": p.max_tokens,
                  "candidates": p.candidates, "subsets": p.subsets, "shots": p.shots}

    def call(run: str, charged: bool) -> dict:
        (folder / run / "public").mkdir(parents=True, exist_ok=True)
        return dict(records_path=str(records), task_spec="sst2", epsilon=4.0, delta=1e-5, parameters=parameters,
                    config=config, seed=7, noise_charged=charged, public_dir=str(folder / run / "public"),
                    private_run_dir=str(folder / run))

    def instruction(result: dict) -> dict:
        return json.loads(Path(result["path"]).read_text())

    whole = instruction(stage.write.fn(**call("whole", True)))
    asked = []
    monkeypatch.setattr(stage, "stop_requested", lambda: asked.append(1) or len(asked) >= 3)
    with pytest.raises(RunStopped):
        stage.write.fn(**call("stopped", True))
    monkeypatch.undo()
    assert [f.suffix for f in (folder / "stopped" / "dp-opt").iterdir()] == [".json"]
    resumed = instruction(stage.write.fn(**call("stopped", False)))
    assert (resumed["instruction"], resumed["stats"]) == (whole["instruction"], whole["stats"])
    assert_a_marked_stage_draws_once(stage.keep_charged, stage.write.fn, call, folder / "marked" / "dp-opt")
