"""AdaDPSyn's token step on a model's logits (dpcore/adadpsyn/step.py) and inside Algorithm 1's generation
engine (tiny random model, fixed seed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kept_stages import assert_a_marked_stage_draws_once

from dpcore.adadpsyn.params import PAPER, PfirrParams
from dpcore.adadpsyn.pfirr import pad_groups
from dpcore.adadpsyn.step import choose_token, token_chooser
from dpcore.fewshot import generation
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.mechanisms import public_top_k
from dpcore.lm.batching import BatchedForward

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)


@pytest.fixture(scope="module")
def step_logits(tiny_lm, agnews_spec, made_up_records):
    """One step's logits: the public prompt's and three groups' (a group of M = 5 is empty twice over)."""
    records = made_up_records["World"]
    prompts = [agnews_spec.generation.build("World", [])] + [
        agnews_spec.generation.build("World", records[i:i + 2]) for i in (0, 2, 4)]
    logits = BatchedForward(tiny_lm)([tiny_lm.encode(p) for p in prompts])
    return logits[0], logits[1:]


def test_the_token_is_in_the_public_top_k_and_a_fixed_seed_reproduces_it(step_logits):
    public, groups = step_logits
    config = GenerationConfig(num_subsets=5, subset_size=2, top_k=20, max_tokens=4)
    choose = token_chooser(config, PAPER)
    tokens = [choose(public, groups, np.random.default_rng(seed)) for seed in range(12)]
    keep = set(public_top_k(public, 20).tolist())
    assert set(tokens) <= keep
    assert tokens == [choose(public, groups, np.random.default_rng(seed)) for seed in range(12)]
    # no group at all (every group empty): the public distribution M times, still a token of S
    assert choose(public, groups[:0], np.random.default_rng(0)) in keep
    # RVP off: every coordinate, empty groups uniform
    free = choose_token(None, groups, num_groups=5, top_k=20, rvp=False, params=PAPER, rng=np.random.default_rng(0))
    assert 0 <= free < groups.shape[1]


def test_with_little_noise_the_step_picks_the_groups_favourite(step_logits):
    public, groups = step_logits
    quiet = PfirrParams(sigma_avg=1e-6, sigma_radius=1e-6, sigma_test=1e-6)
    keep = public_top_k(public, 20)
    probs = torch.softmax(groups[:, keep].double(), dim=-1)
    points = pad_groups(probs, 3, None)
    favourite = int(keep[int(np.argmax(points.mean(axis=0)))])
    token = choose_token(public, groups, num_groups=3, top_k=20, rvp=True, params=quiet, rng=np.random.default_rng(0))
    assert token == favourite


def test_end_to_end_generation_with_pfirr_in_the_engine(tiny_lm, agnews_spec, made_up_records):
    """Algorithm 1's engine with PFIRR as its token step (`generate_demos(chooser=...)`): demos come out named
    adadpsyn with the effective sigma, a fixed seed reproduces them, and every step sees at most M groups and
    draws its noise from the stream's noise generator."""
    from dpcore.adadpsyn.accounting import effective_noise_multiplier

    config = GenerationConfig(num_subsets=4, subset_size=2, top_k=20, max_tokens=4, demos_per_label=2)
    bound = token_chooser(config, PAPER)
    seen: list[int] = []

    def chooser(public_logits, group_logits, rng):
        assert isinstance(rng, np.random.Generator)
        seen.append(group_logits.shape[0])
        return bound(public_logits, group_logits, rng)

    records = {"World": made_up_records["World"]}
    sigma_eff = effective_noise_multiplier(PAPER)
    first = generation.generate_demos(tiny_lm, agnews_spec, records, config, sigma_eff, seed=5, chooser=chooser,
                                      method="adadpsyn")
    again = generation.generate_demos(tiny_lm, agnews_spec, records, config, sigma_eff, seed=5, chooser=chooser,
                                      method="adadpsyn")
    assert [d.text for d in first.demos] == [d.text for d in again.demos]
    assert len(first.demos) == 2 and all(d.tokens >= 1 or d.stop_reason == "eos" for d in first.demos)
    assert {d.method for d in first.demos} == {"adadpsyn"}
    assert [d.noise_multiplier for d in first.demos] == pytest.approx([sigma_eff] * 2)
    assert seen and max(seen) <= config.num_subsets
    # without a chooser the engine is Algorithm 1's (tang), with its own name
    plain = generation.generate_demos(tiny_lm, agnews_spec, records, config, 1.0, seed=5)
    assert {d.method for d in plain.demos} == {"tang"}


def test_a_stopped_generation_resumes_after_its_last_step_and_is_never_drawn_twice(tiny_lm, made_up_records,
                                                                                  monkeypatch, tmp_path):
    """A run's AdaDPSyn generation keeps its state after every token step in the private folder: stopped at
    step 2 and retried under the same run (its spend charged by the first attempt), it continues after step 2 and
    ends with the demos of an unstopped generation of the same seed; a charge marked but not begun is drawn once;
    without either, a retry is refused, never drawn again."""
    import pandas as pd
    from pipeline_support import share_tiny_model

    from dpcore.data.artifacts import write_table
    from dpcore.home import private_dir
    from tasks import adadpsyn as stage

    share_tiny_model(tiny_lm)
    folder = private_dir() / "test-adadpsyn-resume" / tmp_path.name
    rows = [(f"{y}-{i}", t, y) for y in ("World", "Sports") for i, t in enumerate(made_up_records[y])]
    records = write_table(pd.DataFrame(rows, columns=["id", "text", "label"]).assign(split="train"),
                          folder / "records.parquet")
    config = GenerationConfig(num_subsets=2, subset_size=1, top_k=20, max_tokens=5, demos_per_label=1)
    parameters = {"sigma_avg": 1.0, **{name: getattr(PAPER, name) for name in stage.PFIRR_FIELDS}}

    def call(run: str, charged: bool) -> dict:
        (folder / run / "public").mkdir(parents=True, exist_ok=True)
        return dict(records_path=str(records), task_spec="agnews", epsilon=4.0, parameters=parameters,
                    generation=config, model="tiny-random", seed=11, noise_charged=charged,
                    public_dir=str(folder / run / "public"), private_run_dir=str(folder / run))

    def demos(result: dict) -> list[str]:
        return pd.read_parquet(result["path"]).sort_values("label")["text"].tolist()

    whole = demos(stage.generate.fn(**call("whole", True)))

    class Stopped(Exception):
        pass

    def stop_after_two(what, info):
        if info["step"] >= 2:
            raise Stopped

    monkeypatch.setattr(stage, "report_steps", stop_after_two)
    with pytest.raises(Stopped):
        stage.generate.fn(**call("stopped", True))
    monkeypatch.undo()
    kept = list((folder / "stopped" / "adadpsyn").glob("*.json"))
    assert len(kept) == 1
    steps = []
    monkeypatch.setattr(stage, "report_steps", lambda what, info: steps.append(info["step"]))
    assert demos(stage.generate.fn(**call("stopped", False))) == whole  # the retry: charged by the first attempt
    assert steps and min(steps) == 3  # it continued after step 2, drawing no step again
    # marked right after the charge, never begun: drawn once, the mark gone once it began
    assert_a_marked_stage_draws_once(stage.keep_charged, stage.generate.fn, call, folder / "marked" / "adadpsyn")
