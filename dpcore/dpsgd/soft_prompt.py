"""Trainable prompts on a frozen causal LM: soft prompts and prefixes (Duan et al. Section 4.1).

Two kinds, both a small tensor P that the LM reads; the LM's weights are never changed or copied:

- `soft-prompt` (Lester et al. 2021; Duan et al. Section 4.1, Algorithm 1 line 2: P_0 in R^{s x e}):
  s trainable input embeddings prepended to the embedded input. Initialised from the embeddings of
  s vocabulary tokens drawn at random among the first `VOCAB_INIT_TOKENS` ids (frequent BPE tokens,
  as Lester et al. draw from the 5,000 most common), at random with the embedding table's
  standard deviation, or from the embeddings of the task's ICL instruction tokens (public text: Lester
  et al.'s class-label / task-text initialisation; cycled when the prompt is longer than the
  instruction, cut when shorter). The instruction start gives few noisy DP-SGD steps a prompt that
  already points at the task, which is what the CPU preset relies on.
- `prefix` (P-tuning v2, Liu et al. 2022, the implementation Duan et al. build on): trainable keys and
  values of s positions at every layer, passed to the model as its cache (`DynamicCache`), shape
  [layers, 2, kv_heads, s, head_dim]. Initialised from the cache the model computes for s random
  vocabulary tokens, or at random with that cache's per-layer standard deviation.

The objective (Algorithm 1, the loss l(L_P, x)) is the negative log-likelihood of the label's full
verbalizer " " + verbalizer(y) after [P, the task's ICL prompt with no demonstration, the input]:
the tokens, verbalizers and prompt format are `dpcore.lm.icl`'s (`prompt_text`, `label_token_ids`),
and text positions continue after the prompt's s positions, so `icl.label_logprobs(..., past=
prompt.cache_layers(lm))` scores a trained prompt exactly as training does (tested).

Per-example gradients (Algorithm 1 line 5) come from one backward pass: the prompt is copied once
per example into a leaf tensor R of shape [B, *P.shape] (row b is what example b reads); rows of a
batch never interact in a causal LM in eval mode (attention masks keep rows apart; no batch
statistics), so d(sum_b l_b)/dR_b = d l_b/dR_b = grad_P l(L_P, x_b) exactly, not a micro-batch
approximation. Only R requires a gradient (the LM's parameters are switched to requires_grad=False
for the pass and restored), so no weight gradient is ever computed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dpcore.data.artifacts import write_bytes_atomic, write_json_atomic
from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.lm import icl
from dpcore.lm.prefix_cache import right_pad
from dpcore.names import PROMPT_INITS, PROMPT_KINDS

VOCAB_INIT_TOKENS = 5000


@dataclass(frozen=True)
class Example:
    """One training or scoring item as token ids: the text prompt (ICL header + query) and the
    gold label's verbalizer tokens. Lives in memory only (a function of a private record)."""

    context: tuple[int, ...]
    target: tuple[int, ...]


def instruction_ids(lm, spec: TaskSpec) -> list[int]:
    """P_0 of init "instruction" as token ids, from public text of the task spec: its ICL instruction, or for a
    task without one its label words ("negative, positive")."""
    text = spec.icl.instruction or ", ".join(spec.verbalizer(label).strip() for label in spec.label_names)
    return list(lm.encode(text))


def encode_examples(lm, spec: TaskSpec, texts: Sequence[str], labels: Sequence[str]) -> list[Example]:
    """Token ids of `icl.prompt_text(spec, [], text)` and of the label's verbalizer (`dpcore.lm.icl`)."""
    if spec.kind != "classification":
        raise ConfigError(f"task {spec.name!r}: trained prompts are for classification tasks (verbalizer labels)")
    names = spec.label_names
    unknown = sorted(set(map(str, labels)) - set(names))
    if unknown:
        raise ConfigError(f"labels: {', '.join(unknown)} are not labels of task {spec.name!r}")
    targets = dict(zip(names, icl.label_token_ids(lm, spec, names), strict=True))
    contexts = lm.encode_batch([icl.prompt_text(spec, [], str(t)) for t in texts])
    return [Example(tuple(c), tuple(targets[str(y)])) for c, y in zip(contexts, labels, strict=True)]


