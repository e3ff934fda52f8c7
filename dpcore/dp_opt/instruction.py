"""DP-OPT end to end: a private instruction written from private demonstrations, and its use as a prompt.

`write_instruction` is Hong et al. 2024's private prompt generation (Algorithm 1 with `--tokenwise_gen`, the
authors' `_generate_instruct_bwd_tokwise` + `ensemble_generate`) for J candidates, then (J > 1) the private choice
of one on a disjoint holdout (their `Evaluator.find_best_instruct` with `ExpMechanism`):

    for each candidate j = 1..J:
        for t = 1..T:
            subsets = Poisson sample (rate q) of the generation records, keyed partition into M  (`sampling`)
            votes = each non-empty subset's next token after the tokens released so far         (`ensemble`)
            token = noisy argmax of the vote histogram, noise scale 2 sigma                       (`selection`)
            stop at end-of-text or a newline, else release the token
    keep the candidate with the noisy-argmax number of correct zero-shot holdout predictions   (`selection`)

Only DP outputs leave: the released tokens (hence the candidate texts, their lengths and stop reasons) and the
index of the kept candidate; never a vote, a count, a sample size or a record. The instruction is then used on any
model as a zero-shot prompt prefix (`instruction_spec`, `classify`): post-processing, no further cost.

Records: `records_by_label` maps a label to its records, each (id, text) or a text alone (its id is then its
content id, `dpcore.data.datasets.content_ids`): ids, never positions, decide sampling, subsets and holdout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dpcore.data.datasets import content_ids
from dpcore.data.splits import split_key
from dpcore.data.taskspec import TaskSpec
from dpcore.dp_opt.ensemble import subset_votes
from dpcore.dp_opt.presets import DpOptParams
from dpcore.dp_opt.sampling import holdout_mask, sampling_rate, step_subsets
from dpcore.dp_opt.selection import private_candidate, private_token, stops
from dpcore.errors import ConfigError, stop_if_requested
from dpcore.lm.budget import truncate_records
from dpcore.lm.icl import label_logprobs

HOLDOUT_KEY = split_key(0, "dp-opt-holdout")  # public: the split is a public rule, read one record at a time


def flatten_records(records_by_label: Mapping[str, Sequence]) -> list[tuple[str, str, str]]:
    """(id, text, label) of every record (PRIVATE); a bare text gets its content id."""
    out: list[tuple[str, str, str]] = []
    for label, records in records_by_label.items():
        texts = [r for r in records if isinstance(r, str)]
        ids = iter(content_ids("dp-opt", texts, [str(label)] * len(texts)))
        for record in records:
            if isinstance(record, str):
                out.append((next(ids), record, str(label)))
            else:
                rid, text = record
                out.append((str(rid), str(text), str(label)))
    if len({rid for rid, _, _ in out}) != len(out):
        raise ConfigError("dp-opt: record ids must be unique")
    return out


def split_records(records: Sequence[tuple[str, str, str]], params: DpOptParams
                  ) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(generation records, holdout records): with one candidate every record writes; with several, a keyed-hash
    `holdout_fraction` scores the candidates. Public key, so a plan can count the generation records first."""
    if params.candidates == 1 or not records:
        return list(records), []
    mask = holdout_mask([rid for rid, _, _ in records], params.holdout_fraction, HOLDOUT_KEY)
    return ([r for r, m in zip(records, mask, strict=True) if not m],
            [r for r, m in zip(records, mask, strict=True) if m])


def generation_record_count(records_by_label: Mapping[str, Sequence], params: DpOptParams) -> int:
    """n for the plan's q = M k / n: how many records write the instruction (the holdout excluded)."""
    return len(split_records(flatten_records(records_by_label), params)[0])


def instruction_spec(spec: TaskSpec, instruction: str) -> TaskSpec:
    """The task with the instruction in front of its ICL prompt (`TaskSpec.icl.instruction`)."""
    return spec.model_copy(update={"icl": spec.icl.model_copy(update={"instruction": instruction.strip()})})


def classify(lm, spec: TaskSpec, instruction: str, queries: Sequence[str], batch_size: int = 16,
             should_stop: Callable[[], bool] | None = None) -> list[str]:
    """Zero-shot predictions with the instruction as the prompt prefix (raw label scores, as the authors'
    evaluator): `dpcore.lm.icl.label_logprobs` with no demonstration. `should_stop` is asked after every batch
    (`RunStopped` when it says so)."""
    labels = spec.label_names
    scores = label_logprobs(lm, instruction_spec(spec, instruction), [], list(queries), labels, batch_size,
                            progress=lambda done: stop_if_requested(should_stop, "dp-opt: scoring the candidates"))
    return [labels[int(i)] for i in np.argmax(scores, axis=1)] if len(queries) else []


