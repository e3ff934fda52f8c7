"""Membership-inference attack scores against an ICL prompt (one idea: what each attack computes).

A candidate record (x, y) is scored against the prompt under audit P (its demonstrations),
a reference prompt P0 with no demonstration (the task's instruction only: the record's
own difficulty), and R reference prompts built from records that are NOT candidates (the
OUT prompts of an offline likelihood-ratio test). Two raw quantities per (prompt, record),
both from ONE forward pass over the query with the prompt's prefix KV cache:

- label: log p(y | P, x), normalised over the task's labels (Duan et al. 2023, Section 3);
- text:  log p(x | P), the summed log-probability of the record's own tokens in the query
  position. A demonstration that IS the record puts a verbatim copy of x in the context,
  and a small LM copies: this is the strongest signal a prompt leaks.

The attacks (higher score = "member"):

- `duan`: p(y | P, x), the paper's score (kept for comparison with its figures).
- `label-calibrated`, `text-calibrated`: difficulty calibration (Watson et al. 2022): the
  score under P minus the same record's score under P0. A record that is easy for the
  model anyway no longer looks like a member.
- `lira-label`, `lira-text`: offline LiRA (Carlini et al. 2022, Section IV-D / the
  "offline" variant): the record's score under each OUT prompt is a sample of its score
  when it is not in the prompt; a Gaussian N(mu_x, sigma^2) is fitted (mu_x per record,
  sigma^2 pooled over records: the paper's "global variance", recommended for few OUT
  models, or per record), and the one-sided test is Pr[Z <= s(P)] = Phi(z) with
  z = (s(P) - mu_x) / sigma. The score returned is z (the same ranking as Phi(z), without
  saturating at 1.0). The label score enters through its logit, log p / (1 - p) (the
  paper's logit scaling).

Pure functions: the model passes are in `prompt_scores`; everything else is numpy. Nothing
here keeps a record's text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError, DataValidationError, stop_if_requested
from dpcore.flags import flag

ATTACKS: tuple[str, ...] = ("duan", "label-calibrated", "text-calibrated", "lira-label", "lira-text")
CALIBRATED_ATTACKS: tuple[str, ...] = ("duan", "label-calibrated", "text-calibrated")
PER_EXAMPLE_VARIANCE_MIN_REFERENCES = 16  # below this many OUT prompts LiRA uses the pooled (global) variance


def attacks_run(reference_prompts: int) -> tuple[str, ...]:
    """The attacks an audit runs: LiRA needs at least 2 OUT prompts (the default, 0, runs the three calibrated
    attacks: 2 forward passes per record instead of 2 + R, and fewer records for the same band)."""
    return ATTACKS if reference_prompts >= 2 else CALIBRATED_ATTACKS


def passes_per_record(reference_prompts: int) -> int:
    """Forward passes an audit spends on each (record, prompt under audit) pair: the prompt under audit, the
    no-demonstration reference and, with LiRA, each OUT prompt."""
    return 2 + (reference_prompts if reference_prompts >= 2 else 0)


@dataclass(frozen=True)
class PromptScores:
    """The raw scores of n records under one prompt."""

    label_logprob: np.ndarray  # [n] log p(y | prompt, x), normalised over the task's labels
    label_logit: np.ndarray  # [n] log p(y) - log(1 - p(y)) of the same distribution
    text_logprob: np.ndarray  # [n] sum over x's tokens of log p(token | prompt, earlier tokens)

    def __len__(self) -> int:
        return len(self.text_logprob)

    @classmethod
    def stack(cls, items: Sequence[PromptScores]) -> PromptScores:
        """[n, R] arrays: the same n records under R prompts (the OUT scores)."""
        return cls(np.stack([s.label_logprob for s in items], axis=1),
                   np.stack([s.label_logit for s in items], axis=1),
                   np.stack([s.text_logprob for s in items], axis=1))

    def take(self, rows) -> PromptScores:
        rows = np.asarray(rows, dtype=np.int64)
        return PromptScores(self.label_logprob[rows], self.label_logit[rows], self.text_logprob[rows])


# =========================================================================== the model pass


def _text_span(spec: TaskSpec, demos: Sequence[tuple], text: str) -> tuple[str, int, int]:
    """The prompt text and the character span of the record's text inside it."""
    from dpcore.lm.icl import prefix_text

    prefix = prefix_text(spec, demos)
    marker = "\x00"
    before = spec.icl.query(marker).split(marker, 1)[0]
    start = len(prefix) + len(before)
    return prefix + spec.icl.query(text), start, start + len(text)


