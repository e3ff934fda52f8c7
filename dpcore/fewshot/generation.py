"""DP few-shot generation: Tang et al. Algorithm 1, batched across labels, shots and groups.

For every requested (label y, shot) a synthetic demonstration is generated token by token.
At each token step t (line 2), for every (label, shot) still generating:

  lines 3-5   a fresh sample of D_y split into M groups (`dpcore.fewshot.sampling`: Poisson at
              q = MN/|D_y| by default; empty groups contribute nothing);
  line 6      each non-empty group's prompt PB(instruction, group records, y) + text so far;
  lines 7-10  RVP: the public prompt PB(instruction, no records, y) + text so far gives the
              top-K set S; every group distribution is restricted to S and renormalised;
  lines 11-19 Gaussian (sum + N(0, 2 sigma^2), arg max) or report-noisy-max (sum of
              max-normalised distributions + exponential noise, arg max)
              (`dpcore.fewshot.mechanisms`);
  lines 20-22 stop at an end token (not kept), at the task's stop string (kept out of the
              text), or after T_max tokens.

Engine: ONE batched forward call per step over every active prompt (all groups of all
labels and shots plus their public prompts), last-position logits only, shared prefix
computed once (`dpcore.lm.batching.BatchedForward`). Inside the call the public prompts run in
a pass of their own and each label's group prompts in another (`_Engine._forward`: no model
call mixes public with private prompts or two labels' records, so the RVP set is public bit
for bit). Finished demonstrations drop out. Each group prompt's prefix PB(instruction, records, y) is
tokenised once per step (records change every step: no reuse across steps is possible),
and the generated token ids are appended as ids (generated text is never re-tokenised).

Randomness: one root `SeedSequence` per call (cryptographically seeded unless `seed` is
given), from which each (label, shot) derives its own sampling stream and noise stream by
a key of (label name, shot). So a (label, shot) draws the same samples and noise whether it
is generated alone or together with others, and the tokens agree up to float rounding of
the batched forward pass.

Stopping and resuming: with a `checkpoint` callback, `generate_demos` hands over a `GenerationState` before
its first draw and after every finished token step, before that step's progress is reported: what every
(label, shot) generated so far (each finished step's DP output) and the states of its sampling and noise
generators. `resume=` continues from such a state at the next step, so the steps already taken are kept as
they were and the remaining ones draw what the uninterrupted call would have drawn (bit for bit with a
seed); the loop still ends at T_max token steps per demonstration, so a resumed call never takes more
steps than were accounted. A step that did not finish released nothing and is drawn again. The state is
private (its generator states predict every later draw): the caller keeps it in the private store.

Privacy boundary: record text only enters prompt strings; errors name parameters and labels,
never text. Counters split in two: `GenerationResult.stats` (and the top level of a progress
callback's dict, and the log lines) hold only what is a function of the DP outputs and the
configuration (steps, sequences still generating, synthetic tokens, demos); everything that
depends on the sampled records' lengths or on the sample itself (prompts = non-empty groups,
prompt tokens, padded/forward tokens, per-phase timings, tokens/s) goes to
`GenerationResult.private_stats` and to the progress dict's `"private"` entry. Only the
public part may be published; benchmarks read the private part in process.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pandas as pd
import torch

from dpcore.errors import ConfigError
from dpcore.fewshot.config import GenerationConfig
from dpcore.fewshot.mechanisms import (
    aggregate,
    check_noise_multiplier,
    noise_seed_sequence,
    noisy_argmax,
    public_top_k,
    restricted_softmax,
)
from dpcore.fewshot.sampling import check_group_sizes, draw_groups
from dpcore.flags import flag
from dpcore.lm.batching import BatchedForward
from dpcore.lm.budget import context_length, fit_group, prompt_budget, truncate_records
from dpcore.names import SAMPLERS, DemoSource, Mechanism, Sampler, check_mechanism

log = logging.getLogger(__name__)

STOP_EOS = "eos"
STOP_STRING = "stop_string"
STOP_MAX_TOKENS = "max_tokens"

Forward = Callable[[list[list[int]]], torch.Tensor]
PUBLIC_PASS = ("public",)  # pass key of the public prompts (labels are strings: never equal to it)
Progress = Callable[[dict], None]


@dataclass(frozen=True)
class Demo:
    """One synthetic demonstration (a DP output: safe to show, log and release).

    `tokens` counts the generated token ids kept (an end token is not kept; a token that
    completed the stop string is counted although the text stops before the stop string).
    `noise_multiplier` is inf for instruction-only demos (no private data: epsilon = 0).
    """

    label: str
    shot: int
    text: str
    tokens: int
    stop_reason: str  # "eos" | "stop_string" | "max_tokens"
    noise_multiplier: float
    num_subsets: int
    subset_size: int
    top_k: int
    rvp: bool
    max_tokens: int
    mechanism: Mechanism
    model: str
    seeded_noise: bool
    method: DemoSource  # never "zero-shot": a zero-shot prompt has no demonstration
    sampler: Sampler = "poisson"


DEMO_COLUMNS = tuple(f.name for f in fields(Demo))


# Counters that are a function of the DP outputs and the configuration only: safe to publish.
PUBLIC_STATS = ("steps", "synthetic_tokens", "demos")


@dataclass(frozen=True)
class GenerationResult:
    """`stats`: public counters (`PUBLIC_STATS`). `private_stats`: counters that depend on the
    private records (prompt and forward tokens, padding, prompts, timings, throughput); they
    belong in the private store or in a benchmark's own output, never in a public file or log."""

    demos: list[Demo]
    seeded_noise: bool
    stats: dict = field(default_factory=dict)
    private_stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class GenerationState:
    """Where a `generate_demos` call stands after its last finished token step (`step`; 0: before the first
    draw). `streams`: per (label, shot), in the call's order, its generated token ids, text and stop reason
    (the DP output of the finished steps) and the bit-generator states of its sampling and noise streams.
    Private: the generator states predict every later draw."""

    step: int
    streams: tuple[dict, ...]

    def to_dict(self) -> dict:
        return {"step": int(self.step), "streams": [dict(s) for s in self.streams]}

    @classmethod
    def from_dict(cls, data: dict) -> GenerationState:
        return cls(step=int(data["step"]), streams=tuple(dict(s) for s in data["streams"]))

    @property
    def finished(self) -> bool:
        """Every demonstration has stopped: nothing is left to draw."""
        return all(s.get("stop_reason") for s in self.streams)


