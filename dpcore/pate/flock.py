"""The flock engine: every prompt of a flock (PromptPATE's teachers, or candidate student prompts) scores
every query, E x Q x labels scorings, and the votes they cast (Duan et al. Section 4.2, App. D.2).

Speed (the ICL prompt of `dpcore.lm.icl`, the same tokens as `icl.label_logprobs` per prompt):
- each prompt's own prefix (instruction + its demonstrations) runs through the model once
  (`prefix_cache.StackedPrefixes`), whatever the number of queries;
- the queries are batched ACROSS prompts: one forward takes a block of (prompt, query) rows, each
  row continuing its own prompt's cached prefix (rows of different prompts mix in one batch, pad
  slots masked); on a GPU one pass per query block covers the whole prompt block;
- the first label token is read at the query's last position and labels of several tokens continue
  from the cache (`icl.score_labels`); the greedy next token (black-box votes) comes from the same pass.

Votes (`votes`):
- "calibrated" (Section 5.2): argmax of the prompt's contextually calibrated label probabilities
  (Zhao et al. 2021: p / p_cf, p_cf from the content-free inputs in the same prompt);
- "black-box" (App. D.2): only the greedy next token is used; it votes the label whose verbalizer's
  first token it is, and anything else is "other" (class index L).

Everything this module returns about teacher prompts is PRIVATE (a function of private records);
it writes nothing and logs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError
from dpcore.flags import flag
from dpcore.lm import icl
from dpcore.lm.prefix_cache import StackedPrefixes, common_prefix_length

VOTE_MODES = ("calibrated", "black-box")


@dataclass(frozen=True)
class FlockScores:
    """[P, Q, L] label log-probabilities, [P, C, L] the content-free inputs' (C = 0 without calibration),
    [P, Q] greedy next-token ids; P prompts, Q queries, L labels."""

    logprobs: np.ndarray
    content_free: np.ndarray
    greedy: np.ndarray
    seconds: float = 0.0


def flock_scores(lm, spec: TaskSpec, prompts: Sequence[Sequence[icl.DemoItem]], queries: Sequence[str],
                 labels: Sequence[str], *, calibrate: bool = True, max_rows: int = 64, prefix_block: int = 16,
                 progress: Callable[[int, int], None] | None = None) -> FlockScores:
    """Score every (prompt, query) pair; `progress(done, total)` counts (prompt, query) scorings."""
    began = time.perf_counter()
    labels = list(labels)
    label_ids = icl.label_token_ids(lm, spec, labels)
    extra = list(icl.CONTENT_FREE_INPUTS) if calibrate else []
    items = list(queries) + extra
    n_prompts, n_items = len(prompts), len(items)
    logprobs = np.zeros((n_prompts, n_items, len(labels)))
    greedy = np.zeros((n_prompts, n_items), dtype=np.int64)
    if not n_prompts or not n_items:
        return FlockScores(logprobs[:, :len(queries)], logprobs[:, len(queries):], greedy[:, :len(queries)])
    # Each prompt's full contexts; its shared prefix is the longest token prefix of all of them (as
    # icl.label_logprobs does), so the tokens scored are exactly those of one prompt alone.
    prefixes, suffixes = [], []
    for demos in prompts:
        contexts = lm.encode_batch([icl.prompt_text(spec, demos, q) for q in items])
        shared = common_prefix_length(contexts, reserve=1)
        prefixes.append(contexts[0][:shared])
        suffixes.append([ctx[shared:] for ctx in contexts])
    stacked = StackedPrefixes(lm, prefixes, block=prefix_block)
    pairs = [(p, q) for q in range(n_items) for p in range(n_prompts)]
    # similar suffix lengths batch together (little padding)
    pairs.sort(key=lambda pq: len(suffixes[pq[0]][pq[1]]))
    total = len(pairs)
    with torch.inference_mode():
        for start in range(0, total, max_rows):
            block = pairs[start:start + max_rows]
            index = torch.as_tensor([p for p, _ in block], dtype=torch.long, device=lm.device)
            batch, logp = stacked.extend(stacked.start_rows(index), [suffixes[p][q] for p, q in block], keep="last")
            scores = icl.score_labels(stacked, batch, logp, label_ids).cpu().numpy()
            tokens = logp.argmax(dim=-1).cpu().numpy()
            for r, (p, q) in enumerate(block):
                logprobs[p, q] = scores[r]
                greedy[p, q] = tokens[r]
            if progress is not None:
                progress(min(total, start + max_rows), total)
    n = len(queries)
    return FlockScores(logprobs[:, :n], logprobs[:, n:], greedy[:, :n], time.perf_counter() - began)


def flock_scores_naive(lm, spec: TaskSpec, prompts: Sequence[Sequence[icl.DemoItem]], queries: Sequence[str],
                       labels: Sequence[str], *, calibrate: bool = True) -> np.ndarray:
    """The reference: one `icl.label_logprobs` call per prompt (its own prefix cache, no batching across
    prompts). Returns [P, Q + C, L] (the content-free inputs after the queries)."""
    items = list(queries) + (list(icl.CONTENT_FREE_INPUTS) if calibrate else [])
    return np.stack([icl.label_logprobs(lm, spec, demos, items, labels) for demos in prompts]) if prompts \
        else np.zeros((0, len(items), len(labels)))


def calibrated_probs(scores: FlockScores) -> np.ndarray:
    """[P, Q, L] each prompt's calibrated label probabilities (raw ones when no content-free inputs were scored)."""
    probs = icl.normalise_probs(scores.logprobs)
    if scores.content_free.shape[1] == 0:
        return probs
    return np.stack([icl.calibrate_probs(probs[p], icl.normalise_probs(scores.content_free[p]))
                     for p in range(probs.shape[0])])


