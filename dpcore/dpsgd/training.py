"""PromptDPSGD: DP-SGD on a trainable prompt (Duan et al. Section 4.1, App. C.1 Algorithm 1, App. C.3).

Algorithm 1, line by line, with Opacus 1.6:

- line 2, P_0: `dpcore.dpsgd.soft_prompt.init_prompt` (public randomness only).
- line 4, Poisson sampling with rate q: Opacus' `UniformWithReplacementSampler` (what its `DPDataLoader`
  uses): every training example is in B_t independently with probability q, T batches in all
  (`poisson_batches`). Its generator is the run's sampling generator.
- line 5, per-example gradients w.r.t. P only: `soft_prompt.per_example_gradients`, exact (one backward
  through a per-example copy of P, see that module), in physical chunks of `physical_batch_size`.
- line 6, clipping to C, and line 7, Gaussian noise N(0, sigma^2 C^2 I) on the sum: Opacus' `DPOptimizer`
  (`clip_and_accumulate`, `add_noise` with `secure_mode=True`: the noise resists floating-point attacks)
  reading `P.grad_sample`; chunks of one Poisson batch are accumulated with `signal_skip_step` (Opacus'
  `BatchMemoryManager` pattern) so noise is added once per logical step. The noisy sum is divided by the
  EXPECTED batch size qN (Opacus' `loss_reduction="mean"`), not by |B_t| as line 7 writes: the divisor
  is then data-independent (|B_t| itself is a function of the sample); the privacy analysis is the same.
- line 8, the update: AdamW (weight decay 0) with the learning rate decayed linearly to 0 over the T
  steps. Duan et al. do not name their optimizer; their code builds on P-tuning v2, whose trainer
  (Hugging Face's) uses exactly this. Any optimizer is post-processing of the noisy gradients.
- line 10 and App. C.3: T Poisson-sampled Gaussian steps, the event
  `SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)` (`dpsgd_event`), composed and
  calibrated by `dpcore.privacy.composition` (PRV upper bound, PLD cross-check) like every other method; sigma is
  calibrated from the target epsilon; delta = 1/N by default (Duan et al. Section 5.1). `dpsgd_plan` is
  the method's `PrivacyPlan`: one spend "gaussian" (sigma, q, T), purpose "dpsgd".

Neighbouring datasets: add/remove one training example. Every private record is a training example
(N = |D_priv|): no private validation split is carved out. The loss curve is computed on PUBLIC
labelled examples (the shipped task's public split, or a file the user declares public), so it is
post-processing of the DP prompt; it never selects anything. The released prompt is P_T (line 10).

Randomness: two torch generators seeded from one root (`dpcore.fewshot.mechanisms.noise_seed_sequence`):
128 bits from the OS CSPRNG unless the caller gives a seed (an experiment, marked `seeded_noise` and
never releasable). The noise generator lives on the LM's device.

Checkpoints (resume after a stop or a crash): the state (step, P, AdamW state, the schedule, both
generators' states, the curve) is handed to a `checkpoint` callback, which keeps it in the private store:
at step 0 (P_0 made, before any Poisson or noise draw), every `checkpoint_every` steps, and, when the
training is stopped (`dpcore.errors.is_stop`: RunStopped, Ctrl-C, SIGTERM), at the last finished step. A
stop inside a step's update (the noise, AdamW's and the schedule's step) keeps nothing: that state is half
made, and the last kept checkpoint serves. A resumed run continues from the saved generator states (the
Poisson sampler draws each step's batch when the step begins), so it draws the same batches and the same
noise as the uninterrupted run would: the released P_T is one run of the mechanism, covered by the one
ledger entry charged for the whole planned run before the first step. Nothing of a stopped attempt is ever
released (its state stays private), so no second charge is due. A resume is refused when the saved state
belongs to another plan or data (`check_resume`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from dpcore.dpsgd import adapters
from dpcore.dpsgd.config import DpsgdSection
from dpcore.dpsgd.soft_prompt import (
    Example,
    TrainablePrompt,
    mean_loss,
    per_example_gradients,
)
from dpcore.errors import ConfigError, is_stop
from dpcore.fewshot.mechanisms import noise_seed_sequence
from dpcore.flags import flag
from dpcore.lm.model import pick_device
from dpcore.names import PROMPT_INITS, TUNE_KINDS
from dpcore.privacy import composition
from dpcore.privacy.events import DpEvent, tang_event
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

PURPOSE = "dpsgd"
MECHANISM = "gaussian"

# Duan et al. App. E.1, Table 6 (RoBERTa, A100): C = 0.1 "in most cases" (Section 5.1), batch 1024,
# prompt length 10, lr 0.005, 100 epochs ("the more the better").
GPU_PRESET: dict[str, Any] = {"batch_size": 1024, "length": 10, "clip": 0.1, "epochs": 100.0, "steps": None,
                              "lr": 0.005, "init": "vocab", "physical_batch_size": 64, "validation_size": 500}
# The recipe for the embedded 135M model on 2 CPU cores, one training within 30 minutes: 48 steps of expected
# batch 64 (3,072 examples in expectation; AG News, the longest records of the shipped tasks, trains at about
# 2 examples/s), AdamW at lr 0.3 decayed linearly, 10 positions started from the task's instruction tokens.
# At a small sampling rate sigma grows far slower than the batch, so the noise on the mean gradient (sigma C /
# B) is small already at B = 64, and 48 steps beat fewer, larger ones at the same compute. Chosen ONCE on
# public data, never on a user's records: `benchmarks/utility.py --grid` trained batch 64/128/256/512 x lr
# 0.01-0.3 x length 10/20 at epsilon 8 on the PUBLIC splits of SST-2 and AG News (never their test splits)
# and kept the best mean public accuracy; TREC was never looked at. benchmarks/RESULTS.md has the sweep and
# the table.
CPU_PRESET: dict[str, Any] = {"batch_size": 64, "length": 10, "clip": 0.1, "epochs": None, "steps": 48,
                              "lr": 0.3, "init": "instruction", "physical_batch_size": 16, "validation_size": 64}


# The other kinds keep the prompts' sampling, steps and C (the same privacy event at the same epsilon) and
# change what an update is worth, so each has its own learning rate. CPU values: chosen ONCE on public data at
# the CPU recipe's shape (batch 64, T 48, epsilon 8), by `benchmarks/utility.py --set kind=K --grid lr=...
# --sweep-datasets sst2` on SST-2's PUBLIC split (never a test split): prefix 0.01 of 0.01/0.05/0.3 (the soft
# prompt's 0.3 scored 0.56 as a prefix), LoRA 8e-3 of 5e-4/2e-3/8e-3 (the grid's edge), full 1e-4 of 2e-5/1e-4
# (benchmarks/RESULTS.md, PromptDPSGD). GPU values (the paper's 1024-batch shape) are the DP fine-tuning
# literature's, not chosen on data. Full fine-tuning's per-example gradients are 0.54 GB an example on the
# 135M model: chunks of 2 on CPU, 8 on GPU.
KIND_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "prefix": {"cpu": {"lr": 0.01}},
    "lora": {"cpu": {"lr": 8e-3, "physical_batch_size": 16}, "gpu": {"lr": 5e-4, "physical_batch_size": 64}},
    "full": {"cpu": {"lr": 1e-4, "physical_batch_size": 2}, "gpu": {"lr": 5e-5, "physical_batch_size": 8}},
}


def preset(device: str, kind: str = "soft-prompt") -> dict[str, Any]:
    """The GPU preset (paper Table 6) on CUDA, the CPU preset otherwise; the kind's learning rate and chunk size
    (`KIND_PRESETS`) on top."""
    gpu = pick_device(device).type == "cuda"
    values = dict(GPU_PRESET if gpu else CPU_PRESET)
    values.update(KIND_PRESETS.get(kind, {}).get("gpu" if gpu else "cpu", {}))
    return values


class RunSettings(Protocol):
    """What `dpsgd_config` reads of a run (a `dpcore.config.RunConfig`, which sits above this subsystem): its
    PromptDPSGD section and its device."""

    @property
    def dpsgd(self) -> DpsgdSection: ...

    @property
    def device(self) -> str: ...


def dpsgd_config(config: RunSettings) -> DpsgdConfig:
    """The run's `DpsgdConfig`: its section resolved on its device (`section_config`)."""
    return section_config(config.dpsgd, config.device)