def _encode_with_span(lm, prompt: str, start: int, end: int) -> tuple[list[int], int, int]:
    """Token ids of the prompt and the token range [first, last) whose characters overlap [start, end)."""
    encoded = lm.tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    inside = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < end and b > start and b > a]
    if end <= start or not inside:
        return ids, len(ids), len(ids)  # an empty text has no tokens of its own
    return ids, inside[0], inside[-1] + 1


def prompt_scores(lm, spec: TaskSpec, demos: Sequence[tuple], texts: Sequence[str], labels: Sequence[str],
                  batch_size: int = 16, past=None, should_stop: Callable[[], bool] | None = None) -> PromptScores:
    """Label and text log-probabilities of each record (x, y) under the prompt `demos`: one pass.

    The prompt's shared prefix (instruction + demonstrations) runs once (`dpcore.lm.prefix_cache.PrefixCache`),
    cut at least one token before the first record token so every record token is predicted
    inside the batch. Per batch, the query tokens run once, with the vocabulary head at the positions
    read only: those predicting the record's tokens give the text log-probability, the last position
    the first token of every label; labels of several tokens continue from the cache (as `icl.label_logprobs`,
    whose scores these equal). `past`: a trained prompt's per-layer cache
    (`dpcore.dpsgd.soft_prompt.TrainablePrompt.cache_layers`) before the text prompt, as in
    `icl.label_logprobs(past=...)`: the scores of a PromptDPSGD prompt. `should_stop()` is asked before
    every batched forward pass: True ends the scoring with `RunStopped` (a clean stop within one pass).
    """
    from dpcore.lm.icl import label_token_ids
    from dpcore.lm.prefix_cache import PrefixCache, common_prefix_length

    if spec.kind != "classification":
        raise ConfigError(f"audit: task {spec.name!r} is {spec.kind}; the membership attacks score class labels")
    label_names = spec.label_names
    index = {name: i for i, name in enumerate(label_names)}
    unknown = sorted(set(map(str, labels)) - set(index))
    if unknown:
        raise DataValidationError(f"audit: label(s) {', '.join(unknown)} are not labels of task {spec.name!r}")
    n = len(texts)
    if n == 0:
        empty = np.zeros(0)
        return PromptScores(empty, empty, empty)
    label_ids = label_token_ids(lm, spec, label_names)
    encoded = [_encode_with_span(lm, *_text_span(spec, demos, str(text))) for text in texts]
    contexts = [e[0] for e in encoded]
    shared = common_prefix_length(contexts, reserve=1)
    shared = max(0, min([shared] + [e[1] - 1 for e in encoded]))
    prefix = PrefixCache(lm, contexts[0][:shared], past=past)
    first = torch.as_tensor([ids[0] for ids in label_ids], dtype=torch.long, device=lm.device)
    multi = [j for j, ids in enumerate(label_ids) if len(ids) > 1]
    label_lp = np.zeros((n, len(label_names)))
    text_lp = np.zeros(n)
    order = sorted(range(n), key=lambda i: len(contexts[i]))
    with torch.inference_mode():
        for begin in range(0, n, batch_size):
            stop_if_requested(should_stop, "the audit")
            items = order[begin:begin + batch_size]
            suffixes = [contexts[i][shared:] for i in items]
            # Log-probabilities at the positions read only: those predicting the record's tokens (token t,
            # absolute, is predicted at relative position t - shared - 1) and the last (the label's first).
            wanted = torch.zeros((len(items), max(1, max(len(s) for s in suffixes))), dtype=torch.bool)
            for b, i in enumerate(items):
                _, lo, hi = encoded[i]
                wanted[b, lo - shared - 1:hi - shared - 1] = True
                wanted[b, len(suffixes[b]) - 1] = True
            row_of = (wanted.flatten().cumsum(0) - 1).view(wanted.shape).to(lm.device)  # [B, W] -> row of logp
            batch, logp = prefix.extend(prefix.start(len(items)), suffixes, keep=wanted)  # [N, V]
            for b, i in enumerate(items):
                _, lo, hi = encoded[i]
                if hi > lo:
                    steps = row_of[b, lo - shared - 1:hi - shared - 1]
                    target = torch.as_tensor(contexts[i][lo:hi], dtype=torch.long, device=lm.device)
                    text_lp[i] = float(logp[steps, target].double().sum())
                label_lp[i] = logp[row_of[b, len(suffixes[b]) - 1], first].double().cpu().numpy()
            del logp
            if multi:
                rows = torch.as_tensor([b for b in range(len(items)) for _ in multi], dtype=torch.long,
                                       device=lm.device)
                cont_batch = PrefixCache.select(batch, rows, lm.model.config)
                del batch
                _, cont = prefix.extend(cont_batch, [label_ids[j][:-1] for _ in items for j in multi], keep="all")
                for r in range(len(rows)):
                    b, j = divmod(r, len(multi))
                    tail = label_ids[multi[j]][1:]
                    steps = torch.arange(len(tail), device=lm.device)
                    target = torch.as_tensor(tail, dtype=torch.long, device=lm.device)
                    label_lp[items[b], multi[j]] += float(cont[r, steps, target].double().sum())
    rows = np.arange(n)
    true = np.array([index[str(y)] for y in labels])
    log_norm = label_lp - label_lp.max(axis=1, keepdims=True)
    log_norm = log_norm - np.log(np.exp(log_norm).sum(axis=1, keepdims=True))
    label_logprob = log_norm[rows, true]
    others = log_norm.copy()
    others[rows, true] = -np.inf
    rest = np.logaddexp.reduce(others, axis=1)  # log(1 - p(y)), computed without cancellation
    return PromptScores(label_logprob, label_logprob - rest, text_lp)