def verbalizer_first_tokens(lm, spec: TaskSpec, labels: Sequence[str]) -> list[int]:
    """The first token of each label's continuation; black-box votes need them distinct."""
    first = [ids[0] for ids in icl.label_token_ids(lm, spec, labels)]
    if len(set(first)) != len(first):
        raise ConfigError(f"{flag('pate_vote_mode', 'black-box')}: two labels' verbalizers start with the same "
                          f"token, so a single greedy token cannot tell them apart; use "
                          f"{flag('pate_vote_mode', 'calibrated')}")
    return first


def votes(lm, spec: TaskSpec, scores: FlockScores, labels: Sequence[str], mode: str) -> np.ndarray:
    """[P, Q] each prompt's vote: a label index, or L ("other", black-box mode only)."""
    if mode == "calibrated":
        return calibrated_probs(scores).argmax(axis=-1).astype(np.int64)
    if mode == "black-box":
        first = verbalizer_first_tokens(lm, spec, labels)
        lookup = {token: j for j, token in enumerate(first)}
        other = len(labels)
        return np.vectorize(lambda t: lookup.get(int(t), other), otypes=[np.int64])(scores.greedy) \
            if scores.greedy.size else scores.greedy.astype(np.int64)
    raise ConfigError(f"{flag('pate_vote_mode')}: {mode!r} is not one of {', '.join(VOTE_MODES)}")


def ensemble_accuracy(votes_matrix: np.ndarray, gold: np.ndarray, classes: int) -> float:
    """Accuracy of the flock's plurality vote (ties: the lowest class index) against gold label indices
    (Duan et al. Table 2 "Ens. Acc.", epsilon = infinity)."""
    votes_matrix = np.asarray(votes_matrix, dtype=np.int64)
    if votes_matrix.size == 0:
        return float("nan")
    counts = np.zeros((votes_matrix.shape[1], classes), dtype=np.int64)
    for row in votes_matrix:
        counts[np.arange(len(row)), row] += 1
    return float(np.mean(counts.argmax(axis=1) == np.asarray(gold)))


def single_prompt_accuracies(votes_matrix: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """[P] each prompt's accuracy alone; its maximum is Table 2's non-private "Upper Bound" (the best
    single prompt among the E candidates, chosen on the test split)."""
    return (np.asarray(votes_matrix) == np.asarray(gold)[None, :]).mean(axis=1)