def section_config(section: DpsgdSection, device: str = "auto") -> DpsgdConfig:
    """The `DpsgdConfig` of a PromptDPSGD section (`dpcore.dpsgd.config.DpsgdSection`): the preset (the section's
    `preset`; by `device` when auto) with every field of the section that is set on top; steps beat epochs beat
    the preset's length."""
    values = preset("cuda" if section.preset == "gpu" else "cpu" if section.preset == "cpu"
                    else device, section.kind)
    if section.epochs is not None:
        values.update(epochs=section.epochs, steps=None)
    if section.steps is not None:
        values["steps"] = section.steps
    for name in ("length", "init", "clip", "batch_size", "lr", "physical_batch_size", "validation_size", "rank"):
        if getattr(section, name) is not None:
            values[name] = getattr(section, name)
    return DpsgdConfig(kind=section.kind, **values).check()


class DpsgdConfig(BaseModel):
    """Algorithm 1's parameters, what one training takes: the run's section (`RunConfig.dpsgd`, a
    `DpsgdSection`, whose unset fields are None) with the presets applied, every parameter set and checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field("soft-prompt", description="soft-prompt or prefix; lora or full (the fine-tuning baselines)")
    rank: int = Field(adapters.LORA_RANK, description="LoRA rank r (kind lora)")
    length: int = Field(10, description="s: prompt positions")
    init: str = Field("vocab", description="P_0: embeddings of random vocabulary tokens, at random, or the "
                      "embeddings of the task's instruction tokens")
    clip: float = Field(0.1, description="C: per-example gradient norm bound")
    batch_size: int = Field(1024, description="expected batch size qN")
    epochs: float | None = Field(100.0, description="T = epochs / q (rounded) unless steps is given")
    steps: int | None = Field(None, description="T directly")
    lr: float = Field(0.005, description="eta_0 (AdamW, linear decay to 0)")
    physical_batch_size: int = Field(64, description="examples per forward/backward (memory only)")
    validation_size: int = Field(200, description="public labelled examples for the loss curve (never private "
                                 "records: the task's public split, or --dpsgd-validation-path)")
    eval_every: int | None = Field(None, description="validation loss every this many steps (default T/5)")
    checkpoint_every: int = Field(50, description="steps between checkpoints")

    def check(self) -> DpsgdConfig:
        """Every parameter in range, or ConfigError naming it (before anything is charged)."""
        if self.kind not in TUNE_KINDS:
            raise ConfigError(f"{flag('dpsgd_kind')}: must be one of {', '.join(TUNE_KINDS)}, got {self.kind!r}")
        if self.kind == "lora" and (isinstance(self.rank, bool) or self.rank < 1):
            raise ConfigError(f"{flag('dpsgd_rank')}: the LoRA rank must be >= 1, got {self.rank}")
        if self.init not in PROMPT_INITS:
            raise ConfigError(f"{flag('dpsgd_init')}: must be one of {', '.join(PROMPT_INITS)}, got {self.init!r}")
        if self.length < 1:
            raise ConfigError(f"{flag('dpsgd_length')}: the prompt needs at least one position, got {self.length}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ConfigError(f"{flag('dpsgd_clip')}: the clipping norm C must be a finite number > 0, got {self.clip}")
        if self.batch_size < 1:
            raise ConfigError(f"{flag('dpsgd_batch_size')}: must be >= 1, got {self.batch_size}")
        if self.steps is None and (self.epochs is None or not (math.isfinite(self.epochs) and self.epochs > 0)):
            raise ConfigError(f"{flag('dpsgd_epochs')}: must be a finite number > 0 (or give {flag('dpsgd_steps')}), "
                              f"got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"{flag('dpsgd_steps')}: must be >= 1, got {self.steps}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"{flag('dpsgd_lr')}: must be a finite number > 0, got {self.lr}")
        for name in ("physical_batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag('dpsgd_' + name)}: must be >= 1, got {getattr(self, name)}")
        if self.validation_size < 0:
            raise ConfigError(f"{flag('dpsgd_validation_size')}: must be >= 0, got {self.validation_size}")
        return self


# --------------------------------------------------------------------------- accounting


def sampling_rate(batch_size: int, num_records: int) -> float:
    """q = expected batch size / N (Algorithm 1 line 4)."""
    if num_records < 1:
        raise ConfigError("training data: no private training example to train on")
    if batch_size > num_records:
        raise ConfigError(f"{flag('dpsgd_batch_size')}: {batch_size} is larger than the {num_records} private "
                          "training examples (q would exceed 1); use a smaller batch size")
    return batch_size / num_records


def num_steps(config: DpsgdConfig, q: float) -> int:
    """T: `steps` if given, else round(epochs / q) (an epoch is 1/q Poisson steps)."""
    if config.steps is not None:
        return int(config.steps)
    return max(1, round(float(config.epochs) / q))


def dpsgd_event(noise_multiplier: float, q: float, steps: int) -> DpEvent:
    """T Poisson-sampled Gaussian steps (App. C.3, Theorem 1): the one event of a PromptDPSGD run."""
    return tang_event(MECHANISM, noise_multiplier, q, steps)


@functools.lru_cache(maxsize=64)
def _calibrated(epsilon: float, q: float, steps: int, delta: float) -> float:
    return composition.calibrate(lambda sigma: dpsgd_event(sigma, q, steps), epsilon, delta).noise_multiplier


def dpsgd_plan(epsilon: float, num_records: int, config: DpsgdConfig, delta: float | None = None,
               trainings: int = 1) -> PrivacyPlan:
    """The run's `PrivacyPlan`: sigma calibrated so one training of T steps at rate q meets (epsilon,
    delta); one spend per training (`trainings` independent prompts, e.g. evaluation seeds, each
    charged). epsilon = inf: sigma = 0, an infinite spend (non-private training, clipping kept)."""
    config.check()
    eps = float(epsilon)
    if math.isnan(eps) or eps <= 0:
        raise ConfigError(f"epsilon: must be > 0 (or inf) for PromptDPSGD, got {epsilon}; zero-shot is the "
                          "epsilon = 0 comparison")
    if trainings < 1:
        raise ConfigError(f"seeds: at least one training, got {trainings}")
    q = sampling_rate(config.batch_size, num_records)
    steps = num_steps(config, q)
    delta = float(delta) if delta is not None else 1.0 / num_records
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta: must be in (0, 1), got {delta}")
    sigma = 0.0 if math.isinf(eps) else _calibrated(eps, q, steps, delta)
    spend = Spend.sampled_steps(MECHANISM, sigma, q, steps, PURPOSE, what="DP-SGD steps on the trainable prompt")
    shape = ({"rank": config.rank} if config.kind == "lora" else {} if config.kind == "full"
             else {"length": config.length, "init": config.init})
    parameters = {"kind": config.kind, **shape, "clip": config.clip,
                  "batch_size": config.batch_size, "epochs": steps * q, "steps": steps, "lr": config.lr,
                  "noise_multiplier": sigma, "sampling_rate": q, "training_records": num_records,
                  "trainings": trainings, "optimizer": "adamw, linear decay"}
    return PrivacyPlan(method="dpsgd", epsilon=eps, delta=delta, spends=(spend,) * trainings,
                       parameters=parameters)


def epsilon_after(noise_multiplier: float, q: float, steps: int, delta: float) -> float:
    """Epsilon spent after `steps` of the T planned steps (progress display)."""
    if steps < 1:
        return 0.0
    return composition.compose([dpsgd_event(noise_multiplier, q, steps)], delta).epsilon


# --------------------------------------------------------------------------- data and randomness


def generators(seed: int | None, device: torch.device | str = "cpu") -> tuple[torch.Generator, torch.Generator, bool]:
    """(noise generator on `device`, sampling generator on the CPU, seeded flag) from one root."""
    root, seeded = noise_seed_sequence(seed)
    noise_seed, sample_seed = (int(s) >> 1 for s in root.generate_state(2, dtype=np.uint64))
    noise = torch.Generator(device=torch.device(device)).manual_seed(noise_seed)
    sample = torch.Generator().manual_seed(sample_seed)
    return noise, sample, seeded


def poisson_batches(num_records: int, q: float, steps: int, generator: torch.Generator):
    """Algorithm 1 line 4 for `steps` steps: Opacus' Poisson sampler (each example in with probability q)."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    return UniformWithReplacementSampler(num_samples=num_records, sample_rate=q, generator=generator, steps=steps)


