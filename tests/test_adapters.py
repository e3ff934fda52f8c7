"""The DP fine-tuning baselines (`dpcore.dpsgd.adapters`: LoRA and full fine-tuning, Duan et al. Table 1) on the
tiny random Llama: what a DP reviewer asks of them beside the prompts' checks in test_dpsgd.py.

- per-example gradients (Algorithm 1 line 5) are isolated: an example's gradient does not depend on its
  batch companions, and equals a one-example backward pass;
- full fine-tuning's clipped sum (line 6, Opacus' DPOptimizer) equals the naive per-example loop;
- training is the ICL label score: the adapted model scored by `icl.label_logprobs` gives the training
  objective;
- LoRA never changes the frozen base weights, and training never changes the loaded model;
- the plan's epsilon matches dp-accounting's PLD on the reported q, sigma, T;
- bad rank or kind: one clear line naming the flag.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import prefect.main  # noqa: F401  Prefect configures logging on first import: at collection, not inside a test
import pytest
import test_dpsgd
import torch
from pipeline_support import prefect_harness  # noqa: F401  (the shared harness fixture)

from dpcore.dpsgd import adapters
from dpcore.dpsgd import soft_prompt as sp
from dpcore.dpsgd import training as dpsgd
from dpcore.errors import ConfigError
from dpcore.lm import icl
from dpcore.names import ADAPTER_KINDS

# the prompts' records and fixtures (test_dpsgd.py): the baselines train on the same examples
TEXTS = test_dpsgd.TEXTS
sst2_spec = test_dpsgd.sst2_spec
examples = test_dpsgd.examples


def _adapter(lm, kind: str, seed: int = 0, rank: int = 4) -> adapters.TrainableModel:
    adapter = adapters.init_adapter(lm, kind, torch.Generator().manual_seed(seed), rank=rank)
    if kind == "lora":  # move B off 0 so that A's gradient is not 0 too
        with torch.no_grad():
            for name, p in adapter.model.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    return adapter


def _one_example_gradient(lm, adapter, example) -> list[torch.Tensor]:
    """The reference: plain autograd on one example, no Opacus hooks involved."""
    params = adapter.parameters_()
    loss = -adapters.example_logprobs(adapter.model, lm.pad_id, [example]).sum()
    return [g.detach() for g in torch.autograd.grad(loss, params)]


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_per_example_gradients_equal_one_example_backward_passes(tiny_lm, examples, kind):
    adapter = _adapter(tiny_lm, kind)
    reference = [_one_example_gradient(tiny_lm, adapter, e) for e in examples]
    grads, losses = adapters.per_example_gradients(tiny_lm, adapter, examples)
    assert len(grads) == len(adapter.parameters_()) and losses.shape == (len(examples),)
    for b in range(len(examples)):
        for got, want in zip(grads, reference[b], strict=True):
            assert torch.allclose(got[b], want, atol=1e-5, rtol=1e-4)
    assert any(float(g[0].abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_an_examples_gradient_does_not_depend_on_its_batch_companions(tiny_lm, examples, kind):
    adapter = _adapter(tiny_lm, kind)
    together, _ = adapters.per_example_gradients(tiny_lm, adapter, examples)
    others, _ = adapters.per_example_gradients(tiny_lm, adapter, [examples[2], examples[0], examples[4]])
    alone, _ = adapters.per_example_gradients(tiny_lm, adapter, examples[2:3])
    for a, b, c in zip(together, others, alone, strict=True):
        assert torch.allclose(a[2], b[0], atol=1e-5, rtol=1e-4)
        assert torch.allclose(a[2], c[0], atol=1e-5, rtol=1e-4)


def test_full_fine_tunings_clipped_sum_equals_the_naive_per_example_loop(tiny_lm, examples):
    adapter = _adapter(tiny_lm, "full")
    params = adapter.parameters_()
    clip = 0.05
    reference = [_one_example_gradient(tiny_lm, adapter, e) for e in examples]
    want = [torch.zeros_like(p) for p in params]
    for grads in reference:  # clip each example's whole gradient (all parameters together) to C, then sum
        norm = torch.sqrt(sum(float(g.pow(2).sum()) for g in grads) * torch.ones(()))
        assert float(norm) > clip  # the clipping is exercised
        for total, g in zip(want, grads, strict=True):
            total += g * min(1.0, clip / (float(norm) + 1e-6))
    optimizer = dpsgd.dp_optimizer(adapter, 0.0, clip, 1.0, 1e-3, torch.Generator().manual_seed(0))
    chunks = [adapters.per_example_gradients(tiny_lm, adapter, examples[i:i + 2])[0] for i in (0, 2, 4)]
    dpsgd.private_step(optimizer, adapter, chunks)
    for p, total in zip(params, want, strict=True):
        assert torch.allclose(p.grad, total, atol=1e-6, rtol=1e-4)  # sigma 0, expected batch 1: the clipped sum


def test_the_adapted_model_scores_what_training_optimised(tiny_lm, examples, sst2_spec, tmp_path):
    adapter = _adapter(tiny_lm, "lora")
    path = tmp_path / "lora.safetensors"
    adapters.save_adapter(adapter, path, {"epsilon": 8.0})
    scorer, past = adapters.trained_scoring(tiny_lm, path)
    assert past is None and scorer.model is not tiny_lm.model
    labels = [sst2_spec.label_names[i % 2] for i in range(len(TEXTS))]
    scores = icl.label_logprobs(scorer, sst2_spec, [], TEXTS, sst2_spec.label_names)
    gold = np.array([scores[i, sst2_spec.label_names.index(y)] for i, y in enumerate(labels)])
    with torch.no_grad():
        trained = adapters.example_logprobs(adapter.model, tiny_lm.pad_id, examples).numpy()
    assert np.allclose(gold, trained, atol=1e-4)
    base = icl.label_logprobs(tiny_lm, sst2_spec, [], TEXTS, sst2_spec.label_names)
    assert not np.allclose(base, scores, atol=1e-4)  # the adapter changed the answer, the loaded model did not


def test_lora_trains_its_matrices_only_and_never_the_loaded_model(tiny_lm, examples):
    before = sp.weights_hash(tiny_lm.model)
    adapter = adapters.init_adapter(tiny_lm, "lora", torch.Generator().manual_seed(0), rank=4)
    names = [n for n, p in adapter.model.named_parameters() if p.requires_grad]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert all(("q_proj" in n or "v_proj" in n) for n in names)
    base = {n: p.detach().clone() for n, p in adapter.model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in adapter.model.named_parameters() if p.requires_grad}
    noise, sample, _ = dpsgd.generators(7)
    dpsgd.train(tiny_lm, adapter, examples, examples[:2], noise_multiplier=1.0, sampling_rate=0.6, steps=3, clip=0.1,
                lr=0.05, delta=1e-3, noise_generator=noise, sampling_generator=sample, seeded=True,
                physical_batch_size=2)
    for n, p in adapter.model.named_parameters():
        if n in base:
            assert torch.equal(p.detach(), base[n]), n
        else:
            assert not torch.equal(p.detach(), lora[n]), n
    assert sp.weights_hash(tiny_lm.model) == before


def test_two_trainings_from_the_same_seed_are_the_same_and_a_start_needs_no_global_randomness(tiny_lm, examples):
    def run(seed):
        torch.manual_seed(seed)  # the global generator must not matter
        adapter = adapters.init_adapter(tiny_lm, "lora", torch.Generator().manual_seed(3), rank=2)
        noise, sample, _ = dpsgd.generators(11)
        dpsgd.train(tiny_lm, adapter, examples, [], noise_multiplier=1.0, sampling_rate=0.6, steps=2, clip=0.1,
                    lr=0.05, delta=1e-3, noise_generator=noise, sampling_generator=sample, seeded=True)
        return adapter.named_trainable()

    first, second = run(0), run(1)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(("kind", "epsilon"), [("lora", 8.0), ("full", 3.0)])
def test_the_plans_epsilon_matches_dp_accountings_pld(kind, epsilon):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    config = dpsgd.DpsgdConfig(kind=kind, batch_size=64, steps=48, epochs=None, lr=1e-3)
    plan = dpsgd.dpsgd_plan(epsilon, 6000, config)
    spend = plan.spends[0]
    assert plan.parameters["kind"] == kind and spend.steps == 48 and math.isclose(spend.sampling_rate, 64 / 6000)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(spend.sampling_rate, dp_accounting.GaussianDpEvent(spend.noise_multiplier)),
        spend.steps)
    pld = PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(plan.delta)
    assert abs(pld - epsilon) / epsilon < 0.02


def test_bad_rank_and_kind_are_one_line_naming_the_flag(tiny_lm):
    with pytest.raises(ConfigError, match="dpsgd-rank") as bad:
        adapters.check_adapter(tiny_lm, "lora", rank=10_000)
    assert "\n" not in str(bad.value)
    with pytest.raises(ConfigError, match="dpsgd-rank"):
        dpsgd.DpsgdConfig(kind="lora", rank=0).check()
    with pytest.raises(ConfigError, match="dpsgd-kind"):
        dpsgd.DpsgdConfig(kind="adapter").check()
    assert adapters.check_adapter(tiny_lm, "lora", rank=4) == sum(
        4 * (m.in_features + m.out_features) for n, m in tiny_lm.model.named_modules() if n.endswith(("q_proj", "v_proj")))


def test_a_model_without_query_and_value_projections_is_refused_for_lora():
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = SimpleNamespace(model=GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)),
                           name="tiny-gpt2")
    with pytest.raises(ConfigError, match="q_proj") as refused:
        adapters.check_adapter(gpt2, "lora")
    assert "\n" not in str(refused.value)
    assert adapters.check_adapter(gpt2, "full") == sum(p.numel() for p in gpt2.model.parameters())


# --------------------------------------------------------------------------- dpicl tune --kind lora|full


def _tune_args(*extra: str, dataset_id: str) -> list[str]:
    from pipeline_support import mini_agnews

    data_path, spec_path, _, _ = mini_agnews()
    return ["tune", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--dataset-id", dataset_id, "--model", "tiny-random", "--steps", "2", "--batch-size", "16",
            "--validation-size", "10", "--test-size", "8", *extra]


def _written(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
            and not p.name.startswith(("prefect", "mlflow", "dpicl.log", "ledger.db"))
            and not {"prefect", "mlflow", "logs", "models"} & set(p.relative_to(root).parts)}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_tune_charges_the_plans_one_event_and_saves_the_trained_weights_with_their_manifest(tiny_lm, capsys, kind):
    from pipeline_support import share_tiny_model

    from dpcore.privacy.events import event_to_json
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    share_tiny_model(tiny_lm)
    capsys.readouterr()
    dataset_id = f"tune-{kind}"
    extra = ["--rank", "2"] if kind == "lora" else ["--physical-batch-size", "4"]
    assert main(_tune_args("--kind", kind, "--epsilon", "8", "--json", *extra, dataset_id=dataset_id)) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["kind"] == kind and result["rank"] == (2 if kind == "lora" else None)
    assert 0 <= result["accuracy"]["mean"] <= 1
    entries = Ledger().entries(dataset_id)
    assert len(entries) == 1 and entries[0].purpose == "dpsgd"
    planned = dpsgd.dpsgd_event(result["noise_multiplier"], result["sampling_rate"], result["steps"])
    assert event_to_json(entries[0].event) == event_to_json(planned)
    manifest = json.loads(Path(result["prompt"]).with_suffix(".json").read_text())
    assert manifest["kind"] == kind and manifest["epsilon"] == 8.0 and manifest["delta"] == result["delta"]
    assert (manifest["noise_multiplier"], manifest["sampling_rate"], manifest["steps"]) == (
        result["noise_multiplier"], result["sampling_rate"], result["steps"])
    assert manifest["model_weights_sha256"] == sp.weights_hash(tiny_lm.model)  # the loaded model never changed
    assert adapters.file_kind(result["prompt"]) == kind


@pytest.mark.parametrize(("flags", "needle"), [
    (["--kind", "lora", "--rank", "0"], "rank"),
    (["--kind", "lora", "--rank", "100000"], "rank"),
    (["--kind", "full", "--batch-size", "100000"], "batch"),
])
def test_tune_bad_input_is_one_clear_line_and_charges_nothing(tiny_lm, capsys, flags, needle):
    from pipeline_support import home, share_tiny_model

    from dpcore.home import content_key
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    share_tiny_model(tiny_lm)
    content_key()  # the home's own key, made on its first data read: not written by the refused command
    before = _written(home())
    capsys.readouterr()
    assert main(_tune_args("--epsilon", "8", *flags, dataset_id="tune-adapter-bad")) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert Ledger().entries("tune-adapter-bad") == []
    assert _written(home()) == before


def test_an_unknown_kind_is_a_usage_error_naming_the_flag(capsys):
    from flows.cli import main

    with pytest.raises(SystemExit) as stop:
        main(_tune_args("--epsilon", "8", "--kind", "adapter", dataset_id="tune-adapter-bad"))
    assert stop.value.code == 2 and "--kind" in capsys.readouterr().err