# --------------------------------------------------------------------------- model checks


def _embeddings(lm) -> nn.Module:
    embed = lm.model.get_input_embeddings() if hasattr(lm.model, "get_input_embeddings") else None
    if embed is None or getattr(embed, "weight", None) is None or embed.weight.dim() != 2:
        raise ConfigError(f"model {lm.name!r}: has no input embedding table, so a soft prompt cannot be "
                          "prepended (use --kind prefix, or another model)")
    return embed


def _decoder(lm) -> nn.Module:
    decoder = lm.model.get_decoder() if hasattr(lm.model, "get_decoder") else None
    if decoder is None or lm.model.get_output_embeddings() is None:
        raise ConfigError(f"model {lm.name!r}: not a decoder with an output head; trained prompts need a "
                          "Hugging Face causal LM")
    return decoder


def prefix_shape(lm, length: int) -> tuple[int, int, int, int, int]:
    """[layers, 2, kv_heads, s, head_dim] of a prefix, or ConfigError when the model's cache layout is
    not one full-attention key/value pair per layer (sliding-window, hybrid or recurrent caches)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    config = lm.model.config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if not layers or not heads or getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model {lm.name!r}: --kind prefix needs a decoder-only model with a per-layer "
                          "key/value cache; use --kind soft-prompt")
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    try:
        layer_classes = {type(layer) for layer in DynamicCache(config=config).layers}
    except Exception as exc:  # noqa: BLE001 - any failure means the layout is not the one we support
        raise ConfigError(f"model {lm.name!r}: its cache layout is not supported for --kind prefix ({exc}); "
                          "use --kind soft-prompt") from None
    if kinds != {"full_attention"} or layer_classes - {DynamicLayer}:
        raise ConfigError(f"model {lm.name!r}: its cache layout ({', '.join(sorted(kinds))}) is not one "
                          "full-attention key/value pair per layer; --kind prefix is unsupported, use --kind "
                          "soft-prompt")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return (int(layers), 2, int(kv_heads), int(length), int(head_dim))


def check_prompt(lm, kind: str, length: int) -> tuple[int, ...]:
    """The trainable tensor's shape, after every check that can fail (before anything is charged)."""
    if kind not in PROMPT_KINDS:
        raise ConfigError(f"{flag('dpsgd_kind')}: must be one of {', '.join(PROMPT_KINDS)}, got {kind!r}")
    if isinstance(length, bool) or int(length) != length or length < 1:
        raise ConfigError(f"{flag('dpsgd_length')}: the prompt needs at least one position, got {length}")
    _decoder(lm)
    if kind == "soft-prompt":
        return (int(length), int(_embeddings(lm).weight.shape[1]))
    _embeddings(lm)  # the prefix's initialisation runs the vocabulary tokens through the model
    return prefix_shape(lm, int(length))


# --------------------------------------------------------------------------- the prompt