Checkpoint = Callable[[GenerationState], None]


# --------------------------------------------------------------------------- random streams


def _label_key(label: str) -> int:
    return int.from_bytes(hashlib.sha256(label.encode("utf-8")).digest()[:8], "little")


def stream_generators(root: np.random.SeedSequence, label: str, shot: int) -> tuple[np.random.Generator, ...]:
    """(sampling rng, noise rng) of one (label, shot): a function of the root seed, label and shot only."""
    child = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, _label_key(label), int(shot)))
    sampling, noise = child.spawn(2)
    return np.random.Generator(np.random.PCG64DXSM(sampling)), np.random.Generator(np.random.PCG64DXSM(noise))


# --------------------------------------------------------------------------- validation


def validate_generation(config: GenerationConfig, noise_multiplier: float, vocab_size: int,
                        label_counts: dict[str, int] | None = None) -> None:
    """ConfigError naming the parameter for anything Algorithm 1 cannot run with."""
    check_group_sizes(config.num_subsets, config.subset_size)
    if int(config.max_tokens) != config.max_tokens or config.max_tokens < 1:
        raise ConfigError(f"{flag('max_tokens')} (T_max) must be an integer >= 1, got {config.max_tokens!r}")
    if int(config.demos_per_label) != config.demos_per_label or config.demos_per_label < 1:
        raise ConfigError(f"demos_per_label must be an integer >= 1, got {config.demos_per_label!r}")
    if config.rvp and (int(config.top_k) != config.top_k or not 1 <= config.top_k <= vocab_size):
        raise ConfigError(f"{flag('top_k')} (K) must be an integer in [1, {vocab_size}] (the model's vocabulary), "
                          f"got {config.top_k!r}")
    check_mechanism(config.mechanism)
    if config.sampler not in SAMPLERS:
        raise ConfigError(f"sampler must be one of {', '.join(SAMPLERS)}, got {config.sampler!r}")
    check_noise_multiplier(noise_multiplier)
    needed = config.num_subsets * config.subset_size
    for label, count in (label_counts or {}).items():
        if count < config.subset_size:
            raise ConfigError(f"label {label!r} has {count} private records, fewer than {flag('subset_size')} "
                              f"(N) = {config.subset_size}")
        if needed > count:
            raise ConfigError(
                f"label {label!r}: sampling rate q = M*N/records = {needed}/{count} > 1; lower "
                f"{flag('num_subsets')} (M) or {flag('subset_size')} (N)"
            )


