"""The shared prompt prefix run once, its key/value cache reused by every continuation.

Prompts that share a token prefix (the instruction and the demonstrations of an ICL prompt,
Tang et al. Appendix D) need that prefix's keys and values only once: they do not depend
on what follows (causal model). Two users of the idea:

- `PrefixCache` (here): the scoring path of `dpcore.lm.icl` and `dpcore.audit.attacks`. The
  prefix's cache is expanded over a batch of right-padded suffixes with explicit position
  ids; the cache after each row can be selected again (repeats allowed) to continue
  several label continuations from one query.
- `dpcore.lm.batching.BatchedForward`: the generation engine's last-position forward, which
  keeps the prefix's cache in an LRU and packs the rest (see there).

Both cut the prefix with `common_prefix_length`. Only token ids pass through here;
forward calls are counted in the model's `ForwardStats`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


def common_prefix_length(prompts: Sequence[Sequence[int]], reserve: int = 0) -> int:
    """Length of the longest token prefix shared by every prompt, leaving each prompt at least
    `reserve` tokens of its own (a forward pass needs one new token to read the next-token
    distribution from, so the callers that continue from the cache pass 1)."""
    if not prompts:
        return 0
    first = prompts[0]
    limit = min(len(p) for p in prompts)
    arrays = [np.asarray(p[:limit], dtype=np.int64) for p in prompts]
    stacked = np.stack(arrays) if limit else np.zeros((len(prompts), 0), dtype=np.int64)
    same = np.all(stacked == np.asarray(first[:limit], dtype=np.int64), axis=0)
    mismatch = np.flatnonzero(~same)
    shared = int(mismatch[0]) if mismatch.size else limit
    return max(0, min(shared, limit - reserve))


def right_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
            mask[i, : len(row)] = 1
    return ids, mask


@dataclass
class PrefixBatch:
    """A batch of rows sharing the prefix cache: cache, 2-D key mask and each row's next position."""

    cache: object | None
    key_mask: torch.Tensor  # [B, cache_len] 1 where the cached key is real
    next_position: torch.Tensor  # [B] position id of the row's next token


class PrefixCache:
    """The shared prompt prefix run once; its KV cache is expanded over batches of suffixes.

    Suffixes are right-padded; position ids continue each row from its own length and the
    2-D attention mask hides pad slots, so rows of different lengths share one forward.
    """

    def __init__(self, lm, prefix_ids: Sequence[int], past: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None):
        """`past`: per-layer (keys, values) of batch 1 that precede the prefix tokens (a trained soft
        prompt's or prefix's cache, `dpcore.dpsgd.soft_prompt`); positions continue after it."""
        from transformers import DynamicCache

        self.lm = lm
        self.prefix_ids = list(prefix_ids)
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = [(k, v) for k, v in (past or [])]
        self.offset = int(self.layers[0][0].shape[-2]) if self.layers else 0  # cache positions before the prefix
        if self.prefix_ids:
            with torch.inference_mode():
                began = time.perf_counter()
                ids = torch.as_tensor([self.prefix_ids], dtype=torch.long, device=lm.device)
                mask = torch.ones((1, self.offset + ids.shape[1]), dtype=torch.long, device=lm.device)
                cache = DynamicCache(ddp_cache_data=self.layers, config=lm.model.config) if self.layers else None
                positions = self.offset + torch.arange(ids.shape[1], device=lm.device)[None, :]
                out = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                               use_cache=True, logits_to_keep=1)
                lm.stats.record(mask[:, self.offset:], began)
            self.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]

    def __len__(self) -> int:
        return len(self.prefix_ids)

    def _expanded(self, rows: int):
        if not self.layers:
            return None
        from transformers import DynamicCache

        data = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.layers]
        return DynamicCache(ddp_cache_data=data, config=self.lm.model.config)

    def start(self, rows: int) -> PrefixBatch:
        device = self.lm.device
        cached = self.offset + len(self.prefix_ids)
        return PrefixBatch(
            cache=self._expanded(rows),
            key_mask=torch.ones((rows, cached), dtype=torch.long, device=device),
            next_position=torch.full((rows,), cached, dtype=torch.long, device=device),
        )

    @torch.inference_mode()
    def extend(self, batch: PrefixBatch, rows: Sequence[Sequence[int]],
               keep: str | torch.Tensor = "last") -> tuple[PrefixBatch, torch.Tensor]:
        """Feed each row's tokens after its cached context.

        keep="last": log-softmax at each row's last real token, [B, V].
        keep="all":  log-softmax at every position, [B, W, V].
        keep=a boolean [B, W] tensor: log-softmax at its True positions only, [N, V] in row-major order
        (the vocabulary head and the softmax run on those N positions, not on all B x W).
        The returned batch holds the grown cache (pad slots masked out).
        """
        lm = self.lm
        ids, mask = right_pad(rows, lm.pad_id)
        ids, mask = ids.to(lm.device), mask.to(lm.device)
        width = ids.shape[1]
        positions = batch.next_position[:, None] + torch.arange(width, device=lm.device)[None, :]
        attention = torch.cat([batch.key_mask, mask], dim=1)
        lengths = mask.sum(dim=1)
        last = (lengths - 1).clamp(min=0)
        if isinstance(keep, torch.Tensor):
            keep_arg = keep.to(lm.device)
        else:  # per-row position: logits for one token per row
            keep_arg = last[:, None] if keep == "last" else 0
        began = time.perf_counter()
        out = lm.model(input_ids=ids, attention_mask=attention, position_ids=positions,
                       past_key_values=batch.cache, use_cache=True, logits_to_keep=keep_arg)
        lm.stats.record(mask, began)
        logits = out.logits.float()
        if isinstance(keep, str) and keep == "last":
            logits = logits[:, 0, :]
        grown = PrefixBatch(cache=out.past_key_values, key_mask=attention, next_position=batch.next_position + lengths)
        return grown, torch.log_softmax(logits, dim=-1)

    @staticmethod
    def select(batch: PrefixBatch, index: torch.Tensor, config) -> PrefixBatch:
        """Rows `index` of a batch (repeats allowed): the cache after each item's query, per label."""
        from transformers import DynamicCache

        data = [(layer.keys.index_select(0, index), layer.values.index_select(0, index)) for layer in batch.cache.layers]
        return PrefixBatch(cache=DynamicCache(ddp_cache_data=data, config=config),
                      key_mask=batch.key_mask.index_select(0, index),
                      next_position=batch.next_position.index_select(0, index))