class TrainablePrompt(nn.Module):
    """P of Algorithm 1 (fp32, on the LM's device): a soft prompt [s, e] or a prefix
    [layers, 2, kv_heads, s, head_dim]. Holds no reference to the LM."""

    def __init__(self, kind: str, weight: torch.Tensor):
        super().__init__()
        if kind not in PROMPT_KINDS:
            raise ConfigError(f"{flag('dpsgd_kind')}: must be one of {', '.join(PROMPT_KINDS)}, got {kind!r}")
        self.kind = kind
        with torch.inference_mode(False):  # a normal tensor even when built from an inference tensor
            self.weight = nn.Parameter(weight.detach().float().clone())

    @property
    def length(self) -> int:
        return int(self.weight.shape[0] if self.kind == "soft-prompt" else self.weight.shape[3])

    @torch.inference_mode()
    def cache_layers(self, lm) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The per-layer (keys, values) of the prompt for batch 1, for `icl.label_logprobs(past=...)`:
        a soft prompt run through the model at positions 0..s-1; a prefix as it is."""
        weight = self.weight.detach().to(device=lm.device, dtype=lm.dtype)
        if self.kind == "prefix":
            return [(weight[layer, 0][None], weight[layer, 1][None]) for layer in range(weight.shape[0])]
        out = lm.model(inputs_embeds=weight[None], attention_mask=torch.ones((1, self.length), dtype=torch.long,
                                                                            device=lm.device),
                       use_cache=True, logits_to_keep=1)
        return [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def init_prompt(lm, kind: str, length: int, init: str, generator: torch.Generator,
                instruction_ids: Sequence[int] = ()) -> TrainablePrompt:
    """P_0 (Algorithm 1 line 2) from public inputs only: `generator` (on the CPU) and, for init
    "instruction", `instruction_ids` (the task's ICL instruction as token ids)."""
    shape = check_prompt(lm, kind, length)
    if init not in PROMPT_INITS:
        raise ConfigError(f"{flag('dpsgd_init')}: must be one of {', '.join(PROMPT_INITS)}, got {init!r}")
    embed = _embeddings(lm)
    vocab = int(embed.weight.shape[0])
    tokens = torch.randint(0, min(VOCAB_INIT_TOKENS, vocab), (length,), generator=generator)
    if init == "instruction":
        if not instruction_ids:
            raise ConfigError(f"{flag('dpsgd_init')} instruction: the task has no ICL instruction to start from; "
                              "use vocab")
        tokens = torch.as_tensor([instruction_ids[i % len(instruction_ids)] for i in range(length)])
    with torch.no_grad():
        table = embed.weight.detach().float()
        weight = table[tokens.to(table.device)]
        if kind == "soft-prompt" and init == "random":
            weight = torch.randn(shape, generator=generator).to(table.device) * table.std()
        elif kind == "prefix":
            layers = TrainablePrompt("soft-prompt", weight).cache_layers(lm)
            weight = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers]).float()
            if init == "random":
                scale = weight.flatten(1).std(dim=1).view(-1, 1, 1, 1, 1)
                weight = torch.randn(weight.shape, generator=generator).to(weight.device) * scale
    return TrainablePrompt(kind, weight.clone())


# --------------------------------------------------------------------------- scoring with gradients


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """The LM's parameters with requires_grad=False for the block (restored after): a backward pass
    then reaches the prompt rows only, and no weight gradient is computed or stored."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def example_logprobs(lm, kind: str, rows: torch.Tensor, examples: Sequence[Example]) -> torch.Tensor:
    """[B] log p(target_b | P_b, context_b), a sum over the target tokens, differentiable in `rows`
    ([B, *P.shape], row b the prompt example b reads). Right-padded rows; positions 0..s-1 are the
    prompt's and text positions continue after it, as in `icl.label_logprobs(past=...)`."""
    if len(examples) != rows.shape[0]:
        raise ConfigError(f"rows: {rows.shape[0]} prompt rows for {len(examples)} examples")
    if not examples:
        return torch.zeros(0, device=lm.device)
    device, dtype = lm.device, lm.dtype
    sequences = [list(e.context) + list(e.target[:-1]) for e in examples]
    ids, mask = right_pad(sequences, lm.pad_id)
    ids, mask = ids.to(device), mask.to(device)
    batch, width = ids.shape
    length = rows.shape[1] if kind == "soft-prompt" else rows.shape[4]
    attention = torch.cat([torch.ones((batch, length), dtype=torch.long, device=device), mask], dim=1)
    decoder = _decoder(lm)
    if kind == "soft-prompt":
        embedded = _embeddings(lm)(ids)
        inputs = torch.cat([rows.to(dtype), embedded], dim=1)
        positions = torch.arange(length + width, device=device)[None, :].expand(batch, -1)
        hidden = decoder(inputs_embeds=inputs, attention_mask=attention, position_ids=positions,
                         use_cache=False).last_hidden_state
    else:
        from transformers import DynamicCache

        cast = rows.to(dtype)
        cache = DynamicCache(ddp_cache_data=[(cast[:, layer, 0], cast[:, layer, 1]) for layer in range(rows.shape[1])],
                             config=lm.model.config)
        positions = length + torch.arange(width, device=device)[None, :].expand(batch, -1)
        hidden = decoder(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                         use_cache=True).last_hidden_state
        hidden = torch.cat([hidden.new_zeros((batch, length, hidden.shape[-1])), hidden], dim=1)
    # the hidden state before each target token: prompt + context - 1 + j for target token j
    row_index, position, target = [], [], []
    for b, example in enumerate(examples):
        start = length + len(example.context) - 1
        for j, token in enumerate(example.target):
            row_index.append(b)
            position.append(start + j)
            target.append(token)
    row_t = torch.as_tensor(row_index, device=device)
    picked = hidden[row_t, torch.as_tensor(position, device=device)]
    logp = torch.log_softmax(lm.model.get_output_embeddings()(picked).float(), dim=-1)
    token_logp = logp[torch.arange(len(target), device=device), torch.as_tensor(target, device=device)]
    return torch.zeros(batch, device=device, dtype=token_logp.dtype).index_add(0, row_t, token_logp)