def _check_labels(labels: Sequence[str] | None, available: Sequence[str]) -> list[str]:
    chosen = list(available) if labels is None else list(labels)
    if not chosen:
        raise ConfigError("labels: no label to generate for")
    missing = [label for label in chosen if label not in available]
    if missing:
        raise ConfigError(f"labels: {', '.join(map(repr, missing))} not among the dataset's labels "
                          f"({', '.join(map(repr, available))})")
    if len(set(chosen)) != len(chosen):
        raise ConfigError("labels: a label is listed twice")
    return chosen


# --------------------------------------------------------------------------- the engine


@dataclass
class _Stream:
    """One (label, shot) being generated. `records` are private texts: never logged."""

    label: str
    shot: int
    public_prefix: list[int]
    sample_rng: np.random.Generator
    noise_rng: np.random.Generator
    records: list[str] = field(default_factory=list, repr=False)
    generated: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)


class _Engine:
    """The token loop shared by DP generation and instruction-only generation."""

    def __init__(self, lm, spec, config: GenerationConfig, forward: Forward | None, progress: Progress | None,
                 prefetch: bool | None = None):
        self.lm = lm
        device = getattr(lm, "device", None)
        self.prefetch = (getattr(device, "type", "cpu") == "cuda") if prefetch is None else bool(prefetch)
        self.spec = spec
        self.config = config
        self.forward = forward if forward is not None else BatchedForward(lm)
        self.progress = progress
        self.stop = spec.generation.stop or ""
        self.max_positions = context_length(lm)
        # A group prompt (before its generated text) may hold this many tokens; 0: no limit.
        self.prompt_limit = max(self.max_positions - int(config.max_tokens), 1) if self.max_positions else 0
        self.stats = {"steps": 0, "synthetic_tokens": 0}  # public (PUBLIC_STATS)
        # Depend on the sampled records (their number and lengths): private.
        self.private_stats = {"prompts": 0, "prompt_tokens": 0, "forward_seconds": 0.0, "tokenize_seconds": 0.0,
                              "mechanism_seconds": 0.0}

    def _group_prompts(self, active: list[_Stream]) -> tuple[list[list[int]], list[int]]:
        """Lines 3-6 for one step: a fresh sample per (label, shot), split into M groups, and each
        non-empty group's prompt PB(instruction, its records, y) tokenised (without the text
        generated so far, which the caller appends). Returns (prompt ids, owning index in `active`).

        Touches only each stream's own sampling generator, so it may run one step ahead in a
        background thread (see `run`) and draw exactly what it would have drawn in line."""
        config = self.config
        texts, owners, members = [], [], []
        for index, stream in enumerate(active):
            groups = draw_groups(config.sampler, len(stream.records), config.num_subsets, config.subset_size,
                                 stream.sample_rng)
            for group in groups:
                if group.size:
                    records = [stream.records[i] for i in group]
                    texts.append(self.spec.generation.build(stream.label, records))
                    owners.append(index)
                    members.append(records)
        began = time.perf_counter()
        ids = self.lm.encode_batch(texts)
        if self.prompt_limit:  # a Poisson group larger than N may not fit: keep its first records that do
            for row, prompt in enumerate(ids):
                if len(prompt) > self.prompt_limit:
                    label = active[owners[row]].label
                    ids[row] = fit_group(lambda group, label=label: self.spec.generation.build(label, group),
                                         self.lm.encode, members[row], self.prompt_limit, prompt)
        self.private_stats["tokenize_seconds"] += time.perf_counter() - began
        return ids, owners

    def _forward(self, prompts: list[list[int]], passes: list) -> torch.Tensor:
        """The step's logits, the public prompts and each label's group prompts in separate passes.

        Why per label on every device, CPU fp32 included: a row's logits are not guaranteed to be
        a function of that row alone when rows share a call. BLAS libraries (oneDNN/MKL/OpenBLAS
        on CPU, cuBLAS on GPU) pick kernels, blockings and split reductions by matrix shape, so
        the total packed length of a micro-batch, the shared cached prefix length (the longest
        prefix common to every prompt of the pass) and the padded width (non-Llama models) can
        all change the rounding of every row, and all three depend on the private records in the
        call. A public top-K set computed next to private prompts would be a (rounding-level)
        function of private data, and one label's sum a function of another label's records,
        which the parallel composition over labels does not account for. Measured on CPU in fp32
        (tiny model, 4 labels x 10 groups, 20 random draws): one label's logits computed in a
        call with the other labels' prompts differed bitwise from the same prompts alone in 20 of
        20 draws (the shared prefix length changed), so CPU fp32 needs per-label passes too.
        Separate passes make "public" public bit for bit and each label's logits a function of its
        own records only;
        the cost is measured by benchmarks/bench_generation.py (benchmarks/RESULTS.md). Within a
        label, its groups still share passes (they read the same D_y; each group's contribution
        is bounded by the sensitivity argument only up to float rounding, as in any
        floating-point DP implementation).

        A custom `forward` (tests, benchmarks) that does not declare `accepts_passes` gets the
        whole step in one call, as before; the engine's default `BatchedForward` does.
        """
        if getattr(self.forward, "accepts_passes", False):
            return self.forward(prompts, passes=passes)
        return self.forward(prompts)

    def _finish_token(self, stream: _Stream, token: int) -> None:
        """Lines 20-22 plus the stop string and T_max."""
        if token in self.lm.eos_token_ids:
            stream.stop_reason = STOP_EOS
            return
        stream.generated.append(int(token))
        self.stats["synthetic_tokens"] += 1
        text = self.lm.decode(stream.generated)
        if self.stop and self.stop in text:
            stream.text = text.split(self.stop, 1)[0].strip()
            stream.stop_reason = STOP_STRING
            return
        stream.text = text.strip()
        if len(stream.generated) >= self.config.max_tokens:
            stream.stop_reason = STOP_MAX_TOKENS

    def run(self, streams: list[_Stream], choose: Callable[[_Stream, torch.Tensor | None, torch.Tensor], int],
            private: bool, checkpoint: Checkpoint | None = None) -> None:
        """Token steps until every stream stops. `choose(stream, public_logits, group_logits) -> token`.

        Starts after the steps already taken (`stats["steps"]`: a resumed call) and never goes past T_max.
        `checkpoint` gets the `GenerationState` before the first draw and after every finished step, before
        the step's progress report (where a stop request ends the call): a stopped call has kept every step
        it reported.

        With `prefetch` (default on CUDA), the next step's group prompts (sampling and
        tokenisation, which do not depend on the token being chosen) are prepared in a
        background thread while this step's forward pass runs on the GPU; the sampling states a checkpoint
        keeps are those from before that preparation.
        """
        config = self.config
        use_public = config.rvp or not private
        began = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpicl-prompts") \
            if private and self.prefetch else None
        ahead: tuple[list[_Stream], Future] | None = None
        first = int(self.stats["steps"]) + 1
        if checkpoint is not None:
            checkpoint(self.state(streams, first - 1))
        try:
            for step in range(first, config.max_tokens + 1):
                active = [s for s in streams if not s.done]
                if not active:
                    break
                step_began = time.perf_counter()
                if not private:
                    group_ids, owners = [], []
                elif ahead is not None:
                    group_ids, owners = _keep_active(*ahead, active)
                else:
                    group_ids, owners = self._group_prompts(active)
                prompts = [ids + active[owner].generated for ids, owner in zip(group_ids, owners, strict=True)]
                sampling_before = None
                if pool is not None and step < config.max_tokens:
                    sampling_before = [s.sample_rng.bit_generator.state for s in streams]  # before the next draw
                    ahead = (active, pool.submit(self._group_prompts, active))
                else:
                    ahead = None
                group_count = len(prompts)
                passes = [active[owner].label for owner in owners]  # one pass per label's private groups
                if use_public:  # line 8: the public prompt, no private record, in a pass of its own
                    prompts.extend(stream.public_prefix + stream.generated for stream in active)
                    passes.extend([PUBLIC_PASS] * len(active))
                if self.max_positions and any(len(p) > self.max_positions for p in prompts):
                    # Unreachable after `prompt_budget` and `fit_group`; no length in the message (private).
                    raise ConfigError(f"a prompt exceeds the model's context of {self.max_positions} positions: "
                                      f"lower {flag('max_tokens')}, {flag('subset_size')} or "
                                      f"{flag('max_record_tokens')}")
                forward_began = time.perf_counter()
                logits = self._forward(prompts, passes)  # ONE batched call for every active sequence
                forward_seconds = time.perf_counter() - forward_began
                mechanism_began = time.perf_counter()
                # A stream's group prompts are contiguous (built stream by stream): a view, not a copy.
                bounds = np.searchsorted(np.asarray(owners, dtype=np.int64), np.arange(len(active) + 1))
                for index, stream in enumerate(active):
                    group_logits = logits[int(bounds[index]):int(bounds[index + 1])]
                    public_logits = logits[group_count + index] if use_public else None
                    self._finish_token(stream, choose(stream, public_logits, group_logits))
                self.private_stats["mechanism_seconds"] += time.perf_counter() - mechanism_began
                self.stats["steps"] = step
                if checkpoint is not None:  # kept before the step is reported (and a stop request honoured)
                    checkpoint(self.state(streams, step, sampling_before))
                self._record_step(step, streams, active, prompts, forward_seconds, step_began, began)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        for stream in streams:  # unreachable in practice: the T_max check stops every stream
            if not stream.done:
                stream.stop_reason = STOP_MAX_TOKENS
        wall = time.perf_counter() - began
        private = self.private_stats
        private["wall_seconds"] = wall
        # Prompt tokens served per second of forward time (cached prefix tokens count as served).
        private["forward_tokens_per_s"] = (private["prompt_tokens"] / private["forward_seconds"]
                                           if private["forward_seconds"] else 0.0)
        private["synthetic_tokens_per_s"] = self.stats["synthetic_tokens"] / wall if wall else 0.0
        batch_stats = getattr(self.forward, "stats", None)
        if batch_stats is not None and hasattr(batch_stats, "as_dict"):
            private["batching"] = batch_stats.as_dict()

    def state(self, streams: list[_Stream], step: int, sampling: list[dict] | None = None) -> GenerationState:
        """The `GenerationState` after `step` finished steps (`sampling`: the sampling generators' states, when
        read before a prefetch moved them on)."""
        return GenerationState(step=int(step), streams=tuple(
            {"label": s.label, "shot": int(s.shot), "generated": [int(t) for t in s.generated], "text": s.text,
             "stop_reason": s.stop_reason,
             "sampling": sampling[i] if sampling is not None else s.sample_rng.bit_generator.state,
             "noise": s.noise_rng.bit_generator.state}
            for i, s in enumerate(streams)))

    def restore(self, streams: list[_Stream], state: GenerationState) -> None:
        """Continue from `state`: each stream's generated tokens, text, stop reason and generator states, and
        the step count (the steps taken stay counted against T_max)."""
        if not 0 <= state.step <= self.config.max_tokens:
            raise ConfigError(f"resume: the kept generation state is at step {state.step}, outside the "
                              f"{flag('max_tokens')} = {self.config.max_tokens} steps of this call")
        kept = [(str(s["label"]), int(s["shot"])) for s in state.streams]
        if kept != [(s.label, s.shot) for s in streams]:
            raise ConfigError("resume: the kept generation state is for other labels or shots than this call")
        for stream, saved in zip(streams, state.streams, strict=True):
            stream.generated = [int(t) for t in saved["generated"]]
            if len(stream.generated) > state.step:
                raise ConfigError("resume: the kept generation state holds more tokens than steps")
            stream.text = str(saved["text"])
            stream.stop_reason = str(saved["stop_reason"])
            stream.sample_rng.bit_generator.state = saved["sampling"]
            stream.noise_rng.bit_generator.state = saved["noise"]
        self.stats["steps"] = int(state.step)
        self.stats["synthetic_tokens"] = sum(len(s.generated) for s in streams)

    def _record_step(self, step, streams, active, prompts, forward_seconds, step_began, began) -> None:
        """Counters, the log line and the progress callback of one step.

        The log line and the top level of the progress dict are public (step, sequences, demos
        finished); prompt counts, prompt tokens and timings depend on the sampled records and go
        to `private_stats` and the progress dict's `"private"` entry only."""
        config = self.config
        tokens = sum(len(p) for p in prompts)
        self.stats["steps"] = step
        self.private_stats["prompts"] += len(prompts)
        self.private_stats["prompt_tokens"] += tokens
        self.private_stats["forward_seconds"] += forward_seconds
        info = {
            "step": step, "max_steps": config.max_tokens, "active": len(active),
            "finished": sum(s.done for s in streams), "total": len(streams),
            "private": {
                "prompts": len(prompts), "prompt_tokens": tokens, "step_seconds": time.perf_counter() - step_began,
                "tokens_per_s": tokens / forward_seconds if forward_seconds else 0.0,
                "elapsed_seconds": time.perf_counter() - began,
            },
        }
        # DEBUG: the caller knows what is generated (method, labels, epsilon) and says it once per step
        # through `progress` (a pipeline runs labels in parallel tasks: an unlabelled line is ambiguous).
        log.debug("generation step %d/%d (%s): %d sequences generating, %d/%d demos done", step,
                  config.max_tokens, ", ".join(dict.fromkeys(s.label for s in streams)), len(active),
                  info["finished"], info["total"])
        if self.progress is not None:
            self.progress(info)


