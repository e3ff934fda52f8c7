"""The DP fine-tuning baselines of Duan et al. Table 1: LoRA and full fine-tuning of the causal LM.

Duan et al. set their trained prompts beside DP fine-tuning of the whole model and DP LoRA fine-tuning on
the same data and epsilon (Table 1: RoBERTa-base, SST-2 at epsilon 8: soft prompt 92.31, prefix 91.97, full
85.89, LoRA 92.97). Here both train the same objective as the prompts, through the same DP-SGD steps
(`dpcore.dpsgd.training`: Algorithm 1 lines 4-8, the same event and plan), on a private COPY of the model
(the loaded LM is never changed):

- `lora` (Hu et al. 2022, through PEFT): rank-r matrices A (r x in) and B (out x r) beside the frozen
  q_proj and v_proj weights, W + (alpha / r) B A; B starts at 0 (the adapted model starts as the base
  model), A uniform in +-1/sqrt(in) from the run's generator (PEFT's own start, its randomness passed in).
  Only A and B train; the base weights stay frozen (tested).
- `full`: every weight of the model trains (embeddings, which the output head shares, included).

The objective is the prompts' (`soft_prompt` module docstring): -log p(" " + verbalizer(y) | the task's ICL
prompt with no demonstration, the input), the tokens of `dpcore.lm.icl`, so the adapted model scored by
`icl.label_logprobs` gives what training optimised (tested).

Per-example gradients (Algorithm 1 line 5): Opacus' `GradSampleModule` on the copy: its hooks on every
module with a trainable weight (nn.Linear for LoRA's A and B and the full model's projections, nn.Embedding;
LlamaRMSNorm through Opacus' functorch fallback) give each example's gradient from one backward of the
summed loss. Every hooked call is batch-first (the output head is applied to [B, J, hidden] target
positions), rows never interact (attention masks, no batch statistics, dropout switched off), so row b's
gradient is example b's alone (tested against one-example backward passes). Clipping and noise are the
prompts' `private_step` / DPOptimizer.

Memory: per-example gradients hold physical_batch x trainable parameters floats; for full fine-tuning of
the embedded 135M model that is 0.54 GB per example in the chunk, so its CPU preset uses chunks of 2.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dpcore.data.artifacts import write_bytes_atomic, write_json_atomic
from dpcore.dpsgd.soft_prompt import Example, _decoder, load_prompt
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.lm.prefix_cache import right_pad
from dpcore.names import ADAPTER_KINDS, PROMPT_KINDS

# LoRA's shape, fixed (not a per-dataset choice): rank 8 on the attention's query and value projections, alpha
# 16 (scale 2), the usual DP LoRA setting (Yu et al. 2022 train rank-16 q/v adapters on RoBERTa; Hu et al.
# 2022 show q/v at small rank carry most of LoRA's gain).
LORA_RANK = 8
LORA_ALPHA = 16
LORA_TARGETS = ("q_proj", "v_proj")
FORMAT = "dpicl-adapter/1"


def check_adapter(lm, kind: str, rank: int = LORA_RANK) -> int:
    """The number of trainable parameters, after every check that can fail (before anything is charged)."""
    if kind not in ADAPTER_KINDS:
        raise ConfigError(f"{flag('dpsgd_kind')}: must be one of {', '.join(PROMPT_KINDS + ADAPTER_KINDS)}, "
                          f"got {kind!r}")
    _decoder(lm)
    if kind == "full":
        return sum(p.numel() for p in lm.model.parameters())
    targets = _lora_targets(lm.model)
    smallest_side = min(min(t.in_features, t.out_features) for t in targets)
    if isinstance(rank, bool) or int(rank) != rank or not 1 <= rank <= smallest_side:
        raise ConfigError(f"{flag('dpsgd_rank')}: the LoRA rank must be an integer from 1 to the projections' "
                          f"smallest side ({smallest_side}), got {rank}")
    return sum(int(rank) * (t.in_features + t.out_features) for t in targets)


def _lora_targets(model: nn.Module) -> list[nn.Linear]:
    found = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in LORA_TARGETS
             and isinstance(m, nn.Linear)]
    if not found:
        raise ConfigError(f"{flag('dpsgd_kind')} lora: the model has no {' or '.join(LORA_TARGETS)} linear layers "
                          "to adapt; use --kind full or a prompt kind")
    return found


def _no_dropout(model: nn.Module) -> None:
    """Dropout off in the copy: the hooks need train mode, and training must score what evaluation scores."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(model.config, name):
            setattr(model.config, name, 0.0)