def per_example_gradients(lm, prompt: TrainablePrompt, examples: Sequence[Example]
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(grads [B, *P.shape], losses [B]): g_t(x_b) = grad_P l(L_P, x_b) of Algorithm 1 line 5 for every
    example of the batch from one backward pass (module docstring), l = -log p(verbalizer)."""
    shape = tuple(prompt.weight.shape)
    if not examples:
        return prompt.weight.new_zeros((0, *shape)), prompt.weight.new_zeros((0,))
    rows = prompt.weight.detach().unsqueeze(0).repeat(len(examples), *([1] * len(shape))).requires_grad_(True)
    with frozen(lm.model), torch.enable_grad():
        losses = -example_logprobs(lm, prompt.kind, rows, examples)
        (grads,) = torch.autograd.grad(losses.sum(), rows)
    return grads.float(), losses.detach().float()


@torch.no_grad()
def mean_loss(lm, prompt: TrainablePrompt, examples: Sequence[Example], batch_size: int = 32) -> float:
    """Mean -log p(verbalizer) over `examples` (the validation loss curve)."""
    if not examples:
        return float("nan")
    total = 0.0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        rows = prompt.weight.detach().unsqueeze(0).expand(len(chunk), *prompt.weight.shape)
        total += float(-example_logprobs(lm, prompt.kind, rows, chunk).sum())
    return total / len(examples)


# --------------------------------------------------------------------------- files


def weights_hash(model: nn.Module) -> str:
    """sha256 over the model's parameters and buffers (names, dtypes, shapes, bytes), in state-dict order:
    which frozen LM a prompt was trained on (a prompt only means something on that model)."""
    hasher = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        data = tensor.detach().cpu().contiguous()
        hasher.update(f"{name}:{data.dtype}:{tuple(data.shape)}".encode())
        hasher.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return hasher.hexdigest()


def save_prompt(prompt: TrainablePrompt, path, manifest: dict) -> None:
    """The trained prompt as safetensors (tensor `prompt`, metadata `kind`) and its manifest as JSON next
    to it (`<name>.json`), both written atomically. The manifest must be public (parameters, epsilon)."""
    from safetensors.torch import save

    path = Path(path)
    data = save({"prompt": prompt.weight.detach().float().cpu().contiguous()},
                metadata={"kind": prompt.kind, "length": str(prompt.length), "format": "dpicl-prompt/1"})
    write_json_atomic(path.with_suffix(".json"), json.loads(json.dumps({**manifest, "kind": prompt.kind,
                                                                        "length": prompt.length}, default=str)))
    write_bytes_atomic(path, data)


def load_prompt(path, device: torch.device | str = "cpu") -> tuple[TrainablePrompt, dict]:
    """(prompt, manifest) from `save_prompt`'s files."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt: {path} does not exist")
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        metadata = handle.metadata() or {}
        weight = handle.get_tensor("prompt")
    manifest_path = path.with_suffix(".json")
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    return TrainablePrompt(metadata.get("kind", manifest.get("kind", "soft-prompt")), weight.to(device)), manifest