def _keep_active(prepared_for: list[_Stream], future: Future, active: list[_Stream]
                 ) -> tuple[list[list[int]], list[int]]:
    """Group prompts prepared one step ahead, less those of streams that stopped since; owners
    re-indexed into `active`."""
    ids_ahead, owners_ahead = future.result()
    position = {id(stream): index for index, stream in enumerate(active)}
    group_ids, owners = [], []
    for ids, owner in zip(ids_ahead, owners_ahead, strict=True):
        index = position.get(id(prepared_for[owner]))
        if index is not None:
            group_ids.append(ids)
            owners.append(index)
    return group_ids, owners


def _model_name(lm) -> str:
    return str(getattr(lm, "name", type(lm).__name__))


def prepare_records(lm, spec, records_by_label: dict[str, list[str]], labels: Sequence[str],
                    config: GenerationConfig) -> dict[str, list[str]]:
    """Where private records enter generation: each record cut to the public token cap.

    The cap is `config.max_record_tokens`, or the largest for which the instruction, N records
    and T_max generated tokens fit the model's context (`dpcore.lm.budget.prompt_budget`, which
    raises a ConfigError naming the parameter when they cannot: call it before the charge).
    A per-record transformation, applied before sampling: the accounting is unchanged.
    """
    budget = prompt_budget(lm.encode, context_length(lm), spec, labels, config)
    return {label: truncate_records(lm, records_by_label[label], budget.record_cap) for label in labels}


