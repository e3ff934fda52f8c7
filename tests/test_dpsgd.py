"""PromptDPSGD (Duan et al. Section 4.1, App. C.1 Algorithm 1): what a DP reviewer asks of a DP-SGD
implementation, on the tiny random model.

- per-example gradients (line 5) equal one-example backward passes, for soft prompts and prefixes;
- the training objective is the ICL label score (`icl.label_logprobs` with the prompt's cache);
- every clipped per-example gradient (line 6) has norm <= C, and the sum is the sum of the clipped;
- the noise (line 7) has standard deviation sigma C, mean 0, and comes from the generator passed in;
- the sampler (line 4) includes each example with probability q, independently;
- accountants agree: our composition, Opacus' PRV and RDP accountants, dp-accounting's PLD;
- the frozen LM's weights are unchanged by training; a resumed run continues the same noise stream;
- `dpicl tune`: the --json contract, no private text outside the private store, the ledger refusal
  (exit 3, nothing spent or written), bad input (a clear error, nothing written).
"""

from __future__ import annotations

import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import prefect.main  # noqa: F401  Prefect configures logging on first import: at collection, not inside a test
import pytest
import torch
from pipeline_support import prefect_harness  # noqa: F401  (the shared harness fixture)

from dpcore.data.taskspec import load_task_spec
from dpcore.dpsgd import soft_prompt as sp
from dpcore.dpsgd import training as dpsgd
from dpcore.errors import ConfigError, RunStopped
from dpcore.lm import icl
from dpcore.names import PROMPT_KINDS
from dpcore.privacy import composition

TEXTS = ["a gripping , beautifully acted film", "dull , lifeless and far too long", "it is fine",
         "one of the worst movies of the year", "an absolute delight from start to finish"]


@pytest.fixture(scope="module")
def sst2_spec():
    return load_task_spec("sst2")


@pytest.fixture(scope="module")
def examples(tiny_lm, sst2_spec):
    labels = [sst2_spec.label_names[i % 2] for i in range(len(TEXTS))]
    return sp.encode_examples(tiny_lm, sst2_spec, TEXTS, labels)