class StackedPrefixes(PrefixCache):
    """Many prompts' own prefixes (the teachers of a PromptPATE flock), each run once, stacked in one cache.

    Prefixes are right-padded to the longest and run through the model in blocks of `block` rows;
    pad slots are masked out of every later step, and each row continues at its own prefix's length
    (position ids), so a batch may mix rows of different prefixes: `start_rows(index)` gives the
    batch whose row r continues prefix `index[r]`. Exact: a real token never attends to a later
    pad slot (causal), so the cached keys and values equal each prefix run alone. An empty prefix
    gets one masked slot (the row then sees its own tokens only).
    """

    def __init__(self, lm, prefixes: Sequence[Sequence[int]], block: int = 16):
        self.lm = lm
        self.prefix_ids = []
        self.offset = 0
        self.lengths = torch.as_tensor([len(p) for p in prefixes], dtype=torch.long, device=lm.device)
        width = max(1, max((len(p) for p in prefixes), default=1))
        keys: list[list[torch.Tensor]] = []
        values: list[list[torch.Tensor]] = []
        with torch.inference_mode():
            for start in range(0, len(prefixes), block):
                rows = [list(p) if p else [lm.pad_id] for p in prefixes[start:start + block]]
                ids, mask = right_pad(rows, lm.pad_id)
                ids, mask = ids.to(lm.device), mask.to(lm.device)
                began = time.perf_counter()
                out = lm.model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
                lm.stats.record(mask, began)
                pad = width - ids.shape[1]
                for layer_index, layer in enumerate(out.past_key_values.layers):
                    k, v = layer.keys, layer.values
                    if pad:
                        k = torch.nn.functional.pad(k, (0, 0, 0, pad))
                        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
                    if layer_index == len(keys):
                        keys.append([])
                        values.append([])
                    keys[layer_index].append(k)
                    values[layer_index].append(v)
        self.layers = [(torch.cat(k, dim=0), torch.cat(v, dim=0)) for k, v in zip(keys, values, strict=True)]
        self.key_mask = (torch.arange(width, device=lm.device)[None, :] < self.lengths[:, None]).long()

    def __len__(self) -> int:
        return int(self.key_mask.shape[1])

    def start_rows(self, index: torch.Tensor) -> PrefixBatch:
        """A batch whose row r continues prefix index[r] (rows of different prefixes mix freely)."""
        from transformers import DynamicCache

        data = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.layers]
        return PrefixBatch(cache=DynamicCache(ddp_cache_data=data, config=self.lm.model.config),
                      key_mask=self.key_mask.index_select(0, index), next_position=self.lengths.index_select(0, index))