def generate_demos(lm, spec, records_by_label: dict[str, list[str]], config: GenerationConfig,
                   noise_multiplier: float, seed: int | None = None, labels: list[str] | None = None,
                   progress: Progress | None = None, *, forward: Forward | None = None,
                   prefetch: bool | None = None, checkpoint: Checkpoint | None = None,
                   resume: GenerationState | None = None,
                   chooser: Callable[[torch.Tensor | None, torch.Tensor, np.random.Generator], int] | None = None,
                   method: str | None = None) -> GenerationResult:
    """Algorithm 1 for every label in `labels` (default: all of `records_by_label`) and
    `config.demos_per_label` shots each, all at once.

    `records_by_label` maps a label to its private texts D_y (never logged). `noise_multiplier`
    is sigma (0: no noise, epsilon = inf, same code path). `seed=None` draws a cryptographic
    seed; an int makes the run reproducible and marks its demos `seeded_noise=True`.
    `forward` overrides the batched forward pass (benchmarks compare a naive one). `prefetch`
    prepares each next step's group prompts in a background thread (default: on CUDA); the
    demos are the same either way. `checkpoint` receives the call's `GenerationState` before its first draw
    and after every finished step; `resume` continues a call from such a state (the same labels, shots and
    configuration), keeping its finished steps and taking only the steps left to T_max.
    `chooser(public_logits, group_logits, noise_rng) -> token` replaces lines 9-19 (RVP, aggregation, arg max)
    for a method with its own private aggregation (a token step its own subsystem defines);
    the sampling, prompts and stopping stay Algorithm 1's, and `noise_multiplier` is then the method's
    (effective) sigma, recorded on the demos. `method` names the demos' source (default: `tang`, or
    `sigma-zero` at sigma 0).
    """
    sigma = check_noise_multiplier(noise_multiplier)
    chosen = _check_labels(labels, list(records_by_label))
    validate_generation(config, sigma, int(lm.vocab_size), {y: len(records_by_label[y]) for y in chosen})
    records = prepare_records(lm, spec, records_by_label, chosen, config)
    root, seeded = noise_seed_sequence(seed)
    engine = _Engine(lm, spec, config, forward, progress, prefetch)
    public = {y: lm.encode(spec.generation.build(y, [])) for y in chosen}
    streams = []
    for label in chosen:
        for shot in range(config.demos_per_label):
            sample_rng, noise_rng = stream_generators(root, label, shot)
            streams.append(_Stream(label, shot, public[label], sample_rng, noise_rng, records=records[label]))
    if resume is not None:
        engine.restore(streams, resume)
    keep_k = int(config.top_k)

    def choose(stream: _Stream, public_logits, group_logits) -> int:
        if chooser is not None:
            return chooser(public_logits, group_logits, stream.noise_rng)
        keep = public_top_k(public_logits, keep_k) if config.rvp else None  # line 9
        probs = restricted_softmax(group_logits, keep)  # lines 6 and 10
        scores = aggregate(config.mechanism, probs, sigma, stream.noise_rng)  # line 12 or 14-15
        return noisy_argmax(scores, keep)  # lines 16-19

    engine.run(streams, choose, private=True, checkpoint=checkpoint)
    method = method or ("sigma-zero" if sigma == 0 else "tang")
    demos = [_demo(stream, lm, config, sigma, seeded, method) for stream in streams]
    return GenerationResult(demos=demos, seeded_noise=seeded, stats={**engine.stats, "demos": len(demos)},
                            private_stats=engine.private_stats)