def _prompt(lm, kind: str, length: int = 3, seed: int = 0) -> sp.TrainablePrompt:
    return sp.init_prompt(lm, kind, length, "vocab", torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- gradients and objective


@pytest.mark.parametrize("kind", PROMPT_KINDS)
def test_per_example_gradients_equal_one_example_backward_passes(tiny_lm, examples, kind):
    prompt = _prompt(tiny_lm, kind)
    grads, losses = sp.per_example_gradients(tiny_lm, prompt, examples)
    assert grads.shape == (len(examples), *prompt.weight.shape)
    for b, example in enumerate(examples):
        prompt.weight.grad = None
        with sp.frozen(tiny_lm.model):
            loss = -sp.example_logprobs(tiny_lm, kind, prompt.weight.unsqueeze(0), [example])[0]
            loss.backward()
        assert float(loss.detach()) == pytest.approx(float(losses[b]), abs=1e-5)
        scale = float(prompt.weight.grad.abs().max())
        assert scale > 0
        torch.testing.assert_close(grads[b], prompt.weight.grad, rtol=1e-4, atol=1e-5 * scale)  # fp32 reduction order
    # rows are independent: a different batch composition gives the same per-example gradient
    alone, _ = sp.per_example_gradients(tiny_lm, prompt, examples[2:3])
    torch.testing.assert_close(alone[0], grads[2], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("kind", PROMPT_KINDS)
def test_the_training_objective_is_the_icl_label_score(tiny_lm, sst2_spec, examples, kind):
    prompt = _prompt(tiny_lm, kind, seed=1)
    scores = icl.label_logprobs(tiny_lm, sst2_spec, [], TEXTS, past=prompt.cache_layers(tiny_lm))
    rows = prompt.weight.detach().unsqueeze(0).expand(len(examples), *prompt.weight.shape)
    trained = sp.example_logprobs(tiny_lm, kind, rows, examples).detach().numpy()
    gold = [i % 2 for i in range(len(TEXTS))]
    np.testing.assert_allclose(trained, scores[np.arange(len(TEXTS)), gold], rtol=1e-4, atol=1e-4)
    # and the prompt matters: without it the scores differ
    plain = icl.label_logprobs(tiny_lm, sst2_spec, [], TEXTS)
    assert np.abs(plain - scores).max() > 1e-3


# --------------------------------------------------------------------------- clipping, noise, sampling


def _optimizer(weight: torch.Tensor, sigma: float, clip: float, expected: float, seed: int = 0):
    prompt = sp.TrainablePrompt("soft-prompt", weight)
    optimizer = dpsgd.dp_optimizer(prompt, sigma, clip, expected, 1e-3, torch.Generator().manual_seed(seed))
    return prompt, optimizer


def test_every_clipped_per_example_gradient_has_norm_at_most_C():
    clip = 0.1
    generator = torch.Generator().manual_seed(3)
    directions = torch.randn((12, 4, 8), generator=generator)
    norms = torch.logspace(-3, 2, 12)  # from far below C to far above
    grads = directions / directions.flatten(1).norm(dim=1).view(-1, 1, 1) * norms.view(-1, 1, 1)
    clipped = []
    for g in grads:
        prompt, optimizer = _optimizer(torch.zeros(4, 8), sigma=0.0, clip=clip, expected=1.0)
        dpsgd.private_step(optimizer, prompt, [g[None]])
        c = prompt.weight.grad.clone()  # sigma = 0, expected batch 1: the clipped gradient itself
        assert float(c.norm()) <= clip * (1 + 1e-6)
        if float(g.norm()) <= clip * 0.99:
            torch.testing.assert_close(c, g, rtol=1e-4, atol=1e-9)
        else:
            assert float(c.norm()) == pytest.approx(clip, rel=1e-4)
            assert float(torch.nn.functional.cosine_similarity(c.flatten(), g.flatten(), dim=0)) > 0.9999
        clipped.append(c)
    # one batch in two physical chunks: the sum of the clipped gradients, divided by the expected size qN
    prompt, optimizer = _optimizer(torch.zeros(4, 8), sigma=0.0, clip=clip, expected=6.0)
    dpsgd.private_step(optimizer, prompt, [grads[:5], grads[5:]])
    torch.testing.assert_close(prompt.weight.grad * 6.0, torch.stack(clipped).sum(0), rtol=1e-4, atol=1e-7)


def test_noise_has_standard_deviation_sigma_C_on_the_sum():
    sigma, clip, d = 1.3, 0.1, 20_000
    prompt, optimizer = _optimizer(torch.zeros(100, 200), sigma=sigma, clip=clip, expected=1.0, seed=11)
    dpsgd.private_step(optimizer, prompt, [])  # an empty Poisson batch: noise only
    noise = prompt.weight.grad.flatten().double()
    std = sigma * clip
    assert abs(float(noise.std()) - std) < 5 * std / math.sqrt(2 * d)  # 5 standard errors of a sample std
    assert abs(float(noise.mean())) < 5 * std / math.sqrt(d)
    # with gradients: grad * qN - sum of clipped is the noise, same statistics
    grads = torch.full((7, 100, 200), 1.0)
    prompt, optimizer = _optimizer(torch.zeros(100, 200), sigma=sigma, clip=clip, expected=7.0, seed=12)
    dpsgd.private_step(optimizer, prompt, [grads])
    clipped_sum = 7 * clip * grads[0] / grads[0].norm()
    residual = (prompt.weight.grad * 7.0 - clipped_sum).flatten().double()
    assert abs(float(residual.std()) - std) < 5 * std / math.sqrt(2 * d)
    # the generator passed in is the noise source: same seed, same noise; another seed, other noise
    again, optimizer = _optimizer(torch.zeros(100, 200), sigma=sigma, clip=clip, expected=1.0, seed=11)
    dpsgd.private_step(optimizer, again, [])
    assert torch.equal(again.weight.grad.flatten().double(), noise)
    other, optimizer = _optimizer(torch.zeros(100, 200), sigma=sigma, clip=clip, expected=1.0, seed=13)
    dpsgd.private_step(optimizer, other, [])
    assert not torch.equal(other.weight.grad.flatten().double(), noise)


def test_the_sampler_includes_each_example_with_probability_q():
    n, q, steps = 50, 0.2, 4000
    counts = np.zeros(n)
    sizes = []
    for batch in dpsgd.poisson_batches(n, q, steps, torch.Generator().manual_seed(5)):
        counts[batch] += 1
        sizes.append(len(batch))
    assert len(sizes) == steps
    sd = math.sqrt(steps * q * (1 - q))
    assert np.abs(counts - steps * q).max() < 5 * sd
    assert abs(np.mean(sizes) - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.15)  # Binomial(n, q): independent inclusions
    assert 0 in sizes or min(sizes) < n * q  # batch sizes vary (not a fixed-size sampler)


def test_generators_are_cryptographically_seeded_unless_a_seed_is_given():
    a, _, seeded_a = dpsgd.generators(None)
    b, _, _ = dpsgd.generators(None)
    assert not seeded_a and not torch.equal(torch.randn(4, generator=a), torch.randn(4, generator=b))
    c, _, seeded_c = dpsgd.generators(7)
    d, _, _ = dpsgd.generators(7)
    assert seeded_c and torch.equal(torch.randn(4, generator=c), torch.randn(4, generator=d))


# --------------------------------------------------------------------------- accounting


def test_accountants_agree_on_the_poisson_subsampled_gaussian():
    from dp_accounting.pld import PLDAccountant
    from opacus.accountants import PRVAccountant, RDPAccountant

    sigma, q, steps, delta = 0.9, 0.01, 1000, 1e-5
    ours = composition.compose([dpsgd.dpsgd_event(sigma, q, steps)], delta)
    assert ours.crosscheck_agreed
    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    rdp = RDPAccountant()
    rdp.history = [(sigma, q, steps)]
    pld = PLDAccountant()
    pld.compose(dpsgd.dpsgd_event(sigma, q, steps))
    eps_prv, eps_rdp, eps_pld = prv.get_epsilon(delta), rdp.get_epsilon(delta), pld.get_epsilon(delta)
    assert ours.epsilon == pytest.approx(eps_prv, rel=0.03)
    assert ours.epsilon == pytest.approx(eps_pld, rel=0.03)
    assert ours.epsilon <= eps_rdp * 1.01 and eps_rdp < 1.5 * ours.epsilon  # RDP is a looser upper bound


def test_the_plan_calibrates_sigma_to_the_target_epsilon():
    config = dpsgd.DpsgdConfig(batch_size=100, epochs=2.0, length=4)
    plan = dpsgd.dpsgd_plan(4.0, 10_000, config)
    (spend,) = plan.spends
    assert (plan.method, spend.mechanism, spend.purpose) == ("dpsgd", "gaussian", "dpsgd")
    assert spend.sampling_rate == pytest.approx(0.01) and spend.steps == 200
    assert plan.delta == pytest.approx(1e-4)  # delta = 1/N
    eps = plan.composed().epsilon
    assert 3.9 <= eps <= 4.0
    looser = composition.compose([dpsgd.dpsgd_event(spend.noise_multiplier - 0.01, 0.01, 200)], 1e-4).epsilon
    assert looser > 4.0  # the smallest sigma (to the tolerance)
    assert len(dpsgd.dpsgd_plan(4.0, 10_000, config, trainings=3).spends) == 3
    assert dpsgd.dpsgd_plan(math.inf, 10_000, config).spends[0].noise_multiplier == 0.0


def test_the_instruction_start_is_the_embeddings_of_the_task_instruction_tokens(tiny_lm, sst2_spec):
    agnews = load_task_spec("agnews")
    ids = sp.instruction_ids(tiny_lm, agnews)
    assert ids == tiny_lm.encode(agnews.icl.instruction) and len(ids) > 3
    table = tiny_lm.model.get_input_embeddings().weight.detach().float()
    long = sp.init_prompt(tiny_lm, "soft-prompt", len(ids) + 2, "instruction", torch.Generator().manual_seed(0), ids)
    cycled = ids + ids[:2]  # a prompt longer than the instruction cycles it
    assert torch.equal(long.weight.detach(), table[cycled])
    short = sp.init_prompt(tiny_lm, "soft-prompt", 3, "instruction", torch.Generator().manual_seed(5), ids)
    assert torch.equal(short.weight.detach(), table[ids[:3]])  # no randomness: the generator's seed is irrelevant
    # SST-2's ICL prompt has no instruction: its label words are the public text to start from
    words = sp.instruction_ids(tiny_lm, sst2_spec)
    assert not sst2_spec.icl.instruction and words == tiny_lm.encode(
        ", ".join(sst2_spec.verbalizer(label).strip() for label in sst2_spec.label_names))
    prefix = sp.init_prompt(tiny_lm, "prefix", 2, "instruction", torch.Generator().manual_seed(0), ids)
    assert torch.allclose(prefix.weight.detach(), sp.init_prompt(
        tiny_lm, "prefix", 2, "instruction", torch.Generator().manual_seed(9), ids).weight.detach())
    with pytest.raises(ConfigError, match="dpsgd_init"):
        sp.init_prompt(tiny_lm, "soft-prompt", 3, "instruction", torch.Generator().manual_seed(0), [])


def test_the_cpu_preset_is_the_recipe_and_every_flag_overrides_it():
    from dpcore.config import RunConfig

    cpu = dpsgd.dpsgd_config(RunConfig(dpsgd_preset="cpu"))
    assert (cpu.batch_size, cpu.steps, cpu.lr, cpu.length, cpu.init, cpu.clip) == (64, 48, 0.3, 10, "instruction", 0.1)
    gpu = dpsgd.dpsgd_config(RunConfig(dpsgd_preset="gpu"))
    assert (gpu.batch_size, gpu.epochs, gpu.lr, gpu.init) == (1024, 100.0, 0.005, "vocab")  # Duan et al. Table 6
    mine = dpsgd.dpsgd_config(RunConfig(dpsgd_preset="cpu", dpsgd_init="vocab", dpsgd_steps=7, dpsgd_lr=0.01))
    assert (mine.init, mine.steps, mine.lr, mine.batch_size) == ("vocab", 7, 0.01, 64)


def test_a_trained_prompt_is_answered_with_raw_scores_unless_asked():
    from dpcore.release.predict import default_calibration

    assert default_calibration("dpsgd") is False
    assert default_calibration("tang") is True and default_calibration("pate") is True


@pytest.mark.parametrize("change, needle", [
    ({"length": 0}, "dpsgd_length"), ({"clip": 0.0}, "dpsgd_clip"), ({"clip": -1.0}, "dpsgd_clip"),
    ({"batch_size": 20_000}, "dpsgd_batch_size"), ({"kind": "adapter"}, "dpsgd_kind"), ({"lr": 0.0}, "dpsgd_lr"),
])
def test_bad_training_parameters_are_named(change, needle):
    config = dpsgd.DpsgdConfig(batch_size=100, epochs=1.0).model_copy(update=change)
    with pytest.raises(ConfigError, match=needle):
        dpsgd.dpsgd_plan(8.0, 10_000, config)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan")])
def test_epsilon_must_be_positive(epsilon):
    with pytest.raises(ConfigError, match="epsilon"):
        dpsgd.dpsgd_plan(epsilon, 1000, dpsgd.DpsgdConfig(batch_size=10, epochs=1.0))


def test_models_without_embeddings_or_with_another_cache_layout_are_refused(tiny_lm):
    no_embeddings = SimpleNamespace(name="stub", model=SimpleNamespace(
        get_input_embeddings=lambda: None, get_decoder=lambda: object(), get_output_embeddings=lambda: object(),
        config=tiny_lm.model.config))
    with pytest.raises(ConfigError, match="input embedding"):
        sp.check_prompt(no_embeddings, "soft-prompt", 4)
    config = copy.deepcopy(tiny_lm.model.config)
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    config.sliding_window = 8
    sliding = SimpleNamespace(name="stub-sliding", model=SimpleNamespace(
        get_input_embeddings=tiny_lm.model.get_input_embeddings, get_decoder=tiny_lm.model.get_decoder,
        get_output_embeddings=tiny_lm.model.get_output_embeddings, config=config))
    with pytest.raises(ConfigError, match="cache layout"):
        sp.check_prompt(sliding, "prefix", 4)
    assert sp.check_prompt(sliding, "soft-prompt", 4) == (4, tiny_lm.model.config.hidden_size)
    with pytest.raises(ConfigError, match="dpsgd_length"):
        sp.check_prompt(tiny_lm, "soft-prompt", 0)


# --------------------------------------------------------------------------- training


def _train(lm, examples, steps=4, seed=9, **kwargs):
    noise, sampling, seeded = dpsgd.generators(seed)
    prompt = sp.init_prompt(lm, "soft-prompt", 3, "vocab", sampling)
    result = dpsgd.train(lm, prompt, examples, examples[:2], noise_multiplier=1.0, sampling_rate=0.6, steps=steps,
                         clip=0.1, lr=0.05, delta=1e-3, noise_generator=noise, sampling_generator=sampling,
                         seeded=seeded, physical_batch_size=2, eval_every=2, **kwargs)
    return result


def test_training_leaves_the_frozen_model_unchanged(tiny_lm, examples):
    before = sp.weights_hash(tiny_lm.model)
    flags = [p.requires_grad for p in tiny_lm.model.parameters()]
    start = sp.init_prompt(tiny_lm, "soft-prompt", 3, "vocab", dpsgd.generators(9)[1]).weight.detach().clone()
    result = _train(tiny_lm, examples)
    assert sp.weights_hash(tiny_lm.model) == before
    assert [p.requires_grad for p in tiny_lm.model.parameters()] == flags
    assert not torch.equal(result.prompt.weight.detach(), start)  # the prompt did move
    assert [p["step"] for p in result.curve] == [0, 2, 4] and result.curve[-1]["epsilon"] > 0
    assert len(result.private_losses) == 4


def test_a_resumed_run_continues_the_same_batches_and_noise(tiny_lm, examples):
    saved = []
    whole = _train(tiny_lm, examples, checkpoint_every=2, checkpoint=saved.append, fingerprint="f")
    assert [s["step"] for s in saved] == [0, 2]  # P_0 before any draw, then every 2 steps (not the last)
    for state in saved:
        resumed = _train(tiny_lm, examples, resume=state, fingerprint="f")
        torch.testing.assert_close(resumed.prompt.weight, whole.prompt.weight, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="checkpoint"):
        _train(tiny_lm, examples, resume=saved[0], fingerprint="another plan")


def _stop_in_progress(monkeypatch, done):
    """A stop request seen at step 3's progress report (what `tasks.common.report_progress` raises)."""
    def progress(step, steps, info):
        done.append(step)
        if step == 3:
            raise RunStopped("DP-SGD steps: stopped on request at 3/6")
    return progress


def _stop_in_gradients(monkeypatch, done):
    """Ctrl-C while step 4's per-example gradients are computed: its Poisson batch is drawn, nothing updated."""
    real = dpsgd.example_gradients

    def gradients(*args):
        if len(done) >= 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(dpsgd, "example_gradients", gradients)
    return lambda step, steps, info: done.append(step)


def _stop_in_update(monkeypatch, done):
    """Ctrl-C inside step 3's update: AdamW has moved P, the schedule has not stepped (a half-made state)."""
    real = torch.optim.AdamW.step
    calls = []

    def step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return lambda step, steps, info: done.append(step)


@pytest.fixture(scope="module")
def whole_six(tiny_lm, examples):
    """An uninterrupted training of 6 steps (the stop tests' reference)."""
    return _train(tiny_lm, examples, steps=6)


@pytest.mark.parametrize(("stop", "kept"), [(_stop_in_progress, [0, 3]), (_stop_in_gradients, [0, 3]),
                                            (_stop_in_update, [0])])
def test_a_stopped_training_keeps_its_last_finished_step_and_resumes_bit_for_bit(tiny_lm, examples, whole_six,
                                                                                   monkeypatch, stop, kept):
    """Stopped at step 3 of 6 with a checkpoint every 50 steps (none periodic yet): kept are step 0 (P_0, before
    any draw) and the last finished step, or only step 0 when the stop landed inside an update (its state is half
    made). The training resumed from the last kept state takes only the steps after it and ends bit for bit
    where the uninterrupted one does: the same batches, the same noise, the same curve and members."""
    whole = whole_six
    saved, done = [], []
    progress = stop(monkeypatch, done)
    with pytest.raises((RunStopped, KeyboardInterrupt)):
        _train(tiny_lm, examples, steps=6, checkpoint=saved.append, fingerprint="f", progress=progress)
    monkeypatch.undo()
    assert [s["step"] for s in saved] == kept
    after = []
    resumed = _train(tiny_lm, examples, steps=6, resume=saved[-1], fingerprint="f",
                     progress=lambda step, steps, info: after.append(step))
    assert after == list(range(kept[-1] + 1, 7))
    assert torch.equal(resumed.prompt.weight, whole.prompt.weight)
    assert resumed.curve == whole.curve and resumed.sampled == whole.sampled
    np.testing.assert_array_equal(resumed.private_losses, whole.private_losses)


def test_saved_prompt_round_trips(tmp_path, tiny_lm):
    prompt = _prompt(tiny_lm, "prefix")
    sp.save_prompt(prompt, tmp_path / "p.safetensors", {"epsilon": 8.0})
    loaded, manifest = sp.load_prompt(tmp_path / "p.safetensors")
    assert loaded.kind == "prefix" and manifest["epsilon"] == 8.0 and manifest["length"] == 3
    assert torch.equal(loaded.weight, prompt.weight.detach())


# --------------------------------------------------------------------------- dpicl tune


def _tune_args(*extra: str, dataset_id: str = "agnews-mini") -> list[str]:
    from pipeline_support import mini_agnews

    data_path, spec_path, _, _ = mini_agnews()
    return ["tune", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--dataset-id", dataset_id, "--model", "tiny-random", "--kind", "soft-prompt", "--length", "2",
            "--steps", "3", "--batch-size", "16", "--validation-size", "20", "--test-size", "8", *extra]


def _written(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
            and not p.name.startswith(("prefect", "mlflow", "dpicl.log", "ledger.db"))
            and "prefect" not in p.relative_to(root).parts and "mlflow" not in p.relative_to(root).parts
            and "logs" not in p.relative_to(root).parts and "models" not in p.relative_to(root).parts}


@pytest.mark.usefixtures("prefect_harness")
def test_tune_json_contract_and_no_private_text_outside_the_private_store(tiny_lm, capsys):
    from pipeline_support import home, share_tiny_model
    from test_privacy_boundary import (
        _file_text,
        _id_leaks,
        _leaks,
        _needles,
        _per_record_problems,
        _scanned_files,
    )

    from flows.cli import main
    from tasks.common import add_progress_sink, remove_progress_sink
    from tasks.tracking import mlflow_client

    share_tiny_model(tiny_lm)
    capsys.readouterr()
    details = []
    sink = lambda what, done, total, detail="": details.append(detail)  # noqa: E731
    add_progress_sink(sink)
    try:
        assert main(_tune_args("--epsilon", "8", "--json", dataset_id="tune-json")) == 0
    finally:
        remove_progress_sink(sink)
    out, err = capsys.readouterr()
    # the bar's detail: epsilon spent so far (and the loss on public examples when there are some: not for a
    # user's file without --validation-path); no per-step timing (it would reveal the batch sizes)
    assert any(d.startswith("epsilon ") for d in details) and not any("ex/s" in d for d in details), details
    result = json.loads(out.strip().splitlines()[-1])
    for key in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "steps", "accuracy", "prompt", "params",
                "kind", "length", "clip", "batch_size", "lr", "epochs", "run_id", "seeded_noise"):
        assert key in result, key
    assert result["epsilon"] == 8.0 and result["steps"] == 3 and result["kind"] == "soft-prompt"
    assert set(result["accuracy"]) >= {"mean", "std"} and 0 <= result["accuracy"]["mean"] <= 1
    assert result["noise_multiplier"] > 0 and result["seeded_noise"] is False
    prompt, manifest = sp.load_prompt(result["prompt"])
    assert prompt.kind == "soft-prompt" and prompt.length == 2
    for key in ("model", "model_weights_sha256", "epsilon", "delta", "noise_multiplier", "sampling_rate", "steps",
                "clip", "accountants"):
        assert key in manifest, key
    assert manifest["model_weights_sha256"] == sp.weights_hash(tiny_lm.model)
    from dpcore.privacy.ledger import Ledger

    entries = Ledger().entries("tune-json")
    assert [(e.purpose, e.steps) for e in entries] == [("dpsgd", 3)]

    needles = _needles()
    root = home()
    files = _scanned_files(root)
    leaks = {str(p.relative_to(root)): found for p in files if (found := _leaks(_file_text(p), needles))}
    assert leaks == {}
    assert _leaks(out + err, needles) == [] and _leaks(" ".join(details), needles) == []
    import pandas as pd

    private_records = pd.read_parquet(next((root / "private" / "runs").rglob(f"*{result['run_id']}*/records.parquet")))
    ids = set(private_records["id"].astype(str))
    # 1/N, N = every private training record (no private validation split)
    assert result["delta"] == pytest.approx(1 / int((private_records["split"] == "train").sum()))
    run_files = [p for p in files if result["run_id"] in str(p)]
    assert any(p.suffix == ".safetensors" for p in run_files)
    assert {str(p): found for p in run_files if (found := _id_leaks(_file_text(p), ids))} == {}
    assert {str(p): found for p in run_files if p.suffix in (".parquet", ".json")
            if (found := _per_record_problems(p))} == {}
    client = mlflow_client()
    for run_id in result["mlflow_run_ids"]:
        run = client.get_run(run_id)
        logged = json.dumps([run.data.params, run.data.tags, run.data.metrics])
        assert _leaks(logged, needles) == []
        assert {a.path for a in client.list_artifacts(run_id)} == {"prompt"}


def test_tune_over_budget_is_refused_with_exit_3_and_spends_nothing(tiny_lm, capsys):
    from pipeline_support import home, share_tiny_model

    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    share_tiny_model(tiny_lm)
    Ledger().set_budget("tune-budget", 1.0, 1e-3)
    before = _written(home())
    capsys.readouterr()
    assert main(_tune_args("--epsilon", "8", dataset_id="tune-budget")) == 3
    _, err = capsys.readouterr()
    assert "refused" in err
    assert Ledger().entries("tune-budget") == []
    assert _written(home()) == before


@pytest.mark.parametrize("flags, needle", [
    (["--epsilon", "8", "--length", "0"], "length"),
    (["--epsilon", "8", "--clip", "0"], "clip"),
    (["--epsilon", "8", "--clip", "-0.5"], "clip"),
    (["--epsilon", "8", "--batch-size", "100000"], "batch"),
    (["--epsilon", "0"], "epsilon"),
])
def test_tune_bad_input_is_a_clear_error_and_writes_nothing(tiny_lm, capsys, flags, needle):
    from pipeline_support import home, share_tiny_model

    from dpcore.home import content_key
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    share_tiny_model(tiny_lm)
    content_key()  # the home's own key, made on its first data read: not written by the refused command
    before = _written(home())
    capsys.readouterr()
    assert main(_tune_args(dataset_id="tune-bad") + flags) == 2
    _, err = capsys.readouterr()
    assert needle in err and "Traceback" not in err
    assert Ledger().entries("tune-bad") == []
    assert _written(home()) == before


def test_a_negative_epsilon_is_a_usage_error():
    from flows.cli import main

    with pytest.raises(SystemExit) as stop:
        main(_tune_args("--epsilon", "-1"))
    assert stop.value.code == 2


def _flow_config(**overrides):
    from pipeline_support import tiny_config

    values = dict(methods=["dpsgd"], epsilons=[8.0], dataset_id="tune-flow", dpsgd_length=2, dpsgd_steps=2,
                  dpsgd_batch_size=8, dpsgd_validation_size=10, test_size=6, seed=None)
    values.update(overrides)
    return tiny_config(**values)


@pytest.mark.usefixtures("prefect_harness")
def test_a_retried_run_is_not_charged_twice_and_never_redraws_under_an_old_charge(tiny_lm):
    from pathlib import Path

    from pipeline_support import share_tiny_model

    from dpcore.privacy.ledger import Ledger
    from flows.tune import dpsgd_flow
    from tasks.common import run_paths

    share_tiny_model(tiny_lm)
    config = _flow_config()
    first = dpsgd_flow(config=config, run_id="tune-retry")
    assert [e.purpose for e in Ledger().entries("tune-flow")] == ["dpsgd"]
    prompt = Path(first["prompts"][0]["path"])
    made = prompt.stat().st_mtime_ns
    again = dpsgd_flow(config=config, run_id="tune-retry")  # a retry after the training finished: a replay
    assert len(Ledger().entries("tune-flow")) == 1 and again["ledger"]["charged"] == 0
    assert prompt.stat().st_mtime_ns == made  # the finished prompt is served, not retrained
    assert again["results"][0]["accuracy_mean"] == first["results"][0]["accuracy_mean"]
    prompt.unlink()  # the prompt is gone and there is no checkpoint: unseeded noise is never redrawn
    with pytest.raises(ConfigError, match="new run id"):
        dpsgd_flow(config=config, run_id="tune-retry")
    # nor under a forged mark (one that is not the training's own): a mark starts only the training it names
    marks = run_paths(first["dataset"], first["data_hash"], "tune-retry").private / "checkpoints"
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"{prompt.stem}.pending").write_text(json.dumps({"fingerprint": "another training"}))
    with pytest.raises(ConfigError, match="new run id"):
        dpsgd_flow(config=config, run_id="tune-retry")
    assert len(Ledger().entries("tune-flow")) == 1


