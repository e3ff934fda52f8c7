"""Algorithm 1 end to end: the batched engine, stopping, streams, baselines, bad input and the CLI."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest
import torch

from dpcore.config import RunConfig
from dpcore.errors import ConfigError
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.generation import (
    DEMO_COLUMNS,
    Demo,
    demos_frame,
    generate_demos,
    instruction_only_demos,
    real_demos,
)
from dpcore.fewshot.mechanisms import pre_noise_sum, public_top_k, restricted_softmax
from dpcore.fewshot.sampling import poisson_groups
from dpcore.lm.batching import BatchedForward

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)

LABELS = ["World", "Sports", "Business", "Technology"]


@pytest.fixture(scope="module")
def spec(agnews_spec):
    return agnews_spec


@pytest.fixture(scope="module")
def records(made_up_records):
    assert list(made_up_records) == LABELS
    return made_up_records


def _config(**kw) -> GenerationConfig:
    base = {"num_subsets": 4, "subset_size": 2, "top_k": 20, "max_tokens": 4}
    return GenerationConfig(**{**base, **kw})


class PlannedForward:
    """A stand-in forward pass whose every row puts its largest logit on plan[call] (then plan[-1])."""

    def __init__(self, vocab: int, plan: list[int]):
        self.vocab, self.plan, self.calls, self.batches = vocab, plan, 0, []

    def __call__(self, prompts):
        self.batches.append([list(p) for p in prompts])
        logits = torch.zeros((len(prompts), self.vocab))
        logits[:, self.plan[min(self.calls, len(self.plan) - 1)]] = 50.0
        self.calls += 1
        return logits


# --------------------------------------------------------------------------- Algorithm 1


def test_generates_one_demo_per_label_and_shot_with_every_field(tiny_lm, spec, records):
    result = generate_demos(tiny_lm, spec, records, _config(demos_per_label=2), 0.5, seed=3)
    assert [(d.label, d.shot) for d in result.demos] == [(y, s) for y in LABELS for s in (0, 1)]
    demo = result.demos[0]
    assert (demo.noise_multiplier, demo.num_subsets, demo.subset_size, demo.top_k, demo.rvp, demo.max_tokens,
            demo.mechanism, demo.method, demo.sampler, demo.seeded_noise) == (
        0.5, 4, 2, 20, True, 4, "gaussian", "tang", "poisson", True)
    assert demo.model == tiny_lm.name
    assert all(1 <= d.tokens <= 4 or d.stop_reason == "eos" for d in result.demos)
    assert result.seeded_noise is True
    assert result.stats["steps"] >= 1 and result.private_stats["prompt_tokens"] > 0
    assert result.private_stats["forward_tokens_per_s"] > 0


def test_fixed_seed_reproduces_and_secure_seeding_differs(tiny_lm, spec, records):
    config = _config(max_tokens=5)
    first = generate_demos(tiny_lm, spec, records, config, 1.0, seed=9, labels=["World"])
    again = generate_demos(tiny_lm, spec, records, config, 1.0, seed=9, labels=["World"])
    assert first.demos == again.demos
    fresh = [generate_demos(tiny_lm, spec, records, config, 1.0, labels=["World"]) for _ in range(2)]
    assert all(not r.seeded_noise and not r.demos[0].seeded_noise for r in fresh)
    assert fresh[0].demos[0].text != fresh[1].demos[0].text


@pytest.mark.parametrize("sigma, mechanism", [(0.001, "gaussian"), (0.05, "rnm")])
def test_four_labels_at_once_equal_one_at_a_time(tiny_lm, spec, records, sigma, mechanism):
    config = _config(max_tokens=4, mechanism=mechanism)
    together = generate_demos(tiny_lm, spec, records, config, sigma, seed=21)
    alone = [generate_demos(tiny_lm, spec, records, config, sigma, seed=21, labels=[y]).demos[0] for y in LABELS]
    assert together.demos == alone


@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_prompts_prepared_a_step_ahead_give_the_same_demos(tiny_lm, spec, records, sigma):
    """The CUDA default prepares step t+1's group prompts during step t's forward pass; the demos must be
    exactly those of in-line preparation, also when some streams stop early (here: World's, at step 3)."""
    eos = min(tiny_lm.eos_token_ids)

    def stopping_world():
        inner, calls = BatchedForward(tiny_lm), [0]

        def forward(prompts):
            logits = inner(prompts).clone()
            calls[0] += 1
            if calls[0] >= 3:
                for row, prompt in enumerate(prompts):
                    if "News Type: World\nText:" in tiny_lm.decode(prompt).rsplit("\n\n", 1)[-1]:
                        logits[row, eos] = 1e4
            return logits
        return forward

    config = _config(max_tokens=6, demos_per_label=2)
    inline = generate_demos(tiny_lm, spec, records, config, sigma, seed=5, forward=stopping_world(), prefetch=False)
    ahead = generate_demos(tiny_lm, spec, records, config, sigma, seed=5, forward=stopping_world(), prefetch=True)
    assert ahead.demos == inline.demos
    assert {d.stop_reason for d in inline.demos if d.label == "World"} == {"eos"}
    assert {d.tokens for d in inline.demos if d.label == "World"} == {2}
    assert {d.stop_reason for d in inline.demos if d.label != "World"} == {"max_tokens"}


class _Stop(Exception):
    pass


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_stopped_generation_resumes_from_its_last_finished_step(tiny_lm, spec, records, prefetch):
    """A call stopped at a step's report keeps every finished step (its state is handed over before the report);
    resumed from it, the call takes only the steps left to T_max and ends with the uninterrupted call's demos
    (seeded: bit for bit, also with prompts prepared a step ahead)."""
    from dpcore.fewshot.generation import GenerationState

    config = _config(max_tokens=6, demos_per_label=2)
    whole = generate_demos(tiny_lm, spec, records, config, 0.3, seed=8, prefetch=prefetch)
    kept: list[GenerationState] = []

    def stop_at_3(info):
        if info["step"] == 3:
            raise _Stop

    with pytest.raises(_Stop):
        generate_demos(tiny_lm, spec, records, config, 0.3, seed=8, prefetch=prefetch, progress=stop_at_3,
                       checkpoint=kept.append)
    assert [s.step for s in kept] == [0, 1, 2, 3]  # before the first draw, then every finished step
    state = GenerationState.from_dict(json.loads(json.dumps(kept[-1].to_dict())))  # as the private store keeps it
    steps: list[int] = []
    resumed = generate_demos(tiny_lm, spec, records, config, 0.3, seed=None, prefetch=prefetch, resume=state,
                             progress=lambda info: steps.append(info["step"]))
    assert steps == [4, 5, 6]  # never more than T_max steps in all
    assert [asdict(d) | {"seeded_noise": True} for d in resumed.demos] == [asdict(d) for d in whole.demos]
    assert resumed.stats["steps"] == whole.stats["steps"] and resumed.stats["synthetic_tokens"] == \
        whole.stats["synthetic_tokens"]
    done = generate_demos(tiny_lm, spec, records, config, 0.3, seed=None,
                          resume=GenerationState(6, tuple({**s, "stop_reason": "max_tokens"} for s in state.streams)),
                          progress=lambda info: steps.append(-1))
    assert len(steps) == 3 and len(done.demos) == len(whole.demos)  # a finished state draws nothing more
    with pytest.raises(ConfigError, match="other labels or shots"):
        generate_demos(tiny_lm, spec, records, config, 0.3, labels=["World"], resume=state)


def test_encode_batch_equals_encode(tiny_lm, spec, records):
    texts = [spec.generation.build(label, records[label][:k]) for label in LABELS for k in (0, 2)]
    texts += ["café naïve – 東京\n\n  spaces  ", "", "\n"]
    assert tiny_lm.encode_batch(texts) == [tiny_lm.encode(t) for t in texts]


def test_one_forward_pass_per_step_for_every_active_sequence(tiny_lm, spec, records):
    forward = BatchedForward(tiny_lm)
    calls = []

    def counting(prompts):
        calls.append(len(prompts))
        return forward(prompts)

    result = generate_demos(tiny_lm, spec, records, _config(max_tokens=3, demos_per_label=2), 0.5, seed=1,
                            forward=counting)
    assert len(calls) == result.stats["steps"] == 3
    # Every (label, shot) contributes its public prompt plus at most M group prompts each step.
    assert all(8 < n <= 8 * (4 + 1) for n in calls)


def test_rvp_token_is_always_in_the_public_top_k(tiny_lm, spec, records, monkeypatch):
    import dpcore.fewshot.generation as generation

    seen = []
    original = generation.noisy_argmax

    def spy(scores, keep):
        token = original(scores, keep)
        seen.append((token, set(keep.tolist())))
        return token

    captured = []
    forward = BatchedForward(tiny_lm)

    def capturing(prompts):
        logits = forward(prompts)
        captured.append(logits[-1].clone())  # one stream: its public prompt is the last row
        return logits

    monkeypatch.setattr(generation, "noisy_argmax", spy)
    generate_demos(tiny_lm, spec, records, _config(max_tokens=6, top_k=5), 3.0, seed=2, labels=["Sports"],
                   forward=capturing)
    assert len(seen) == len(captured) >= 1
    for (token, keep), public in zip(seen, captured, strict=True):
        assert keep == set(public_top_k(public, 5).tolist())
        assert token in keep


def test_no_rvp_uses_no_public_prompt(tiny_lm, spec, records):
    good = tiny_lm.encode(" good")[0]
    forward = PlannedForward(tiny_lm.vocab_size, [good])
    generate_demos(tiny_lm, spec, records, _config(rvp=False, max_tokens=2, top_k=10**9), 0.0, seed=0,
                   labels=["World"], forward=forward)
    public = tiny_lm.encode(spec.generation.build("World", []))
    for step, batch in enumerate(forward.batches):
        assert 1 <= len(batch) <= 4  # at most M group prompts, no public prompt
        assert all(prompt != public + [good] * step for prompt in batch)


def test_group_prompts_are_the_tokenised_prefix_plus_generated_ids(tiny_lm, spec, records):
    good = tiny_lm.encode(" good")[0]
    forward = PlannedForward(tiny_lm.vocab_size, [good])
    generate_demos(tiny_lm, spec, records, _config(max_tokens=3), 0.0, seed=0, labels=["World"], forward=forward)
    public = tiny_lm.encode(spec.generation.build("World", []))
    for step, batch in enumerate(forward.batches):
        assert batch[-1] == public + [good] * step
        for prompt in batch[:-1]:
            assert prompt[len(prompt) - step:] == [good] * step
            assert prompt[:16] == public[:16]  # the instruction line


# --------------------------------------------------------------------------- stopping


def test_stops_at_end_token_without_keeping_it(tiny_lm, spec, records):
    eos = min(tiny_lm.eos_token_ids)
    good = tiny_lm.encode(" good")[0]
    forward = PlannedForward(tiny_lm.vocab_size, [good, good, eos])
    demo = generate_demos(tiny_lm, spec, records, _config(max_tokens=10), 0.0, seed=0, labels=["World"],
                          forward=forward).demos[0]
    assert (demo.stop_reason, demo.tokens, demo.text, forward.calls) == ("eos", 2, "good good", 3)


def test_stops_at_stop_string_and_strips_what_follows(tiny_lm, spec, records):
    good, day = tiny_lm.encode(" good")[0], tiny_lm.encode(" day")[0]
    newline = tiny_lm.encode("\n")[0]
    demo = generate_demos(tiny_lm, spec, records, _config(max_tokens=10), 0.0, seed=0, labels=["World"],
                          forward=PlannedForward(tiny_lm.vocab_size, [good, day, newline, good])).demos[0]
    assert (demo.stop_reason, demo.tokens, demo.text) == ("stop_string", 3, "good day")
    custom = spec.model_copy(update={"generation": spec.generation.model_copy(update={"stop": "od d"})})
    demo = generate_demos(tiny_lm, custom, records, _config(max_tokens=10), 0.0, seed=0, labels=["World"],
                          forward=PlannedForward(tiny_lm.vocab_size, [good, day, good])).demos[0]
    assert (demo.stop_reason, demo.tokens, demo.text) == ("stop_string", 2, "go")


def test_stops_at_max_tokens(tiny_lm, spec, records):
    good = tiny_lm.encode(" good")[0]
    forward = PlannedForward(tiny_lm.vocab_size, [good])
    result = generate_demos(tiny_lm, spec, records, _config(max_tokens=4, demos_per_label=2), 0.0, seed=0,
                            labels=["World", "Sports"], forward=forward)
    assert [(d.stop_reason, d.tokens, d.text) for d in result.demos] == [("max_tokens", 4, "good good good good")] * 4
    assert forward.calls == 4


def test_finished_sequences_drop_out_of_the_batch(tiny_lm, spec, records):
    eos, good = min(tiny_lm.eos_token_ids), tiny_lm.encode(" good")[0]
    batches = []

    def forward(prompts):  # from the second step on, every World prompt prefers the end token
        texts = [tiny_lm.decode(p) for p in prompts]
        batches.append(["News Type: World" in t for t in texts])
        logits = torch.zeros((len(prompts), tiny_lm.vocab_size))
        logits[:, good] = 50.0
        for row, text in enumerate(texts):
            if len(batches) >= 2 and "News Type: World" in text:
                logits[row, eos] = 100.0
        return logits

    result = generate_demos(tiny_lm, spec, records, _config(max_tokens=4), 0.0, seed=0,
                            labels=["World", "Sports"], forward=forward)
    world, sports = result.demos
    assert (world.stop_reason, world.tokens, sports.stop_reason, sports.tokens) == ("eos", 1, "max_tokens", 4)
    assert len(batches) == 4 and all(any(b) for b in batches[:2])
    assert not any(any(b) for b in batches[2:])  # World left the batch


# --------------------------------------------------------------------------- public and per-label passes


class _Recording:
    """The engine's BatchedForward, keeping every step's prompts, pass keys and logits."""

    accepts_passes = True

    def __init__(self, lm):
        self.inner, self.steps = BatchedForward(lm), []

    def __call__(self, prompts, passes=None):
        logits = self.inner(prompts, passes=passes)
        self.steps.append(([list(p) for p in prompts], list(passes), logits.clone()))
        return logits


def _pass_owner(tiny_lm, prompt):
    """'public' for a prompt without a record, else the label whose records it holds."""
    text = tiny_lm.decode(prompt)
    owners = {label for label in LABELS if f"{label} item " in text}
    assert len(owners) <= 1
    return owners.pop() if owners else "public"


def test_public_prompts_run_in_passes_without_any_private_prompt(tiny_lm, spec, records, monkeypatch):
    """Every model call of a step belongs to one pass, and a pass holds either public prompts only
    or the group prompts of one label only (spy on the forward batching)."""
    passes, inside = [], [0]
    original_pass, original_model = BatchedForward._one_pass, tiny_lm.model.forward
    model_calls = {"inside": 0, "outside": 0}

    def spy_pass(self, prompts, rows, out):
        passes.append({_pass_owner(tiny_lm, p) for p in prompts})
        inside[0] += 1
        try:
            return original_pass(self, prompts, rows, out)
        finally:
            inside[0] -= 1

    def spy_model(*args, **kwargs):
        model_calls["inside" if inside[0] else "outside"] += 1
        return original_model(*args, **kwargs)

    monkeypatch.setattr(BatchedForward, "_one_pass", spy_pass)
    monkeypatch.setattr(tiny_lm.model, "forward", spy_model)
    result = generate_demos(tiny_lm, spec, records, _config(max_tokens=3, demos_per_label=2), 0.5, seed=6)
    assert result.stats["steps"] == 3
    assert model_calls["outside"] == 0 and model_calls["inside"] >= len(passes)
    assert all(len(owners) == 1 for owners in passes)
    assert sum(owners == {"public"} for owners in passes) == 3  # one public pass per step
    assert {next(iter(o)) for o in passes} == {"public", *LABELS}


def test_public_and_label_logits_are_bit_for_bit_those_of_their_own_prompts(tiny_lm, spec, records):
    """The RVP set is public bit for bit: the public rows equal a call on the public prompts alone,
    and each label's rows equal a call on that label's group prompts alone."""
    recording = _Recording(tiny_lm)
    generate_demos(tiny_lm, spec, records, _config(max_tokens=3), 0.5, seed=7, forward=recording)
    assert len(recording.steps) == 3
    for prompts, keys, logits in recording.steps:
        for key in {*keys}:
            rows = [i for i, k in enumerate(keys) if k == key]
            alone = BatchedForward(tiny_lm)([prompts[i] for i in rows])
            assert torch.equal(logits[rows], alone)
            owners = {_pass_owner(tiny_lm, prompts[i]) for i in rows}
            assert owners == ({"public"} if key not in LABELS else {key})


@pytest.mark.parametrize("mechanism, sigma", [("gaussian", 0.3), ("rnm", 0.05)])
def test_separate_passes_leave_fp32_cpu_demos_unchanged(tiny_lm, spec, records, mechanism, sigma):
    """fp32 on CPU with a fixed seed: the demos of separate passes are those of one mixed pass
    (the engine before the separation) and those of one prompt at a time."""
    mixed_inner = BatchedForward(tiny_lm)

    def mixed(prompts):  # no pass keys: every prompt of the step in one call, as before
        return mixed_inner(prompts)

    def one_at_a_time(prompts):
        return torch.cat([tiny_lm.next_token_logits([p]) for p in prompts])

    config = _config(max_tokens=5, demos_per_label=2, mechanism=mechanism)
    separate = generate_demos(tiny_lm, spec, records, config, sigma, seed=12).demos
    assert separate == generate_demos(tiny_lm, spec, records, config, sigma, seed=12, forward=mixed).demos
    assert separate == generate_demos(tiny_lm, spec, records, config, sigma, seed=12, forward=one_at_a_time).demos


# --------------------------------------------------------------------------- the record token cap


class _SmallContext:
    """`tiny_lm` as if its context were `positions` long (for prompts that cannot fit)."""

    def __init__(self, lm, positions):
        self._lm = lm
        self.model = type("Model", (), {"config": type("Config", (), {"max_position_embeddings": positions})()})()

    def __getattr__(self, name):
        return getattr(self._lm, name)


def _long_records(count, words=2500):
    rng = np.random.default_rng(3)
    vocabulary = ["market", "match", "election", "chip", "storm", "merger", "league", "rocket"]
    return {label: [f"{label} item {i}: " + " ".join(rng.choice(vocabulary, size=words)) for i in range(count)]
            for label in LABELS}


def test_records_longer_than_the_context_are_cut_and_generation_never_overflows(tiny_lm, spec):
    """Before: a prompt of private records longer than the context raised mid-run (after the
    charge) with its length in the message. Now every record is cut to the public cap and every
    prompt of every step fits the context."""
    good = tiny_lm.encode(" good")[0]
    forward = PlannedForward(tiny_lm.vocab_size, [good])
    config = _config(max_tokens=3, num_subsets=2, subset_size=2)
    records = _long_records(8)
    assert min(len(tiny_lm.encode(r)) for r in records["World"]) > 2048  # each alone overflows
    result = generate_demos(tiny_lm, spec, records, config, 0.0, seed=1, forward=forward)
    assert [d.tokens for d in result.demos] == [3] * 4
    assert max(len(p) for batch in forward.batches for p in batch) <= 2048


def test_poisson_groups_larger_than_n_are_fitted_to_the_context(tiny_lm, spec):
    """A Poisson group can hold many more than N records; its prompt keeps its first records that fit."""
    small = _SmallContext(tiny_lm, 400)
    forward = PlannedForward(tiny_lm.vocab_size, [tiny_lm.encode(" good")[0]])
    config = _config(max_tokens=3, num_subsets=2, subset_size=2)
    records = _long_records(8, words=60)  # q = 4/8: groups of Binomial(8, 1/4) records, often > N
    result = generate_demos(small, spec, records, config, 0.0, seed=2, forward=forward)
    assert len(result.demos) == 4
    lengths = [len(p) for batch in forward.batches for p in batch]
    assert max(lengths) <= 400
    assert max(lengths) > 400 - 3 - 80  # the limit is used, not a much smaller one


def test_truncate_records_cuts_to_the_cap_and_keeps_short_records(tiny_lm):
    from dpcore.lm.budget import truncate_records

    texts = ["short one", "word " * 500, "café naïve – 東京 " * 100, ""]
    cut = truncate_records(tiny_lm, texts, 40)
    assert cut[0] == "short one" and cut[3] == ""
    assert all(len(tiny_lm.encode(t)) <= 40 for t in cut)
    assert cut[1].startswith("word word") and len(tiny_lm.encode(cut[1])) >= 38
    assert texts[2].startswith(cut[2][:10])


def test_truncation_shortcut_is_exact_for_the_byte_level_tokenizer(tiny_lm, monkeypatch):
    """Only texts of more than cap - 1 UTF-8 bytes are tokenised: the embedded tokenizer never gives
    more tokens than bytes + 1, so the shortcut cuts exactly what full tokenisation cuts."""
    import dpcore.lm.budget as records_module

    assert records_module.tokens_at_most_bytes(tiny_lm)
    rng = np.random.default_rng(1)
    pieces = ["word", " ", "\n", "東京", "😀", "é", "<|im_end|>", "\t\t", "1234", "ﬁ", "\u200b", "Ω"]
    texts = ["".join(rng.choice(pieces, size=int(n))) for n in rng.integers(0, 40, size=300)]
    assert all(len(tiny_lm.encode(t)) <= len(t.encode("utf-8")) + 1 for t in texts)
    fast = records_module.truncate_records(tiny_lm, texts, 24)
    monkeypatch.setattr(records_module, "tokens_at_most_bytes", lambda lm: False)
    assert records_module.truncate_records(tiny_lm, texts, 24) == fast
    assert sum(a != b for a, b in zip(fast, texts, strict=True)) > 20


def test_prompt_budget_derives_the_cap_and_refuses_what_cannot_fit(tiny_lm, spec):
    from dpcore.lm.budget import prompt_budget

    config = _config(max_tokens=40, subset_size=4)
    budget = prompt_budget(tiny_lm.encode, 2048, spec, LABELS, config)
    assert budget.longest_prompt <= 2048 < budget.longest_prompt + config.subset_size  # the largest that fits
    assert budget.record_cap > 300
    chosen = prompt_budget(tiny_lm.encode, 2048, spec, LABELS, config.model_copy(update={"max_record_tokens": 64}))
    assert chosen.record_cap == 64
    with pytest.raises(ConfigError, match=r"--max-record-tokens \(max_record_tokens\) = 5000.*at most"):
        prompt_budget(tiny_lm.encode, 2048, spec, LABELS, config.model_copy(update={"max_record_tokens": 5000}))
    with pytest.raises(ConfigError, match="max_tokens"):
        prompt_budget(tiny_lm.encode, 2048, spec, LABELS, config.model_copy(update={"max_tokens": 2040}))


def test_model_budget_by_name_matches_the_loaded_model(tiny_lm, tiny_model_dir, spec):
    """The pre-charge check reads the tokenizer and context without the weights; the same numbers
    as the model the run then loads (the tiny model by name, and a saved model folder)."""
    from dpcore.lm.budget import check_model_budget, context_length, prompt_budget

    config = _config(max_tokens=40)
    loaded = prompt_budget(tiny_lm.encode, context_length(tiny_lm), spec, LABELS, config)
    assert context_length(tiny_lm) == 2048
    assert check_model_budget("tiny-random", spec, LABELS, config) == loaded
    assert check_model_budget(str(tiny_model_dir), spec, LABELS, config) == loaded
    assert prompt_budget(tiny_lm.encode, 2048, spec, ["World"], config) == loaded  # one label's call: same cap


def test_cli_refuses_a_prompt_that_cannot_fit_before_the_charge(tiny_model_dir, tmp_path, cli):
    from dpcore.privacy.ledger import Ledger

    before = len(Ledger().entries())
    for flags, match in ((["--max-tokens", "2040"], "max_tokens"), (["--max-record-tokens", "5000"],
                                                                     "max_record_tokens")):
        code, _, stderr = cli(["generate", "--dataset", "agnews", "--epsilon", "4", "--model", str(tiny_model_dir),
                               "--out", str(tmp_path / "x"), *flags])
        assert code == 2 and match in stderr
    assert len(Ledger().entries()) == before  # nothing charged


def test_generation_errors_carry_no_private_length():
    """Error messages of generation, batching, the LM and the record cap name the context and the
    parameters, never a prompt's or a record's length (before: "a prompt of 1942 tokens exceeds...")."""
    import inspect
    import re

    import dpcore.fewshot.generation as generation
    import dpcore.lm.batching as batching
    import dpcore.lm.budget as records_module
    import dpcore.lm.model as lm_module

    private_length = re.compile(r"\{[^}]*(\blongest\b|len\((p|prompt|prompts|ids|text|tokens|record|chunk)\b)")
    for module in (generation, batching, lm_module, records_module):
        for line in inspect.getsource(module).splitlines():
            if 'f"' in line:
                assert not private_length.search(line), line


def test_a_group_with_non_finite_logits_does_not_take_over_the_step(tiny_lm, spec, records):
    """fp16 overflow in one group: before, the NaN row made the noisy sum NaN and arg max returned the
    public favourite whatever the other groups said; now the group counts as uniform over the kept
    set and the other groups' choice wins (sigma = 0, so the choice is deterministic)."""
    favourite, good = tiny_lm.encode(" the")[0], tiny_lm.encode(" good")[0]

    def forward(prompts):
        logits = torch.zeros((len(prompts), tiny_lm.vocab_size))
        logits[:, good] = 50.0  # every group prefers " good"
        logits[0, :] = math.nan  # the first group overflowed
        logits[-1, favourite], logits[-1, good] = 50.0, 40.0  # the public prompt (last row): " the" first
        return logits

    result = generate_demos(tiny_lm, spec, records, _config(max_tokens=2, num_subsets=4), 0.0, seed=3,
                            labels=["World"], forward=forward)
    assert result.demos[0].text == "good good"


# --------------------------------------------------------------------------- sensitivity through the LM


@pytest.mark.parametrize("rvp", [True, False])
def test_neighbouring_datasets_move_the_lm_sum_by_at_most_sqrt2(tiny_lm, spec, records, rvp):
    """D' = D + one record; same randomness (D's groups are D' 's groups without the new record)."""
    rng = np.random.default_rng(5)
    forward = BatchedForward(tiny_lm)
    worst = 0.0
    label = "World"
    base = records[label][:12]
    public = tiny_lm.encode(spec.generation.build(label, []))
    keep = public_top_k(forward([public])[0], 20) if rvp else None
    for trial in range(15):
        extra = f"Added record {trial} " + " ".join(rng.choice(["x", "y", "zz", "news"], size=3))
        with_record = base + [extra]
        groups = poisson_groups(len(with_record), 0.5, 3, rng)
        sums = []
        for drop in (False, True):
            kept_groups = [g[g != len(base)] if drop else g for g in groups]
            prompts = [tiny_lm.encode(spec.generation.build(label, [with_record[i] for i in g]))
                       for g in kept_groups if len(g)]
            logits = forward(prompts) if prompts else torch.zeros((0, tiny_lm.vocab_size))
            sums.append(pre_noise_sum(restricted_softmax(logits, keep)))
        worst = max(worst, float(np.linalg.norm(sums[0] - sums[1])))
    assert 0 < worst <= math.sqrt(2) + 1e-9


# --------------------------------------------------------------------------- modes and baselines


def test_sigma_zero_is_the_same_path_marked_sigma_zero(tiny_lm, spec, records):
    result = generate_demos(tiny_lm, spec, records, _config(max_tokens=3), 0.0, seed=4, labels=["World"])
    assert result.demos[0].method == "sigma-zero" and result.demos[0].noise_multiplier == 0.0


def test_instruction_only_reads_no_record_and_shots_differ(tiny_lm, spec):
    config = _config(max_tokens=6, demos_per_label=3, top_k=50)
    result = instruction_only_demos(tiny_lm, spec, ["World", "Sports"], config, seed=8)
    again = instruction_only_demos(tiny_lm, spec, ["World", "Sports"], config, seed=8)
    assert result.demos == again.demos
    assert len({d.text for d in result.demos if d.label == "World"}) > 1
    demo = result.demos[0]
    assert (demo.method, demo.num_subsets, demo.subset_size, math.isinf(demo.noise_multiplier)) == (
        "instruction-only", 0, 0, True)
    # One public prompt per (label, shot) per step and nothing else.
    assert result.private_stats["prompts"] <= 6 * 6


def test_real_demos_draw_distinct_records_with_ids(records):
    ids = {label: [f"{label}-{i}" for i in range(len(texts))] for label, texts in records.items()}
    frame = real_demos(records, ids, ["World", "Sports"], 3, np.random.default_rng(0))
    assert list(frame.columns) == ["label", "shot", "id", "text", "method"]
    assert len(frame) == 6 and frame.groupby("label")["id"].nunique().tolist() == [3, 3]
    for row in frame.itertuples():
        assert records[row.label][int(row.id.split("-")[-1])] == row.text
    with pytest.raises(ConfigError, match="fewer"):
        real_demos(records, ids, ["World"], 61, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="ids_by_label"):
        real_demos(records, {"World": ["a"]}, ["World"], 1, np.random.default_rng(0))


def test_demos_frame_round_trip(tiny_lm, spec, records, tmp_path):
    demos = generate_demos(tiny_lm, spec, records, _config(max_tokens=2), 0.5, seed=0).demos
    frame = demos_frame(demos)
    assert tuple(frame.columns) == DEMO_COLUMNS
    assert frame.to_dict(orient="records") == [asdict(d) for d in demos]
    frame.to_parquet(tmp_path / "demos.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "demos.parquet"), frame)
    assert list(demos_frame([]).columns) == list(DEMO_COLUMNS)
    assert isinstance(demos[0], Demo)


def test_progress_and_logs_carry_no_record_text(tiny_lm, spec, records, caplog):
    infos = []
    with caplog.at_level(logging.DEBUG):
        generate_demos(tiny_lm, spec, records, _config(max_tokens=2), 0.5, seed=0, progress=infos.append)
    assert [i["step"] for i in infos] == [1, 2]
    assert all(isinstance(v, int | float) for info in infos for k, v in info.items() if k != "private")
    assert all(i["private"]["tokens_per_s"] > 0 for i in infos)  # record-dependent: only under "private"
    assert not {"prompts", "prompt_tokens", "tokens_per_s"} & {k for info in infos for k in info}
    logged = caplog.text
    assert "generation step" in logged and "tokens/s" not in logged and "prompt tokens" not in logged
    assert not any(text in logged for texts in records.values() for text in texts)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("overrides, sigma, match", [
    ({"num_subsets": 0}, 0.5, "num_subsets"),
    ({"subset_size": 0}, 0.5, "subset_size"),
    ({"max_tokens": 0}, 0.5, "max_tokens"),
    ({"top_k": 49153}, 0.5, "top_k"),
    ({"top_k": 0}, 0.5, "top_k"),
    ({"demos_per_label": 0}, 0.5, "demos_per_label"),
    ({"mechanism": "laplace"}, 0.5, "mechanism"),
    ({"sampler": "shuffle"}, 0.5, "sampler"),
    ({}, -1.0, "noise_multiplier"),
    ({}, float("nan"), "noise_multiplier"),
    ({"num_subsets": 40}, 0.5, "sampling rate"),  # q = 80/60 > 1
])
def test_bad_parameters_raise_config_error(tiny_lm, spec, records, overrides, sigma, match):
    config = GenerationConfig.model_construct(**{**_config().model_dump(), **overrides})
    with pytest.raises(ConfigError, match=match):
        generate_demos(tiny_lm, spec, records, config, sigma, seed=0)


def test_label_with_fewer_than_n_records_is_refused(tiny_lm, spec, records):
    small = {**records, "Sports": ["only one"]}
    with pytest.raises(ConfigError, match=r"'Sports' has 1 private records, fewer than --subset-size \(subset_size\)"):
        generate_demos(tiny_lm, spec, small, _config(), 0.5, seed=0)


@pytest.mark.parametrize("labels, match", [(["Weather"], "not among"), ([], "no label"),
                                           (["World", "World"], "twice")])
def test_bad_labels_are_refused(tiny_lm, spec, records, labels, match):
    with pytest.raises(ConfigError, match=match):
        generate_demos(tiny_lm, spec, records, _config(), 0.5, seed=0, labels=labels)


def test_errors_never_carry_record_text(tiny_lm, spec, records):
    secret = {"World": ["TOP SECRET patient record"], "Sports": records["Sports"]}
    with pytest.raises(ConfigError) as info:
        generate_demos(tiny_lm, spec, secret, _config(), 0.5, seed=0)
    assert "SECRET" not in str(info.value)


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("epsilon, method", [("inf", "sigma-zero"), ("0", "instruction-only")])
def test_cli_generate_writes_demos_and_json(tiny_model_dir, tmp_path, cli, epsilon, method):
    out = tmp_path / "run"
    code, stdout, _ = cli(["generate", "--dataset", "agnews", "--epsilon", epsilon, "--model", str(tiny_model_dir),
                           "--max-tokens", "2", "--num-subsets", "2", "--seed", "1", "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(stdout.strip().splitlines()[-1])
    for key in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps", "demos"):
        assert key in report
    assert report["steps"] == 2 and report["epsilon"] == ("inf" if epsilon == "inf" else 0.0)
    assert [d["label"] for d in report["demos"]] == LABELS
    assert {"label", "text", "tokens", "stop_reason"} <= set(report["demos"][0])
    frame = pd.read_parquet(out / "demos.parquet")
    assert set(frame["method"]) == {method} and len(frame) == 4
    assert (out / "generation.json").exists() and (out / "manifest.json").exists()


def test_cli_generate_calibrates_and_charges(tiny_model_dir, tmp_path, cli):
    out = tmp_path / "run"
    code, stdout, _ = cli(["generate", "--dataset", "agnews", "--epsilon", "4", "--model", str(tiny_model_dir),
                           "--max-tokens", "2", "--shots", "8", "--seed", "1", "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["steps"] == 4  # 8 shots over 4 labels: 2 demos per label, T = 2 * 2
    assert 0 < report["noise_multiplier"] < 10 and report["epsilon"] <= 4.0 + 1e-6
    # q = MN / |D_y| at the smallest label of AG News' private split (the defaults: M = 5, N = 1)
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    smallest = min(load_dataset(load_task_spec("agnews")).label_counts().values())
    defaults = RunConfig()
    assert report["sampling_rate"] == pytest.approx(defaults.num_subsets * defaults.subset_size / smallest, rel=1e-9)
    assert len(report["demos"]) == 8


@pytest.mark.parametrize("flags, match", [
    (["--num-subsets", "0"], "num_subsets"),
    (["--top-k", "0"], "top_k"),
    (["--num-subsets", "20000", "--subset-size", "2"], "sampling rate"),  # MN = 40,000 > |D_y| (about 29,700)
])
def test_cli_generate_bad_input_exits_2(tiny_model_dir, tmp_path, cli, flags, match):
    code, _, stderr = cli(["generate", "--dataset", "agnews", "--epsilon", "inf", "--model", str(tiny_model_dir),
                           "--out", str(tmp_path / "x"), *flags])
    assert code == 2 and match in stderr


# --------------------------------------------------------------------------- peaked distributions


def test_peaked_distributions_move_the_sum_by_at_most_sqrt2(peaked_lm, spec, records):
    """The sensitivity bound with RVP (K=100) where it is tight: near one-hot group distributions, which the flat
    tiny model's test above does not reach (its worst trial moves the sum by about 0.23)."""
    label = "Business"
    base = records[label][:12]
    rng = np.random.default_rng(5)
    forward = BatchedForward(peaked_lm)
    keep = public_top_k(forward([peaked_lm.encode(spec.generation.build(label, []))])[0], 100)
    worst = 0.0
    for trial in range(15):
        extra = f"Added record {trial} " + " ".join(rng.choice(["x", "y", "zz", "news"], size=3))
        with_record = base + [extra]
        groups = poisson_groups(len(with_record), 0.5, 3, rng)
        sums = []
        for drop in (False, True):
            kept = [g[g != len(base)] if drop else g for g in groups]
            prompts = [peaked_lm.encode(spec.generation.build(label, [with_record[i] for i in g]))
                       for g in kept if len(g)]
            logits = forward(prompts) if prompts else torch.zeros((0, peaked_lm.vocab_size))
            sums.append(pre_noise_sum(restricted_softmax(logits, keep)))
        worst = max(worst, float(np.linalg.norm(sums[0] - sums[1])))
    assert 1.0 < worst <= math.sqrt(2) + 1e-6  # near the bound, never past it


def test_peaked_distributions_rvp_and_labels_at_once_equal_one_at_a_time(peaked_lm, spec, records, monkeypatch):
    """On peaked distributions: every chosen token is in the public top-K, and generating two labels together
    gives the tokens each gets alone with the same seed."""
    import dpcore.fewshot.generation as generation

    labels = ["World", "Sports"]
    config = GenerationConfig(num_subsets=3, subset_size=1, top_k=10, max_tokens=3)
    chosen = []
    original = generation.noisy_argmax

    def spy(scores, keep):
        token = original(scores, keep)
        chosen.append(token in set(keep.tolist()) and len(keep) == 10)
        return token

    monkeypatch.setattr(generation, "noisy_argmax", spy)
    together = generate_demos(peaked_lm, spec, records, config, 0.3, seed=5, labels=labels)
    alone = [generate_demos(peaked_lm, spec, records, config, 0.3, seed=5, labels=[y]).demos[0] for y in labels]
    assert chosen and all(chosen)
    assert [(d.label, d.text, d.tokens) for d in together.demos] == [(d.label, d.text, d.tokens) for d in alone]
    assert together.demos[0].text != together.demos[1].text  # the labels' prompts lead to different tokens