def instruction_only_demos(lm, spec, labels: list[str], config: GenerationConfig, seed: int | None = None,
                           progress: Progress | None = None, *, forward: Forward | None = None
                           ) -> GenerationResult:
    """epsilon = 0: demonstrations from the public prompt alone (no private record is read).

    Each (label, shot) samples every token from the public prompt's next-token distribution,
    restricted to its top-K when RVP is on (full vocabulary otherwise), with its own random
    stream: shots of one label differ, and a fixed seed reproduces them. (Arg max would make
    every shot of a label identical.) Same stopping rules as `generate_demos`.
    """
    chosen = _check_labels(labels, list(labels))
    validate_generation(config, 0.0, int(lm.vocab_size))
    root, seeded = noise_seed_sequence(seed)
    engine = _Engine(lm, spec, config, forward, progress)
    streams = []
    for label in chosen:
        public = lm.encode(spec.generation.build(label, []))
        for shot in range(config.demos_per_label):
            sample_rng, noise_rng = stream_generators(root, label, shot)
            streams.append(_Stream(label, shot, public, sample_rng, noise_rng))

    def choose(stream: _Stream, public_logits, group_logits) -> int:
        keep = public_top_k(public_logits, int(config.top_k)) if config.rvp else None
        probs = restricted_softmax(public_logits.unsqueeze(0), keep)[0].numpy()
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, stream.noise_rng.random() * cumulative[-1], side="right"))
        index = min(index, len(probs) - 1)
        return int(keep[index]) if keep is not None else index

    engine.run(streams, choose, private=False)
    demos = []
    for stream in streams:
        demo = _demo(stream, lm, config, math.inf, seeded, "instruction-only")
        demos.append(Demo(**{**asdict(demo), "num_subsets": 0, "subset_size": 0}))
    # No private record is read here, but the same split keeps every caller on one rule.
    return GenerationResult(demos=demos, seeded_noise=seeded, stats={**engine.stats, "demos": len(demos)},
                            private_stats=engine.private_stats)