def _peft(model: nn.Module, config) -> nn.Module:
    """PEFT's LoRA wrapper of `model` (modified in place), without the deprecation notice PEFT's own call to
    transformers prints on every command."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


class TrainableModel(nn.Module):
    """The trainable copy of the LM's model (fp32, on its device): LoRA matrices (PEFT) or every weight.
    `parameters_()` are the ones DP-SGD updates, in a fixed order."""

    def __init__(self, kind: str, model: nn.Module, rank: int | None = None, peft_model: nn.Module | None = None):
        super().__init__()
        self.kind = kind
        self.model = model
        self.rank = rank
        self._peft = [peft_model]  # PEFT's wrapper of `model` (LoRA), kept out of the module tree
        self._hooks = None

    def parameters_(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def named_trainable(self) -> dict[str, torch.Tensor]:
        """What is saved: LoRA's A and B under PEFT's names, or the whole state of the fine-tuned model."""
        if self.kind == "lora":
            from peft import get_peft_model_state_dict

            return get_peft_model_state_dict(self._peft[0])
        return dict(self.model.state_dict())

    def grad_sampler(self):
        """Opacus' hooks on the copy, attached once (per-example gradients of every trainable weight)."""
        if self._hooks is None:
            from opacus.grad_sample import GradSampleModule

            self.model.train()  # the hooks record in train mode only; dropout is off (`_no_dropout`)
            self._hooks = [GradSampleModule(self.model, batch_first=True, loss_reduction="sum", strict=False)]
        return self._hooks[0]


def init_adapter(lm, kind: str, generator: torch.Generator, rank: int = LORA_RANK) -> TrainableModel:
    """The starting point (Algorithm 1 line 2) from public inputs only: a copy of the LM's model in fp32,
    with LoRA matrices (A from `generator`, B = 0) or all weights trainable."""
    check_adapter(lm, kind, rank)
    model = copy.deepcopy(lm.model).float()
    _no_dropout(model)
    if kind == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return TrainableModel(kind, model)
    from peft import LoraConfig

    config = LoraConfig(r=int(rank), lora_alpha=LORA_ALPHA, target_modules=list(LORA_TARGETS), lora_dropout=0.0,
                        bias="none")
    peft_model = _peft(model, config)
    inner = peft_model.get_base_model()
    with torch.no_grad():
        for name, p in inner.named_parameters():
            if ".lora_A." in name:  # PEFT's kaiming-uniform start, bound 1/sqrt(in), from the run's generator
                bound = 1.0 / math.sqrt(p.shape[1])
                p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1).to(p.device) * bound)
            elif ".lora_B." in name:
                p.zero_()
    return TrainableModel(kind, inner, int(rank), peft_model)


# --------------------------------------------------------------------------- the objective and its gradients


def example_logprobs(model: nn.Module, pad_id: int, examples: Sequence[Example]) -> torch.Tensor:
    """[B] log p(target_b | context_b) of `model`, a sum over the target tokens; every module call
    batch-first (the head reads [B, J, hidden], J the longest target) for Opacus' hooks."""
    device = next(model.parameters()).device
    ids, mask = right_pad([list(e.context) + list(e.target[:-1]) for e in examples], pad_id)
    hidden = model.get_decoder()(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 use_cache=False).last_hidden_state
    width = max(len(e.target) for e in examples)
    position = torch.zeros((len(examples), width), dtype=torch.long)
    target = torch.zeros((len(examples), width), dtype=torch.long)
    valid = torch.zeros((len(examples), width), dtype=torch.bool)
    for b, example in enumerate(examples):
        n = len(example.target)
        position[b, :n] = torch.arange(len(example.context) - 1, len(example.context) - 1 + n)
        target[b, :n] = torch.as_tensor(example.target)
        valid[b, :n] = True
    picked = hidden[torch.arange(len(examples))[:, None].to(device), position.to(device)]
    logp = torch.log_softmax(model.get_output_embeddings()(picked).float(), dim=-1)
    token = logp.gather(-1, target.to(device)[..., None]).squeeze(-1)
    return (token * valid.to(device)).sum(dim=1)