# =========================================================================== the attacks (numpy)


def calibrated_score(target, reference) -> np.ndarray:
    """Difficulty calibration (Watson et al. 2022): the record's score under the prompt under audit
    minus its score under the reference prompt (no demonstration)."""
    target = np.asarray(target, dtype=float)
    reference = np.asarray(reference, dtype=float)
    if target.shape != reference.shape:
        raise ConfigError(f"calibrated_score: {target.shape} target scores but {reference.shape} references")
    return target - reference


def lira_offline(target, out_scores, per_example_variance: bool | None = None,
                 min_std: float = 1e-6) -> np.ndarray:
    """Offline LiRA (Carlini et al. 2022): z = (target - mu_x) / sigma against each record's OUT scores.

    `out_scores` [n, R]: the n records' scores under R prompts that do not hold them. mu_x is
    the mean of a record's R OUT scores; sigma is the record's own sample standard deviation
    (`per_example_variance`) or the pooled one, sqrt(mean_x var_x) (the global variance, the
    paper's choice for few OUT models); default: per record from
    `PER_EXAMPLE_VARIANCE_MIN_REFERENCES` OUT prompts on. The one-sided likelihood-ratio
    test rejects "OUT" for large Phi(z); z is returned (same order, no saturation). Needs R >= 2.
    """
    target = np.asarray(target, dtype=float).ravel()
    out = np.asarray(out_scores, dtype=float)
    if out.ndim != 2 or out.shape[0] != len(target):
        raise ConfigError(f"lira_offline: OUT scores must be [n, R] for {len(target)} records, got {out.shape}")
    references = out.shape[1]
    if references < 2:
        raise ConfigError(f"lira_offline: needs at least 2 OUT scores per record to fit a variance, got {references}")
    if per_example_variance is None:
        per_example_variance = references >= PER_EXAMPLE_VARIANCE_MIN_REFERENCES
    mean = out.mean(axis=1)
    variance = out.var(axis=1, ddof=1)
    if per_example_variance:
        std = np.sqrt(variance)
    else:
        std = np.full(len(target), np.sqrt(variance.mean()) if len(target) else 0.0)
    return (target - mean) / np.maximum(std, min_std)


