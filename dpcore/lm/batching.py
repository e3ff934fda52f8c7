"""Batched last-position forward passes for many prompts at once (the engine of Algorithm 1 line 6/8).

One call takes every active prompt of a token step (all groups of all labels and shots, plus
their public prompts) and returns their next-token logits, computing only what is needed.
Prompts are first split into separate passes by the caller's pass keys (`passes`): prompts of
different passes never share a model call, so the public prompts' logits, which choose the RVP
top-K set, are computed from public prompts alone, and one label's logits never depend on
another label's records, not even through floating-point rounding (kernel choice, reduction
order and padding width can depend on a batch's shape). Within a pass:

- Last position only: the language-model head runs on one position per prompt
  (`logits_to_keep=1`), never on the whole prompt.
- No padding ("packed" layout, Llama-family models): the prompts of a micro-batch are
  concatenated into ONE row, positions restart at every prompt, and attention sees each
  prompt's own tokens (causal) plus the cached prefix only, through a registered attention
  function, so every matrix product sees thousands of rows and no padding token is ever
  computed. On CUDA in fp16/bf16 the attention is one variable-length flash-attention call
  for the whole micro-batch (`torch.nn.attention.varlen`); on CPU (or fp32 CUDA) it runs
  prompt by prompt. Other architectures are left-padded: sorted by length and cut into
  contiguous micro-batches by an exact dynamic programme that minimises padded tokens plus a
  per-call overhead (in token equivalents), under a cap on padded tokens per micro-batch.
- Shared prefix computed once: the longest common token prefix of all prompts
  (`dpcore.lm.prefix_cache.common_prefix_length`; with the task prompts of Tang et al., the
  instruction line every group prompt starts with) is run through the model once, its key/value cache kept, and every micro-batch continues from it
  (layout: [cached prefix][left padding][rest of the prompt], positions continuing after the
  prefix). Exact: the prefix's keys and values do not depend on what follows (causal model).

The results equal one-prompt-at-a-time forward passes up to float rounding (tests: 1e-5).
Only token ids pass through here; nothing is logged.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dpcore.lm.model import ForwardStats
from dpcore.lm.prefix_cache import common_prefix_length

PACKED_ATTENTION = "dpicl_packed_sdpa"
_PACKED_KWARG = "dpicl_packed"
_SWITCH_LOCK = threading.Lock()
PACKED_MODEL_TYPES = frozenset({"llama"})  # verified by tests/test_generation.py (tiny and embedded Llama)


@dataclass
class BatchStats(ForwardStats):
    """The model's counters plus the batching's own: `tokens` are non-padding tokens run through the
    model (cached prefixes excluded)."""

    micro_batches: int = 0
    prompts: int = 0
    prefix_tokens_reused: int = 0

    def as_dict(self) -> dict:
        return {
            "forward_calls": self.forward_calls,
            "micro_batches": self.micro_batches,
            "prompts": self.prompts,
            "forward_tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "prefix_tokens_reused": self.prefix_tokens_reused,
            "forward_seconds": self.seconds,
            "forward_tokens_per_s": self.tokens_per_s,
        }


def plan_micro_batches(lengths: Sequence[int], max_batch_tokens: int, overhead_tokens: int) -> list[np.ndarray]:
    """Split prompts into micro-batches minimising sum(rows * longest) + overhead per batch.

    Prompts are sorted by length; an optimal split into contiguous runs of the sorted order is
    found by dynamic programming (a run costs rows * its longest length + `overhead_tokens`,
    and holds at most `max_batch_tokens` padded tokens unless one prompt alone is longer).
    Returns arrays of original indices, one per micro-batch.
    """
    n = len(lengths)
    if n == 0:
        return []
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    sorted_len = np.asarray(lengths, dtype=np.int64)[order]
    best = np.zeros(n + 1, dtype=np.float64)
    cut = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        longest = int(sorted_len[end - 1])
        max_rows = max(1, max_batch_tokens // max(longest, 1))
        first = max(0, end - max_rows)
        starts = np.arange(first, end)
        costs = best[first:end] + (end - starts) * longest + overhead_tokens
        pick = int(np.argmin(costs))
        best[end] = costs[pick]
        cut[end] = starts[pick]
    runs = []
    end = n
    while end > 0:
        start = int(cut[end])
        runs.append(order[start:end])
        end = start
    return runs[::-1]


def _varlen_function():
    """torch's variable-length flash attention and the keyword that makes it causal, or None.

    The API moved between torch releases (`is_causal=True` earlier, `window_size=(-1, 0)` later);
    both align the causal mask bottom-right, so a prompt's queries see the whole cached prefix.
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None

    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in params