def per_example_gradients(lm, adapter: TrainableModel, examples: Sequence[Example]
                          ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """([grads [B, *p.shape] per trainable parameter], losses [B]): Algorithm 1 line 5 for every example of
    the chunk from one backward pass (Opacus' hooks, module docstring), l = -log p(verbalizer)."""
    params = adapter.parameters_()
    if not examples:
        return [p.new_zeros((0, *p.shape)) for p in params], params[0].new_zeros((0,))
    adapter.grad_sampler()
    for p in params:  # the last step's gradients (Opacus would append this chunk's to them)
        p.grad_sample = None
    with torch.enable_grad(), warnings.catch_warnings():
        # the inputs are token ids: torch warns that its module hooks see no input gradient, as intended
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        losses = -example_logprobs(adapter.model, lm.pad_id, examples)
        torch.autograd.grad(losses.sum(), params)
    grads = []
    for p in params:
        grads.append(p.grad_sample.detach())
        p.grad_sample = None
    return grads, losses.detach().float()


@torch.no_grad()
def mean_loss(lm, adapter: TrainableModel, examples: Sequence[Example], batch_size: int = 32) -> float:
    """Mean -log p(verbalizer) over `examples` (the validation loss curve)."""
    if not examples:
        return float("nan")
    total = sum(float(-example_logprobs(adapter.model, lm.pad_id, examples[s:s + batch_size]).sum())
                for s in range(0, len(examples), batch_size))
    return total / len(examples)


# --------------------------------------------------------------------------- files and scoring


def save_adapter(adapter: TrainableModel, path, manifest: dict) -> None:
    """The trained weights as safetensors (LoRA's A and B under PEFT's names, or the fine-tuned model's
    state) and the public manifest next to it (`<name>.json`), both written atomically."""
    from safetensors.torch import save

    path = Path(path)
    tensors = {name: t.detach().float().cpu().contiguous().clone() for name, t in adapter.named_trainable().items()}
    shape = {"kind": adapter.kind, "rank": adapter.rank, "lora_alpha": LORA_ALPHA if adapter.kind == "lora" else None,
             "target_modules": list(LORA_TARGETS) if adapter.kind == "lora" else None}
    data = save(tensors, metadata={"kind": adapter.kind, "rank": str(adapter.rank or 0), "format": FORMAT})
    write_json_atomic(path.with_suffix(".json"), json.loads(json.dumps({**manifest, **shape}, default=str)))
    write_bytes_atomic(path, data)


def file_kind(path) -> str:
    """The kind a trained file holds (its safetensors metadata): a prompt kind or an adapter kind."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt: {path} does not exist")
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        return (handle.metadata() or {}).get("kind", "soft-prompt")


def adapted_lm(lm, path):
    """A `LanguageModel` whose model is a copy of `lm`'s with the trained adapter applied (LoRA merged into
    the weights) or the fine-tuned weights loaded; `lm` itself is left unchanged."""
    from safetensors.torch import load_file

    from dpcore.lm.model import LanguageModel

    kind = file_kind(path)
    state = load_file(str(path), device="cpu")
    model = copy.deepcopy(lm.model)
    if kind == "full":
        model.load_state_dict({k: v.to(dtype=lm.dtype) for k, v in state.items()}, strict=True)
    else:
        from peft import LoraConfig, set_peft_model_state_dict

        manifest = json.loads(Path(path).with_suffix(".json").read_text())
        config = LoraConfig(r=int(manifest["rank"]), lora_alpha=manifest["lora_alpha"],
                            target_modules=list(manifest["target_modules"]), lora_dropout=0.0, bias="none")
        peft_model = _peft(model.float(), config)
        loaded = set_peft_model_state_dict(peft_model, state)
        if loaded.unexpected_keys or any(".lora_" in key for key in loaded.missing_keys):
            raise ConfigError(f"prompt: {Path(path).name} does not hold the LoRA matrices its manifest describes")
        model = peft_model.merge_and_unload().to(dtype=lm.dtype)
    return LanguageModel(model.to(lm.device), lm.tokenizer, f"{lm.name}+{kind}", lm.device, lm.dtype)


def trained_scoring(lm, path):
    """(the model to score with, the cache before every prompt) for a trained file of any kind: a prompt's
    cache on `lm`, or the adapted model and no cache."""
    if file_kind(path) in ADAPTER_KINDS:
        return adapted_lm(lm, path), None
    return lm, load_prompt(path, lm.device)[0].cache_layers(lm)