def _candidate(lm, spec: TaskSpec, generation: list[tuple[str, str, str]], params: DpOptParams, rate: float,
               rng: np.random.Generator, step_done: Callable[[int], None],
               kept: Callable[[list[int], int, bool], None] | None = None,
               released: Sequence[int] = (), start: int = 0) -> tuple[str, int, str]:
    """One candidate instruction: (text, tokens released, why it stopped); `step_done(step)` after each token.
    `kept(released, step, stopped)` gets the released tokens after each finished step, before it is reported;
    `released` and `start` continue a candidate after its step `start`."""
    by_id = {rid: (text, label) for rid, text, label in generation}
    ids = list(by_id)
    released = [int(t) for t in released]
    for step in range(start, params.max_tokens):
        subsets = step_subsets(ids, params.subsets, params.shots, rate, rng)
        votes = subset_votes(lm, spec, [[by_id[r] for r in s] for s in subsets], released, params.temperature, rng,
                             ban_end=step < params.min_tokens)
        token = private_token(votes, int(lm.vocab_size), params.noise_multiplier, rng, params.noise)
        stopped = stops(token, lm.decode([token]), lm.eos_token_ids)
        if not stopped:
            released.append(token)
        if kept is not None:
            kept(released, step + 1, stopped)
        step_done(step + 1)
        if stopped:
            return lm.decode(released).strip(), len(released), "stop-token"
    return lm.decode(released).strip(), len(released), "max-tokens"


def write_instruction(lm, spec: TaskSpec, records_by_label: Mapping[str, Sequence], params: DpOptParams,
                      rng: np.random.Generator, progress: Callable[[int, int], None] | None = None,
                      should_stop: Callable[[], bool] | None = None,
                      checkpoint: Callable[[dict], None] | None = None,
                      resume: dict | None = None) -> tuple[str, dict]:
    """The private instruction and its public stats (every entry a DP output or a public parameter).

    `params` carries the plan's noise multipliers (`dpcore.dp_opt.privacy.planned_params`); sigma = 0 runs the
    same code without noise (the non-private reference). All randomness comes from `rng`. `progress(done,
    total)` after each token step, over every candidate's T steps (public counts; a candidate that stops early
    completes its steps); `should_stop` is asked after every token and every scoring batch.

    Stopping and resuming: `checkpoint(state)` gets, after every finished token step and before it is reported
    (so before a stop request ends the call), the finished candidates, the current one's released tokens and
    step (DP outputs: every step draws a fresh Poisson sample and fresh noise) and `rng`'s state (PRIVATE: it
    predicts every later draw). `resume=state` continues after that step with `rng` set to the kept state: no
    step is drawn twice, and the instruction is the one an unstopped call would have written."""
    total = params.candidates * params.max_tokens
    if resume is not None:
        rng.bit_generator.state = resume["rng"]

    def token_done(candidate: int, step: int) -> None:
        stop_if_requested(should_stop, "dp-opt: writing the instruction")
        if progress is not None:
            progress(candidate * params.max_tokens + step, total)

    records = flatten_records(records_by_label)
    records = [(rid, text, label) for (rid, _, label), text in
               zip(records, truncate_records(lm, [t for _, t, _ in records], params.max_record_tokens), strict=True)]
    generation, holdout = split_records(records, params)
    rate = sampling_rate(params.subsets, params.shots, len(generation))
    if params.candidates > 1 and params.selection_noise_multiplier == 0 and params.noise_multiplier > 0:
        raise ConfigError("dp-opt: several candidates need the plan's selection_noise_multiplier")
    candidates = [tuple(c) for c in (resume or {}).get("candidates", [])]
    current = (resume or {}).get("current") or {"released": [], "step": 0}

    def kept(released: list[int], step: int, stopped: bool) -> None:
        if checkpoint is None:
            return
        ended = stopped or step == params.max_tokens
        finished = [list(c) for c in candidates]
        if ended:  # the candidate as `_candidate` returns it
            finished.append([lm.decode(released).strip(), len(released), "stop-token" if stopped else "max-tokens"])
        checkpoint({"candidates": finished, "current": None if ended else {"released": list(released), "step": step},
                    "rng": rng.bit_generator.state})

    for j in range(len(candidates), params.candidates):
        start = current if j == len((resume or {}).get("candidates", [])) else {"released": [], "step": 0}
        candidates.append(_candidate(lm, spec, generation, params, rate, rng, lambda step, j=j: token_done(j, step),
                                     kept, start["released"], int(start["step"])))
        if progress is not None:
            progress((j + 1) * params.max_tokens, total)
    chosen = 0
    if params.candidates > 1:
        queries = [text for _, text, _ in holdout]
        gold = [label for _, _, label in holdout]
        correct = [sum(p == g for p, g in zip(classify(lm, spec, text, queries, should_stop=should_stop), gold,
                                              strict=True))
                   for text, _, _ in candidates]
        chosen = private_candidate(correct, params.selection_noise_multiplier, rng)
    stats = {"method": "dp-opt", "candidates": [c[0] for c in candidates], "tokens": [c[1] for c in candidates],
             "stopped": [c[2] for c in candidates], "chosen": chosen, "noise_multiplier": params.noise_multiplier,
             "selection_noise_multiplier": params.selection_noise_multiplier, "sampling_rate": rate,
             "steps_planned": params.steps, "steps_used": sum(c[1] + (c[2] == "stop-token") for c in candidates),
             "subsets": params.subsets, "shots": params.shots, "noise": params.noise}
    return candidates[chosen][0], stats
