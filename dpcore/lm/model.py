"""The language model behind generation, ICL scoring and the audit.

`LanguageModel` wraps a transformers causal LM and its tokenizer and offers the one
primitive Algorithm 1 needs: next-token distributions for a batch of token-id
prompts, left-padded, computing logits for the last position only (no
full-vocabulary logits over the whole prompt). fp32 on CPU, bf16 on CUDA.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpcore.lm.models import quiet_loading, resolve_model, tiny_tokenizer_folder

# Llama shapes for random-weight speed benchmarks: the embedded model's own, and a 1B one
# (the Llama 3.2 1B body: 16 layers of width 2048, grouped-query attention 32/8).
RANDOM_SHAPES: dict[str, dict] = {
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
                     "rope_theta": 100000.0, "rms_norm_eps": 1e-5},
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
                 "rope_theta": 500000.0, "rms_norm_eps": 1e-5},
}


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
            "float16": torch.float16, "fp16": torch.float16}[dtype]


@dataclass
class ForwardStats:
    """Counters for throughput reporting (non-padding tokens processed, wall seconds)."""

    forward_calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def record(self, mask: torch.Tensor, began: float) -> None:
        """Count one forward call over `mask` (1 = real token) that started at perf_counter `began`."""
        self.forward_calls += 1
        self.tokens += int(mask.sum())
        self.padded_tokens += int(mask.numel())
        self.seconds += time.perf_counter() - began


class LanguageModel:
    """A causal LM with batched last-position next-token distributions."""

    def __init__(self, model, tokenizer, name: str, device: torch.device, dtype: torch.dtype):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = device
        self.dtype = dtype
        self.stats = ForwardStats()
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_id = int(pad)
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        for token in ("<|im_end|>", "<|endoftext|>", "</s>"):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id < self.vocab_size:
                eos.add(token_id)
        self.eos_token_ids: frozenset[int] = frozenset(int(t) for t in eos if t is not None)

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, name: str, device: str = "auto", dtype: str = "auto") -> LanguageModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        resolved = resolve_model(name)
        torch_device = pick_device(device)
        torch_dtype = pick_dtype(dtype, torch_device)
        with quiet_loading():  # no "Loading weights" bar in the command's progress display or logs
            tokenizer = AutoTokenizer.from_pretrained(resolved.path)
            model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch_dtype).to(torch_device)
        return cls(model, tokenizer, name, torch_device, torch_dtype)

    @classmethod
    def tiny_random(cls, seed: int = 0, hidden_size: int = 64, layers: int = 2, device: str = "cpu") -> LanguageModel:
        """A randomly initialised tiny Llama on the embedded model's tokenizer cut to its first words
        (`dpcore.lm.models.tiny_tokenizer_folder`): unit tests and smoke runs."""
        shape = {"hidden_size": hidden_size, "intermediate_size": hidden_size * 2, "num_hidden_layers": layers,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048}
        return cls._random(shape, f"tiny-random-llama-{hidden_size}x{layers}", seed, str(tiny_tokenizer_folder()),
                           device, "float32")

    @classmethod
    def random(cls, shape: str, seed: int = 0, device: str = "auto", dtype: str = "auto") -> LanguageModel:
        """A randomly initialised Llama of a named shape (`RANDOM_SHAPES`) with the embedded model's
        tokenizer: speed benchmarks at real sizes (1B on a GPU) without downloading weights."""
        if shape not in RANDOM_SHAPES:
            raise ValueError(f"model: unknown random shape {shape!r}; choose from {sorted(RANDOM_SHAPES)}")
        return cls._random(RANDOM_SHAPES[shape], f"random-{shape}", seed, resolve_model("smollm2-135m").path, device,
                           dtype)

    @classmethod
    def _random(cls, shape: dict, name: str, seed: int, tokenizer_path: str, device: str, dtype: str) -> LanguageModel:
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        config = LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **shape)
        torch_device = pick_device(device)
        torch_dtype = pick_dtype(dtype, torch_device)
        torch.manual_seed(seed)  # model init only; dpcore noise never uses the global generator
        model = LlamaForCausalLM(config).to(device=torch_device, dtype=torch_dtype)
        return cls(model, tokenizer, name, torch_device, torch_dtype)

    # ------------------------------------------------------------------ tokens

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of many texts at once: through the Rust tokenizer directly when there is one
        (the same ids, without transformers' per-call Python work, and releasing the GIL)."""
        if not texts:
            return []
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return [encoding.ids for encoding in backend.encode_batch(list(texts), add_special_tokens=False)]
        return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def left_pad(self, batch: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input_ids, attention_mask and position_ids for left padding (positions start at 0 per row)."""
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            if ids:
                input_ids[row, width - len(ids):] = torch.as_tensor(ids, dtype=torch.long)
                mask[row, width - len(ids):] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return input_ids.to(self.device), mask.to(self.device), positions.to(self.device)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def next_token_logits(self, batch: Sequence[Sequence[int]], max_batch_tokens: int = 32768) -> torch.Tensor:
        """Last-position logits [B, V] (float32, on CPU) for a batch of token-id prompts.

        Prompts are sorted by length and cut into micro-batches of at most
        `max_batch_tokens` padded tokens, so padding stays small and memory bounded.
        """
        if not batch:
            return torch.empty((0, self.vocab_size))
        if any(len(ids) == 0 for ids in batch):
            raise ValueError("next_token_logits: an empty prompt has no next-token distribution")
        order = sorted(range(len(batch)), key=lambda i: len(batch[i]))
        out = torch.empty((len(batch), self.vocab_size), dtype=torch.float32)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(batch[order[end]]) <= max_batch_tokens:
                end += 1
            chunk = [batch[i] for i in order[start:end]]
            began = time.perf_counter()
            input_ids, mask, positions = self.left_pad(chunk)
            logits = self.model(
                input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=1, use_cache=False
            ).logits[:, -1, :]
            out[torch.as_tensor(order[start:end])] = logits.float().cpu()
            self.stats.record(mask, began)
            start = end
        return out

    def next_token_probs(self, batch: Sequence[Sequence[int]], max_batch_tokens: int = 32768) -> torch.Tensor:
        """Next-token probability vectors [B, V] (float32): LM(. | prompt) of Algorithm 1 line 6/8."""
        return torch.softmax(self.next_token_logits(batch, max_batch_tokens), dim=-1)

    def num_parameters(self, include_embeddings: bool = False) -> int:
        total = sum(p.numel() for p in self.model.parameters())
        if not include_embeddings:
            total -= self.model.get_input_embeddings().weight.numel()
        return int(total)