def trainable_parameters(trainable) -> list[torch.nn.Parameter]:
    """What DP-SGD updates: P of a prompt, or the trainable weights of an adapter (`adapters.TrainableModel`)."""
    return trainable.parameters_() if isinstance(trainable, adapters.TrainableModel) else [trainable.weight]


def example_gradients(lm, trainable, examples: Sequence[Example]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """([per-example gradients per trainable parameter], losses) of a prompt or an adapter (line 5)."""
    if isinstance(trainable, adapters.TrainableModel):
        return adapters.per_example_gradients(lm, trainable, examples)
    grads, losses = per_example_gradients(lm, trainable, examples)
    return [grads], losses


def validation_loss(lm, trainable, examples: Sequence[Example], batch_size: int) -> float:
    if isinstance(trainable, adapters.TrainableModel):
        return adapters.mean_loss(lm, trainable, examples, batch_size)
    return mean_loss(lm, trainable, examples, batch_size)


def dp_optimizer(prompt, noise_multiplier: float, clip: float, expected_batch_size: float,
                 lr: float, generator: torch.Generator):
    """Opacus' DPOptimizer over AdamW on P (or an adapter's weights): clipping to C, noise std sigma C on the
    sum, mean over qN."""
    from opacus.optimizers import DPOptimizer

    base = torch.optim.AdamW(trainable_parameters(prompt), lr=lr, weight_decay=0.0)
    return DPOptimizer(base, noise_multiplier=float(noise_multiplier), max_grad_norm=float(clip),
                       expected_batch_size=expected_batch_size, loss_reduction="mean", generator=generator,
                       secure_mode=True)


def private_step(optimizer, prompt, chunks: Iterable, before_update: Callable[[], None] | None = None) -> None:
    """One step of Algorithm 1 lines 6-8 from a Poisson batch's per-example gradients, given in
    physical chunks ([b_i, *P.shape] each, or a list of such, one per trainable parameter of an adapter;
    an empty batch is one chunk of 0 rows): every chunk is clipped (the norm over all parameters) and
    summed, the noise added once, the update made. `.grad` keeps the noisy mean gradient until the next step.
    `before_update()` is called when the noise and the update begin (the last chunk's step): until then
    neither P, the optimizer's state nor the noise generator has changed."""
    params = trainable_parameters(prompt)
    optimizer.zero_grad(set_to_none=True)
    # chunks may be a generator: read one ahead (to know the last), so at most two chunks are held at once
    # (a fine-tuned model's chunk is 0.54 GB an example)
    pending = iter(chunks)
    current = next(pending, None)
    if current is None:
        current = [p.new_zeros((0, *p.shape)) for p in params]
    while current is not None:
        following = next(pending, None)
        for p, g in zip(params, current if isinstance(current, list | tuple) else [current], strict=True):
            p.grad_sample = g
        optimizer.signal_skip_step(following is not None)
        if following is None and before_update is not None:
            before_update()
        optimizer.step()
        if following is not None:
            optimizer.zero_grad(set_to_none=True)
        current = following


# --------------------------------------------------------------------------- training


@dataclass
class TrainResult:
    prompt: TrainablePrompt
    steps: int
    seeded_noise: bool
    # public: (step, validation loss, epsilon spent so far); the loss is over PUBLIC labelled examples
    # (post-processing of the DP prompt), never over private records
    curve: list[dict] = field(default_factory=list)
    # private: the training positions some Poisson batch drew (the records the mechanism read: the
    # release audit's members)
    sampled: set[int] = field(default_factory=set)
    # private (a non-DP function of the sampled training batches): mean training loss per step
    private_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def check_resume(state: dict, fingerprint: str) -> None:
    """A checkpoint serves only the plan and data it was saved for."""
    if state.get("fingerprint") != fingerprint:
        raise ConfigError("checkpoint: it belongs to another plan or dataset; start a new run id")


def _chunk_gradients(lm, trainable, examples: Sequence[Example], physical_batch_size: int, losses: list):
    """Per-example gradients of a Poisson batch, one physical chunk at a time (each chunk's losses appended
    to `losses`): computed as `private_step` reads them, never all held at once."""
    for first in range(0, len(examples), physical_batch_size):
        grads, chunk_losses = example_gradients(lm, trainable, examples[first:first + physical_batch_size])
        losses.append(chunk_losses)
        yield grads


def train(lm, prompt: TrainablePrompt | adapters.TrainableModel, train_examples: Sequence[Example], val_examples: Sequence[Example], *,
          noise_multiplier: float, sampling_rate: float, steps: int, clip: float, lr: float, delta: float,
          noise_generator: torch.Generator, sampling_generator: torch.Generator, seeded: bool,
          physical_batch_size: int = 64, eval_every: int | None = None, checkpoint_every: int = 50,
          checkpoint: Callable[[dict], None] | None = None, resume: dict | None = None,
          fingerprint: str = "", progress: Callable[[int, int, dict], None] | None = None) -> TrainResult:
    """Algorithm 1 for T = `steps` steps on `train_examples`; P (or an adapter) is updated in place and returned.

    `val_examples` are public labelled examples (never private records). `progress(step, T, info)` gets
    public values only: `val_loss` on those (when evaluated) and `epsilon` spent so far (at eval points);
    no timing (a per-step time would reveal the Poisson batch sizes and the records' lengths).
    `checkpoint(state)` keeps a state to continue from (`resume`): at step 0 of a fresh training, every
    `checkpoint_every` steps, and the last finished step when stopped (see the module docstring)."""
    n = len(train_examples)
    expected = sampling_rate * n
    optimizer = dp_optimizer(prompt, noise_multiplier, clip, expected, lr, noise_generator)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer.original_optimizer,
                                                 lambda t: max(0.0, 1.0 - t / steps))
    eval_every = eval_every or max(1, steps // 5)
    result = TrainResult(prompt=prompt, steps=steps, seeded_noise=seeded)
    start = 0
    if resume is not None:
        check_resume(resume, fingerprint)
        with torch.no_grad():
            for p, saved in zip(trainable_parameters(prompt), resume.get("weights") or [resume["weight"]],
                                strict=True):
                p.copy_(saved.to(p.device))
        optimizer.original_optimizer.load_state_dict(resume["optimizer"])
        schedule.load_state_dict(resume["schedule"])
        noise_generator.set_state(resume["noise_generator"])
        sampling_generator.set_state(resume["sampling_generator"])
        start = int(resume["step"])
        result.curve = list(resume["curve"])
        result.private_losses = list(resume["private_losses"])
        result.sampled = set(resume.get("sampled", ()))

    def curve_point(step: int) -> dict:
        if step == 0:
            return {"step": 0, "val_loss": validation_loss(lm, prompt, val_examples, physical_batch_size),
                    "epsilon": 0.0}
        return {"step": step, "epsilon": epsilon_after(noise_multiplier, sampling_rate, step, delta),
                "val_loss": validation_loss(lm, prompt, val_examples, physical_batch_size) if val_examples
                else math.nan}

    def curve_due(step: int) -> bool:
        return bool(val_examples) if step == 0 else (step % eval_every == 0 or step == steps)

    # the state after the last finished step: its generators' states are taken when it finishes (the next
    # step's Poisson draw comes before its update); P, AdamW and the schedule change only inside an update
    finished = {"step": start, "noise": noise_generator.get_state(), "sampling": sampling_generator.get_state(),
                "updating": False}

    def kept() -> dict:
        return {"fingerprint": fingerprint, "step": finished["step"],
                "weights": [p.detach().cpu().clone() for p in trainable_parameters(prompt)],
                "optimizer": copy.deepcopy(optimizer.original_optimizer.state_dict()),
                "schedule": copy.deepcopy(schedule.state_dict()),
                "noise_generator": finished["noise"], "sampling_generator": finished["sampling"],
                "curve": list(result.curve), "private_losses": list(result.private_losses),
                "sampled": sorted(result.sampled)}

    def updating() -> None:
        finished["updating"] = True

    began = time.perf_counter()
    try:
        # a point of the curve the kept state lacks (stopped while evaluating it): public work, no draw
        if curve_due(start) and not (result.curve and result.curve[-1]["step"] == start):
            result.curve.append(curve_point(start))
        if checkpoint is not None and resume is None:
            checkpoint(kept())  # P_0, before any draw: a retry continues this training from here
        batches = poisson_batches(n, sampling_rate, steps - start, sampling_generator) if start < steps else ()
        for step, indices in enumerate(batches, start + 1):
            losses: list[torch.Tensor] = []
            # similar lengths share a chunk (less padding); the clipped sum does not depend on the order
            indices = sorted(indices, key=lambda i: len(train_examples[i].context))
            private_step(optimizer, prompt, _chunk_gradients(lm, prompt, [train_examples[i] for i in indices],
                                                             physical_batch_size, losses), before_update=updating)
            schedule.step()
            result.sampled.update(int(i) for i in indices)
            result.private_losses.append(float(torch.cat(losses).mean()) if indices else math.nan)
            finished.update(step=step, noise=noise_generator.get_state(), sampling=sampling_generator.get_state(),
                            updating=False)
            info: dict[str, Any] = {}
            if curve_due(step):
                point = curve_point(step)
                result.curve.append(point)
                info.update(val_loss=point["val_loss"], epsilon=point["epsilon"])
            if checkpoint is not None and (step % checkpoint_every == 0 and step < steps):
                checkpoint(kept())
            if progress is not None:
                progress(step, steps, info)
    except BaseException as exc:
        # stopped: keep the last finished step (a half-made update keeps nothing: the last checkpoint serves)
        if checkpoint is not None and is_stop(exc) and not finished["updating"]:
            with contextlib.suppress(Exception):  # the caller must see the stop; the last checkpoint still serves
                checkpoint(kept())
        raise
    result.seconds = time.perf_counter() - began
    return result