_UNRESOLVED = object()
# looked up on first use on CUDA: its import loads torch._dynamo (about a second of CPU in every process otherwise)
_VARLEN = _UNRESOLVED


def _varlen():
    global _VARLEN
    if _VARLEN is _UNRESOLVED:
        _VARLEN = _varlen_function()
    return _VARLEN


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Flash-attention varlen serves CUDA in half precision only."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and _varlen() is not None


@dataclass(frozen=True)
class PackedLayout:
    """How prompts are packed into one row: per-prompt [start, end) bounds in the packed row,
    the shared cached prefix length, and (CPU path) one boolean mask per prompt length; (varlen
    path) cumulative query/key offsets and the gather index laying out [prefix, prompt] keys."""

    bounds: list[tuple[int, int]]
    prefix: int
    masks: list[torch.Tensor | None] | None = None
    cu_seq_q: torch.Tensor | None = None
    cu_seq_k: torch.Tensor | None = None
    key_index: torch.Tensor | None = None
    max_q: int = 0
    max_k: int = 0

    @property
    def varlen(self) -> bool:
        return self.cu_seq_q is not None


def _per_prompt_layout(lengths: Sequence[int], prefix: int, device: torch.device) -> PackedLayout:
    """CPU path: one boolean mask per distinct prompt length (the prefix visible to every position,
    the prompt itself causally); no mask at all without a prefix (plain causal attention)."""
    masks_by_length: dict[int, torch.Tensor | None] = {}
    for n in set(lengths):
        if prefix:
            causal = torch.ones((n, n), dtype=torch.bool, device=device).tril()
            masks_by_length[n] = torch.cat([torch.ones((n, prefix), dtype=torch.bool, device=device), causal],
                                           dim=1)
        else:
            masks_by_length[n] = None
    ends = np.cumsum(lengths)
    return PackedLayout(bounds=[(int(e - n), int(e)) for e, n in zip(ends, lengths, strict=True)], prefix=prefix,
                        masks=[masks_by_length[n] for n in lengths])


def _varlen_layout(lengths: Sequence[int], prefix: int, device: torch.device) -> PackedLayout:
    lengths_np = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths_np)
    starts = ends - lengths_np
    key_index = None
    if prefix:  # keys of prompt i: the cached prefix (row positions 0..prefix-1), then its own tokens
        pieces = []
        for start, end in zip(starts, ends, strict=True):
            pieces += [np.arange(prefix), np.arange(start, end) + prefix]
        key_index = torch.as_tensor(np.concatenate(pieces), dtype=torch.long, device=device)
    return PackedLayout(
        bounds=[(int(s), int(e)) for s, e in zip(starts, ends, strict=True)], prefix=prefix,
        cu_seq_q=torch.as_tensor(np.concatenate([[0], ends]), dtype=torch.int32, device=device),
        cu_seq_k=torch.as_tensor(np.concatenate([[0], np.cumsum(lengths_np + prefix)]), dtype=torch.int32,
                                 device=device),
        key_index=key_index, max_q=int(lengths_np.max()), max_k=int(lengths_np.max()) + prefix)