def attack_scores(target: PromptScores, reference: PromptScores, out: PromptScores | None,
                  per_example_variance: bool | None = None) -> dict[str, np.ndarray]:
    """Every attack's score (higher = member) for n records.

    `target`: the records under the prompt under audit; `reference`: under the no-demonstration
    prompt; `out`: `PromptScores.stack` of the records under R >= 2 OUT prompts (None: no
    LiRA scores). Returns {attack name: [n] scores}, in `ATTACKS` order.
    """
    scores = {
        "duan": np.exp(target.label_logprob),
        "label-calibrated": calibrated_score(target.label_logprob, reference.label_logprob),
        "text-calibrated": calibrated_score(target.text_logprob, reference.text_logprob),
    }
    if out is not None:
        scores["lira-label"] = lira_offline(target.label_logit, out.label_logit, per_example_variance)
        scores["lira-text"] = lira_offline(target.text_logprob, out.text_logprob, per_example_variance)
    return scores


# =========================================================================== reference passes


@dataclass(frozen=True)
class References:
    """Records' scores under the no-demonstration prompt and under R OUT prompts (None when R < 2)."""

    zero: PromptScores
    out: PromptScores | None  # arrays [n, R]

    def take(self, rows) -> References:
        return References(self.zero.take(rows), None if self.out is None else self.out.take(rows))


def reference_scores(lm, spec: TaskSpec, texts: Sequence[str], labels: Sequence[str],
                     out_demos: Sequence[tuple], batch_size: int = 16, cache: dict | None = None,
                     should_stop: Callable[[], bool] | None = None) -> References:
    """The record-level references of every attack: one pass with no demonstration (the task's
    instruction only) and, with 2 or more `out_demos` (records that are not candidates), one pass per OUT
    prompt (a 1-shot prompt of each). `cache` (a dict the caller keeps) holds each (reference prompt,
    record) score once: a record drawn again (another demo set of its label, another epsilon's audit of
    the same candidates) is not scored again. A reference score depends on the record and its reference
    prompt only, never on the prompt under audit, so the reused score is the one a new pass would give.
    `should_stop`: as `prompt_scores`'s, asked before every forward pass."""
    records = _records(texts, labels)
    cache = {} if cache is None else cache
    columns = []
    for prompt in _reference_prompts(out_demos):
        todo = list(dict.fromkeys(r for r in records if (prompt, r) not in cache))
        if todo:
            fresh = prompt_scores(lm, spec, list(prompt), [t for t, _ in todo], [y for _, y in todo],
                                  batch_size=batch_size, should_stop=should_stop)
            for j, record in enumerate(todo):
                cache[(prompt, record)] = fresh.take([j])
        columns.append(_concat([cache[(prompt, r)] for r in records]))
    return References(columns[0], PromptScores.stack(columns[1:]) if len(columns) > 1 else None)


def _records(texts: Sequence[str], labels: Sequence[str]) -> list[tuple[str, str]]:
    return [(str(t), str(y)) for t, y in zip(texts, labels, strict=True)]


def _reference_prompts(out_demos: Sequence[tuple]) -> list[tuple]:
    """The no-demonstration prompt, then each OUT prompt (only with 2 or more: LiRA's minimum)."""
    return [()] + ([((str(d[0]), str(d[1])),) for d in out_demos] if len(out_demos) >= 2 else [])


def reference_passes_needed(texts: Sequence[str], labels: Sequence[str], out_demos: Sequence[tuple],
                            cache: dict | None) -> int:
    """How many (reference prompt, record) scores `reference_scores` would still compute (not in `cache`)."""
    records = list(dict.fromkeys(_records(texts, labels)))
    return sum((prompt, r) not in (cache or {}) for prompt in _reference_prompts(out_demos) for r in records)


def _concat(items: Sequence[PromptScores]) -> PromptScores:
    if not items:
        empty = np.zeros(0)
        return PromptScores(empty, empty, empty)
    return PromptScores(*(np.concatenate([getattr(s, name) for s in items], axis=0)
                          for name in ("label_logprob", "label_logit", "text_logprob")))


def truncate_texts(lm, texts: Sequence[str], max_tokens: int | None) -> list[str]:
    """Each text cut to its first `max_tokens` model tokens (a public cap on what the attacks read;
    None: unchanged). Cheaper scoring for a time-boxed audit; the attacks see less of each record."""
    texts = [str(t) for t in texts]
    if max_tokens is None:
        return texts
    if max_tokens < 1:
        raise ConfigError(f"{flag('audit_max_record_tokens')}: must be >= 1, got {max_tokens}")
    ids = lm.encode_batch(texts)
    return [text if len(tokens) <= max_tokens else lm.decode(tokens[:max_tokens]).strip()
            for text, tokens in zip(texts, ids, strict=True)]