@pytest.mark.usefixtures("prefect_harness")
def test_a_stopped_tuning_resumes_under_its_run_id_with_no_refusal_and_no_second_charge(tiny_lm):
    """Stopped at step 3 of 5 of the first training (a checkpoint every 50 steps: none periodic yet), before the
    second began: resumed under the same run id, the first continues after step 3 and the second starts from
    its first step (the flow marked it when it charged it); nothing is refused or charged again, and, seeded,
    both prompts are bit for bit those of an uninterrupted run."""
    from pathlib import Path

    from pipeline_support import share_tiny_model

    from dpcore.errors import RunStopped
    from dpcore.privacy.ledger import Ledger
    from flows.tune import dpsgd_flow
    from tasks import common
    from tasks.common import run_paths

    share_tiny_model(tiny_lm)
    config = _flow_config(seed=3, dpsgd_steps=5, dpsgd_seeds=2, dpsgd_batch_size=4, dpsgd_validation_size=2,
                          test_size=2, dataset_id="tune-stop")
    whole = dpsgd_flow(config=config, run_id="tune-stop-whole")
    steps: dict[str, list[int]] = {}

    def sink(what, done, total, detail=""):
        if "DP-SGD steps" in what:
            steps.setdefault(what.split(": ")[0], []).append(done)
            if done == 2 and not common.STOP_REQUESTED.is_set() and len(steps) == 1:
                common.STOP_REQUESTED.set()  # the training stops at its next step's report (step 3)

    common.add_progress_sink(sink)
    try:
        with pytest.raises(RunStopped):
            dpsgd_flow(config=config, run_id="tune-stop")
        common.STOP_REQUESTED.clear()
        private = run_paths(whole["dataset"], whole["data_hash"], "tune-stop").private / "checkpoints"
        assert sorted(p.name for p in private.iterdir()) == ["dpsgd-eps8-0.pt", "dpsgd-eps8-1.pending"]
        charged = [e.to_dict() for e in Ledger().entries("tune-stop") if e.run_id == "tune-stop"]
        assert len(charged) == 2 and steps == {"tune eps=8 #0": [1, 2]}
        steps.clear()
        resumed = dpsgd_flow(config=config, run_id="tune-stop")
    finally:
        common.STOP_REQUESTED.clear()
        common.remove_progress_sink(sink)
    assert steps == {"tune eps=8 #0": [4, 5], "tune eps=8 #1": [1, 2, 3, 4, 5]}
    assert resumed["ledger"]["charged"] == 0
    assert [e.to_dict() for e in Ledger().entries("tune-stop") if e.run_id == "tune-stop"] == charged
    assert not list(private.iterdir())  # finished: no checkpoint, no mark left
    for a, b in zip(whole["prompts"], resumed["prompts"], strict=True):
        assert torch.equal(sp.load_prompt(Path(a["path"]))[0].weight, sp.load_prompt(Path(b["path"]))[0].weight)
        assert json.dumps(a["curve"]) == json.dumps(b["curve"])  # NaN losses: no public validation examples


def test_a_trained_prompt_answers_queries_as_it_was_evaluated(tiny_lm, sst2_spec):
    from dpcore.release.predict import answer

    prompt = _prompt(tiny_lm, "soft-prompt", seed=4)
    past = prompt.cache_layers(tiny_lm)
    answers = answer(tiny_lm, sst2_spec, [], TEXTS, calibrate=False, past=past)
    scores = icl.label_logprobs(tiny_lm, sst2_spec, [], TEXTS, past=past)
    assert [a["prediction"] for a in answers] == [sst2_spec.label_names[i] for i in scores.argmax(axis=1)]
    assert all(a["calibrated"] is False for a in answers)