def _demo(stream: _Stream, lm, config: GenerationConfig, sigma: float, seeded: bool, method: str) -> Demo:
    return Demo(
        label=stream.label, shot=stream.shot, text=stream.text, tokens=len(stream.generated),
        stop_reason=stream.stop_reason, noise_multiplier=float(sigma), num_subsets=int(config.num_subsets),
        subset_size=int(config.subset_size), top_k=int(config.top_k), rvp=bool(config.rvp),
        max_tokens=int(config.max_tokens), mechanism=str(config.mechanism), model=_model_name(lm),
        seeded_noise=bool(seeded), method=method, sampler=str(config.sampler),
    )


# --------------------------------------------------------------------------- baselines and tables


def real_demos(records_by_label: dict[str, list[str]], ids_by_label: dict[str, list[str]], labels: list[str],
               per_label: int, rng: np.random.Generator) -> pd.DataFrame:
    """The non-private baseline: `per_label` real records per label, drawn without replacement.

    Returns the PRIVATE table `real_demos` (columns label, shot, id, text, method): the caller
    keeps it under $DPICL_HOME/private (`dpcore.data.artifacts.write_table` enforces this).
    """
    chosen = _check_labels(labels, list(records_by_label))
    if int(per_label) != per_label or per_label < 1:
        raise ConfigError(f"per_label must be an integer >= 1, got {per_label!r}")
    rows = []
    for label in chosen:
        texts, ids = records_by_label[label], ids_by_label.get(label)
        if ids is None or len(ids) != len(texts):
            raise ConfigError(f"ids_by_label[{label!r}] must list one id per record of the label")
        if len(texts) < per_label:
            raise ConfigError(f"label {label!r} has {len(texts)} records, fewer than the {per_label} "
                              "real demonstrations asked for")
        for shot, index in enumerate(rng.choice(len(texts), size=int(per_label), replace=False)):
            rows.append({"label": label, "shot": shot, "id": str(ids[int(index)]), "text": texts[int(index)],
                         "method": "random-real"})
    return pd.DataFrame(rows, columns=["label", "shot", "id", "text", "method"])


def demos_frame(demos: Sequence[Demo]) -> pd.DataFrame:
    """The `demos` table: one row per synthetic demonstration, columns = `Demo` fields."""
    return pd.DataFrame([asdict(d) for d in demos], columns=list(DEMO_COLUMNS))
