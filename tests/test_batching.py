"""Batched last-position forward passes (dpcore.lm.batching): equal to one prompt at a time, packed or padded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpcore.lm.batching import PACKED_ATTENTION, BatchedForward, plan_micro_batches

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread (conftest)


def test_micro_batch_plan_covers_every_prompt_once_and_limits_padding():
    lengths = [5, 300, 7, 290, 6, 310, 8]
    plan = plan_micro_batches(lengths, max_batch_tokens=10_000, overhead_tokens=10)
    assert sorted(np.concatenate(plan).tolist()) == list(range(7))
    padded = sum(len(rows) * max(lengths[i] for i in rows) for rows in plan)
    assert padded < 1.1 * sum(lengths)
    assert all(len(rows) * max(lengths[i] for i in rows) <= 600 for rows in plan_micro_batches(lengths, 600, 0))


@pytest.mark.parametrize("packed", [False, True])
def test_batch_equals_one_prompt_at_a_time(tiny_lm, agnews_spec, made_up_records, packed):
    prompts = [tiny_lm.encode(agnews_spec.generation.build(label, made_up_records[label][:k]))
               for label in made_up_records for k in (0, 1, 3)]
    prompts.append(prompts[-1] + tiny_lm.encode(" and more generated text"))
    single = torch.cat([tiny_lm.next_token_logits([p]) for p in prompts])
    for prefix_cache in (True, False):
        forward = BatchedForward(tiny_lm, max_batch_tokens=256, prefix_cache=prefix_cache, packed=packed)
        batched = forward(prompts)
        assert torch.allclose(torch.softmax(batched, -1), torch.softmax(single, -1), atol=1e-5)
        assert forward.stats.micro_batches > 1
        assert (forward.stats.prefix_tokens_reused > 0) == prefix_cache  # the instruction line, once
        if packed:
            assert forward.stats.padded_tokens == forward.stats.tokens  # no padding at all

def _reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                      enable_gqa=False):
    """What flash-attention varlen computes (bottom-right causal per sequence), in plain sdpa on CPU."""
    outputs = []
    for i in range(len(cu_seq_q) - 1):
        q = query[cu_seq_q[i]:cu_seq_q[i + 1]].transpose(0, 1)
        k = key[cu_seq_k[i]:cu_seq_k[i + 1]].transpose(0, 1)
        v = value[cu_seq_k[i]:cu_seq_k[i + 1]].transpose(0, 1)
        assert q.shape[1] <= max_q and k.shape[1] <= max_k and window_size == (-1, 0)
        mask = torch.ones((q.shape[1], k.shape[1]), dtype=torch.bool).tril(diagonal=k.shape[1] - q.shape[1])
        outputs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                      enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(outputs)


@pytest.mark.parametrize("native_gqa", [True, False])
def test_varlen_layout_equals_one_prompt_at_a_time(tiny_lm, agnews_spec, made_up_records, monkeypatch, native_gqa):
    """The CUDA path's packing (cumulative offsets, [prefix, prompt] key gather, grouped-query heads),
    checked on CPU with a reference of the flash-attention varlen kernel; the kernel itself is
    checked on a GPU by benchmarks/check_gpu_packing.py."""
    from dpcore.lm import batching

    monkeypatch.setattr(batching, "_VARLEN", (_reference_varlen, {"window_size": (-1, 0)}, native_gqa))
    prompts = [tiny_lm.encode(agnews_spec.generation.build(label, made_up_records[label][:k])) for label in made_up_records for k in (0, 2)]
    single = torch.cat([tiny_lm.next_token_logits([p]) for p in prompts])
    for prefix_cache in (True, False):
        forward = BatchedForward(tiny_lm, max_batch_tokens=256, prefix_cache=prefix_cache, packed=True, varlen=True)
        batched = forward(prompts)
        assert torch.allclose(torch.softmax(batched, -1), torch.softmax(single, -1), atol=1e-5)
        assert forward.stats.padded_tokens == forward.stats.tokens
        assert (forward.stats.prefix_tokens_reused > 0) == prefix_cache


def test_packed_attention_serves_other_callers_unchanged(tiny_lm, agnews_spec, made_up_records):
    """Once the packed attention is the model's implementation, ordinary padded calls give what they gave before."""
    prompts = [tiny_lm.encode(agnews_spec.generation.build("World", made_up_records["World"][:k])) for k in (0, 2)]
    expected = tiny_lm.next_token_logits(prompts)
    BatchedForward(tiny_lm, packed=True)(prompts)
    assert tiny_lm.model.config._attn_implementation == PACKED_ATTENTION  # switched for good, not per call
    assert torch.allclose(tiny_lm.next_token_logits(prompts), expected, atol=1e-5)


def test_packed_and_plain_calls_from_threads_do_not_interfere(tiny_lm, agnews_spec, made_up_records):
    """Generation tasks of several labels share one model from threads (the pipeline's task runner);
    packed and plain calls interleaving must each get exactly their single-threaded result."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [tiny_lm.encode(agnews_spec.generation.build(label, made_up_records[label][:k])) for label in made_up_records for k in (1, 3)]
    expected = torch.cat([tiny_lm.next_token_logits([p]) for p in prompts])

    def packed_call(_):
        return BatchedForward(tiny_lm, max_batch_tokens=128, packed=True)(prompts)

    def plain_call(_):
        return tiny_lm.next_token_logits(prompts)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: (packed_call if i % 2 else plain_call)(i), range(12)))
    for logits in results:
        assert torch.allclose(torch.softmax(logits, -1), torch.softmax(expected, -1), atol=1e-5)