def _packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention over prompts packed into one row: each prompt attends to the cached prefix and,
    causally, to itself only (exactly what it would see alone).

    query [1, heads, T, d]; key/value [1, kv_heads, prefix + T, d]. A call without the packing
    description (another caller of the same model while ours runs) is served by the model's
    own attention implementation, with its mask.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    layout: PackedLayout | None = kwargs.pop(_PACKED_KWARG, None)
    if layout is None:  # packing is only switched on over sdpa (supports_packing), so sdpa is the original
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout=dropout,
                                               scaling=scaling, **kwargs)
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    if layout.varlen:  # one flash-attention call for the whole micro-batch
        varlen_attn, causal, has_gqa = _varlen()
        q = query[0].transpose(0, 1)  # [T, heads, d]
        k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [prefix + T, kv_heads, d]
        if layout.key_index is not None:  # [sum(prefix + L_i), kv_heads, d]
            k, v = k.index_select(0, layout.key_index), v.index_select(0, layout.key_index)
        extra = {}
        if gqa and has_gqa:
            extra["enable_gqa"] = True
        elif gqa:
            groups = module.num_key_value_groups
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = varlen_attn(q, k, v, layout.cu_seq_q, layout.cu_seq_k, layout.max_q, layout.max_k,
                          scale=scaling, **causal, **extra)
        return out.unsqueeze(0), None  # [1, T, heads, d]
    prefix = layout.prefix
    key_prefix, value_prefix = key[:, :, :prefix], value[:, :, :prefix]
    outputs = []
    for (start, end), mask in zip(layout.bounds, layout.masks, strict=True):
        k = key[:, :, prefix + start:prefix + end]
        v = value[:, :, prefix + start:prefix + end]
        if prefix:
            k, v = torch.cat([key_prefix, k], dim=2), torch.cat([value_prefix, v], dim=2)
        outputs.append(F.scaled_dot_product_attention(query[:, :, start:end], k, v, attn_mask=mask,
                                                      is_causal=mask is None, scale=scaling, enable_gqa=gqa))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _register_packed_attention() -> None:
    """Register the packed attention, and sdpa's mask builder under the same name, so that any other
    call into the model while our name is set still gets its usual mask and attention."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
    if PACKED_ATTENTION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)


def supports_packing(model) -> bool:
    """Packed prompts need rotary positions from position_ids, full causal attention (no sliding
    window) and a model on sdpa attention (the packed function serves every other call as sdpa)."""
    config = getattr(model, "config", None)
    return (getattr(config, "model_type", None) in PACKED_MODEL_TYPES
            and getattr(config, "sliding_window", None) is None
            and getattr(config, "_attn_implementation", None) in (None, "sdpa", PACKED_ATTENTION))


def use_packed_attention(model) -> None:
    """Switch the model to the packed attention, once and for good.

    Switching per call and back is not safe: generation tasks for several labels share one
    model from threads, and a restore racing a switch leaves the model on the wrong function
    mid-forward. The packed function dispatches per call instead (packed when the call carries
    the packing description, plain sdpa with the model's own mask otherwise), so the switch is
    invisible to every other caller.
    """
    _register_packed_attention()
    config = model.config
    with _SWITCH_LOCK:
        if config._attn_implementation != PACKED_ATTENTION:
            config._attn_implementation = PACKED_ATTENTION


class BatchedForward:
    """Callable: prompts (token-id lists) [, pass keys] -> last-position logits [B, V] float32 on CPU.

    `lm` is a `dpcore.lm.model.LanguageModel`. Defaults suit the device: on CPU small micro-batches
    (cache-friendly, little padding), on CUDA large ones (kernel-launch overhead dominates).
    `prefix_cache=False` disables the shared-prefix reuse (for comparisons); `packed` and `varlen`
    force the layout and the attention path (tests).
    """

    def __init__(self, lm, max_batch_tokens: int | None = None, overhead_tokens: int | None = None,
                 prefix_cache: bool = True, min_prefix: int = 4, packed: bool | None = None,
                 varlen: bool | None = None):
        self.lm = lm
        self.accepts_passes = True  # the generation engine passes its pass keys (see __call__)
        cuda = lm.device.type == "cuda"
        # Packed (no padding) for Llama-family models on CPU, and on CUDA where varlen flash attention
        # serves the dtype; left padding elsewhere.
        self.varlen = varlen_available(lm.device, lm.dtype) if varlen is None else bool(varlen)
        if packed is None:
            packed = supports_packing(lm.model) and (not cuda or self.varlen)
        self.packed = bool(packed)
        if self.packed:
            use_packed_attention(lm.model)
        # CPU defaults measured on the embedded model (2 cores): packed micro-batches of 4096 tokens;
        # padded ones of 2048 (activations stay in cache) with a 32-token overhead (a few % padding).
        self.max_batch_tokens = int(max_batch_tokens or (65536 if cuda else 4096 if self.packed else 2048))
        self.overhead_tokens = int(overhead_tokens if overhead_tokens is not None else (8192 if cuda else 32))
        self.prefix_cache = prefix_cache
        self.min_prefix = min_prefix
        self.stats = BatchStats()
        self._prefixes: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        config = getattr(lm.model, "config", None)
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 0)

    # ------------------------------------------------------------------ prefix cache

    def _prefix_kv(self, prefix: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cached = self._prefixes.get(prefix)
        if cached is not None:
            self._prefixes.move_to_end(prefix)
            return cached
        ids = torch.as_tensor([prefix], dtype=torch.long, device=self.lm.device)
        with torch.inference_mode():
            out = self.lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.stats.tokens += len(prefix)
        self.stats.padded_tokens += len(prefix)
        self._prefixes[prefix] = kv
        while len(self._prefixes) > 8:
            self._prefixes.popitem(last=False)
        return kv

    def _plan(self, lengths: list[int]) -> list[np.ndarray]:
        if not self.packed:
            return plan_micro_batches(lengths, self.max_batch_tokens, self.overhead_tokens)
        runs, current, size = [], [], 0  # packed: no padding, fill micro-batches up to the token cap
        for index, length in enumerate(lengths):
            if current and size + length > self.max_batch_tokens:
                runs.append(np.asarray(current))
                current, size = [], 0
            current.append(index)
            size += length
        runs.append(np.asarray(current))
        return runs

    def _run_padded(self, chunk, kv, prefix_len):
        lm = self.lm
        input_ids, mask, positions = lm.left_pad(chunk)
        if kv is not None:
            ones = torch.ones((len(chunk), prefix_len), dtype=mask.dtype, device=mask.device)
            mask = torch.cat([ones, mask], dim=1)
            positions = positions + prefix_len
            kwargs = {"past_key_values": self._cache_for(kv, len(chunk)), "use_cache": True}
        else:
            kwargs = {"use_cache": False}
        logits = lm.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=1,
                          **kwargs).logits[:, -1, :]
        return logits, int(input_ids.numel())

    def _run_packed(self, chunk, kv, prefix_len):
        lm = self.lm
        device = lm.device
        lengths = [len(p) for p in chunk]
        layout = (_varlen_layout if self.varlen else _per_prompt_layout)(lengths, prefix_len, device)
        last = torch.as_tensor([end - 1 for _, end in layout.bounds], device=device)
        ids = torch.as_tensor(np.concatenate(chunk), dtype=torch.long, device=device).unsqueeze(0)
        positions = torch.as_tensor(np.concatenate([np.arange(n) for n in lengths]) + prefix_len,
                                    dtype=torch.long, device=device).unsqueeze(0)
        kwargs = {"past_key_values": self._cache_for(kv, 1), "use_cache": True} if kv is not None \
            else {"use_cache": False}
        # A 4D placeholder mask: the model passes it through untouched (no [T, T] mask is built).
        placeholder = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)
        logits = lm.model(input_ids=ids, attention_mask=placeholder, position_ids=positions,
                          logits_to_keep=last, **{_PACKED_KWARG: layout}, **kwargs).logits[0]
        return logits, int(ids.numel())

    def _cache_for(self, kv, rows: int):
        from transformers import DynamicCache

        data = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in kv]
        return DynamicCache(ddp_cache_data=data, config=self.lm.model.config)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def __call__(self, prompts: Sequence[Sequence[int]], passes: Sequence[Hashable] | None = None) -> torch.Tensor:
        """Last-position logits [len(prompts), V] float32 on CPU, in the order of `prompts`.

        `passes` (one key per prompt): prompts with different keys never share a model call,
        a micro-batch, a padded width or a shared cached prefix. Each key's prompts are run as
        if they were the only prompts of the call, so their logits are a function of those
        prompts alone, bit for bit, whatever else the call holds (the generation engine keys
        the public prompts apart from every label's private group prompts). The prefix cache
        is keyed by token ids and computed from the prefix alone, so sharing it across keys
        shares no other prompt's tokens. None: one key for all.
        """
        lm = self.lm
        if not prompts:
            return torch.empty((0, lm.vocab_size))
        if any(len(p) == 0 for p in prompts):
            raise ValueError("an empty prompt has no next-token distribution")
        if self.max_positions and max(len(p) for p in prompts) > self.max_positions:
            # No length in the message: prompts hold private records (the engine checks the bound
            # from public settings before any privacy is spent, so this is a programming error).
            raise ValueError(f"a prompt exceeds the model's context of {self.max_positions} positions")
        if passes is not None and len(passes) != len(prompts):
            raise ValueError("passes: one key per prompt")
        began = time.perf_counter()
        self.stats.forward_calls += 1
        self.stats.prompts += len(prompts)
        # Logits are gathered on the device and cross to the host once, into pinned memory on CUDA
        # (a pageable copy of [B, V] float32 costs several ms per step).
        out = torch.empty((len(prompts), lm.vocab_size), dtype=torch.float32, device=lm.device)
        for rows in _pass_rows(passes, len(prompts)):
            self._one_pass([prompts[i] for i in rows], rows, out)
        if lm.device.type == "cuda":
            host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            out = host.copy_(out)
        elif lm.device.type != "cpu":
            out = out.cpu()
        self.stats.seconds += time.perf_counter() - began
        return out

    def _one_pass(self, prompts: Sequence[Sequence[int]], rows: np.ndarray, out: torch.Tensor) -> None:
        """Forward `prompts` (their own shared prefix, their own micro-batches) into out[rows]."""
        prefix_len = 0
        if self.prefix_cache and len(prompts) > 1:
            prefix_len = common_prefix_length(prompts, reserve=1)
            if prefix_len < self.min_prefix:
                prefix_len = 0
        kv = self._prefix_kv(tuple(int(t) for t in prompts[0][:prefix_len])) if prefix_len else None
        rest = [p[prefix_len:] for p in prompts]
        run = self._run_packed if self.packed else self._run_padded
        for chunk_rows in self._plan([len(r) for r in rest]):
            logits, computed = run([rest[i] for i in chunk_rows], kv, prefix_len)
            out[torch.as_tensor(rows[chunk_rows], device=self.lm.device)] = logits.float()
            self.stats.micro_batches += 1
            self.stats.tokens += sum(len(rest[i]) for i in chunk_rows)
            self.stats.padded_tokens += computed
            self.stats.prefix_tokens_reused += prefix_len * len(chunk_rows)


def _pass_rows(passes: Sequence[Hashable] | None, count: int) -> list[np.ndarray]:
    """Row indices of each pass key, keys in order of first appearance (one array when no keys)."""
    if passes is None:
        return [np.arange(count)]
    groups: dict[Hashable, list[int]] = {}
    for index, key in enumerate(passes):
        groups.setdefault(key, []).append(index)
    return [np.asarray(rows, dtype=np.int64) for rows in groups.values()]
