"""In-context learning evaluation: label scoring, contextual calibration, extraction.

The ICL prompt follows Tang et al. Appendix D, Tables 7/8 (the formats of Zhao et al.
2021, Tables 5/6): `spec.icl.header()`, then one `spec.icl.demo(text, verbalizer)` per
demonstration, then `spec.icl.query(x)`.

Classification (Table 7): every label is scored by the log-probability of its FULL
verbalizer continuation `" " + verbalizer` (a sum of token log-probabilities when the
verbalizer is several tokens); the raw prediction is the argmax. Contextual calibration
(Zhao et al. 2021, Section 5): the label distribution (normalised over the labels) of
the content-free inputs "N/A", "" and "[MASK]" in the same prompt is averaged into
p_cf, and the calibrated prediction is argmax p / p_cf (their W = diag(p_cf)^-1, b = 0).

Extraction (Table 8): greedy decoding of a few tokens, stopped at a newline; exact
match after lower-casing and stripping punctuation and whitespace.

Speed: the prompt's shared prefix (instruction + demonstrations) is run through the
model once (`dpcore.lm.prefix_cache.PrefixCache`); its KV cache is expanded over a batch of
test items (right-padded suffixes with explicit position ids), and the cache after each
item's query is reused for every label continuation. `label_logprobs_naive` is the straightforward reference
(one full forward per item and label) used by the tests and the benchmark.

Privacy: `evaluate` writes nothing and returns frames holding only test items (the
public split), labels, predictions and demo ids; demonstration text never enters them.
For the random-real baseline the caller passes real records with their ids and keeps
them in the private store.
"""

from __future__ import annotations

import math
import string
import time
import unicodedata
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple, get_args

import numpy as np
import pandas as pd
import torch

from dpcore.data.taskspec import TaskSpec
from dpcore.errors import ConfigError, DataValidationError
from dpcore.lm.config import EvalConfig
from dpcore.lm.prefix_cache import PrefixBatch, PrefixCache, common_prefix_length
from dpcore.names import DEMO_SOURCES, DemoSource

CONTENT_FREE_INPUTS: tuple[str, ...] = ("N/A", "", "[MASK]")
PREDICTION_COLUMNS = [
    "test_id", "method", "epsilon", "seed", "gold", "pred_raw", "pred_calibrated", "label_probs",
    "calibrated_probs", "correct_raw", "correct_calibrated", "demo_ids",
]
METRIC_COLUMNS = ["method", "epsilon", "seed", "n", "accuracy", "calibrated_accuracy", "calibrated", "shots",
                  "seconds", "reused"]
# Scoring by something other than the local model (a served model: `dpcore.release.endpoint.scorers`), given the
# demonstrations of one prompt and the queries: the [n, L] label log-probabilities, or the answers as text.
LabelScorer = Callable[[Sequence["DemoItem"], Sequence[str]], np.ndarray]
TextAnswerer = Callable[[Sequence["DemoItem"], Sequence[str]], list[str]]
# What an evaluated prompt holds besides the query (its kind): demonstrations chosen per seed from the pool, an
# instruction (which the task spec already holds in front: `with_instruction`), or nothing (zero-shot; a
# trained prompt, whose cache `past` goes in front or whose weights the model carries). A method's release kind
# (`dpcore.release.spec.ReleaseKind`) says which; unsaid, the zero-shot baseline and a trained prompt hold
# none and every other demo source holds demonstrations.
PromptContent = Literal["demonstrations", "instruction", "none"]
ZERO_SHOT = "zero-shot"


class DemoItem(NamedTuple):
    """One demonstration of an ICL prompt: its text, its label (a class label, or the answer of an
    extraction task) and, for a real record, the record's id. Ids, never text, reach the outputs."""

    text: str
    label: str
    id: str | None = None

    @classmethod
    def of(cls, item) -> DemoItem:
        """A DemoItem from a (text, label) or (text, label, id) tuple (a DemoItem is returned as is)."""
        if isinstance(item, cls):
            return item
        if len(item) not in (2, 3):
            raise DataValidationError(f"demos: a demonstration is (text, label) or (text, label, id), "
                                      f"got {len(item)} fields")
        record_id = item[2] if len(item) == 3 else None
        return cls(str(item[0]), str(item[1]), None if record_id is None else str(record_id))


# --------------------------------------------------------------------------- prompt


def prefix_text(spec: TaskSpec, demos: Sequence[DemoItem]) -> str:
    """Instruction + demonstrations (Table 7/8): the part shared by every test item."""
    body = "".join(spec.icl.demo(demo[0], _answer(spec, demo[1])) for demo in demos)
    return spec.icl.header() + body


def with_instruction(spec: TaskSpec, instruction: str) -> TaskSpec:
    """The task with `instruction` in front of its ICL prompt (`TaskSpec.icl.instruction`): a released
    instruction leads a zero-shot prompt (post-processing)."""
    return spec.model_copy(update={"icl": spec.icl.model_copy(update={"instruction": instruction.strip()})})


def prompt_text(spec: TaskSpec, demos: Sequence[DemoItem], query: str) -> str:
    return prefix_text(spec, demos) + spec.icl.query(query)


def _answer(spec: TaskSpec, label: str) -> str:
    return spec.verbalizer(label) if spec.kind == "classification" else label


# --------------------------------------------------------------------------- demos


def choose_demos(pool: Sequence[DemoItem], labels: Sequence[str], shots: int, seed: int) -> list[DemoItem]:
    """The demonstrations of one ICL prompt, as the paper orders them (Section 5.1).

    Labels are drawn without replacement from those with demos in the pool (every label
    `shots // L` times, the remainder drawn at random), one demo per chosen label, the
    prompt order shuffled; all randomness from `np.random.default_rng(seed)`. Deterministic
    in (pool, labels, shots, seed). Items are returned as given (2- or 3-tuples).
    """
    if shots < 0:
        raise ConfigError(f"shots: must be >= 0, got {shots}")
    if shots == 0:
        return []
    by_label: dict[str, list[int]] = {}
    for index, item in enumerate(pool):
        by_label.setdefault(str(item[1]), []).append(index)
    available = [label for label in labels if by_label.get(label)]
    if not available:
        raise ConfigError("demos: no demonstration in the pool has one of the task's labels")
    rng = np.random.default_rng(seed)
    orders = {label: rng.permutation(len(by_label[label])) for label in available}
    rounds, remainder = divmod(shots, len(available))
    chosen = list(available) * rounds
    if remainder:
        chosen += [available[i] for i in sorted(rng.choice(len(available), size=remainder, replace=False))]
    taken: dict[str, int] = {}
    picked = []
    for label in chosen:
        count = taken.get(label, 0)
        taken[label] = count + 1
        order = orders[label]
        picked.append(pool[by_label[label][int(order[count % len(order)])]])
    return [picked[i] for i in rng.permutation(len(picked))]


def demo_ids(demos: Sequence[DemoItem]) -> list[str]:
    """Ids of the demos (real records) or their position in the prompt; never their text."""
    ids = [DemoItem.of(demo).id for demo in demos]
    return [f"demo-{i}" if record_id is None else record_id for i, record_id in enumerate(ids)]


def check_test_size(test_size: int | None, num_test: int) -> None:
    """A `--test-size` beyond the test split is an error, never a silent cap (the split size is a public count)."""
    if test_size is not None and test_size > num_test:
        raise ConfigError(f"--test-size {test_size}: the test split has only {num_test} items "
                          "(use a smaller --test-size, or leave it out to use them all)")


def select_test(test: pd.DataFrame, test_size: int | None, seed: int = 0) -> pd.DataFrame:
    """The first `test_size` items of a seeded shuffle of the test split (all when None); deterministic."""
    check_test_size(test_size, len(test))
    order = np.random.default_rng(seed).permutation(len(test))
    if test_size is not None:
        order = order[:test_size]
    return test.iloc[order].reset_index(drop=True)


# --------------------------------------------------------------------------- classification scoring


def _labels(spec: TaskSpec, labels: Sequence[str] | None) -> list[str]:
    labels = list(labels) if labels is not None else spec.label_names
    if not labels:
        raise ConfigError("labels: a classification task needs at least one label to score")
    return labels


def label_token_ids(lm, spec: TaskSpec, labels: Sequence[str]) -> list[list[int]]:
    """The tokens of each label's continuation `" " + verbalizer(label)`."""
    ids = [lm.encode(" " + spec.verbalizer(label)) for label in labels]
    for label, tokens in zip(labels, ids, strict=True):
        if not tokens:
            raise ConfigError(f"labels: the verbalizer of label {label!r} encodes to no tokens")
    return ids


def score_labels(prefix: PrefixCache, batch: PrefixBatch, logp: torch.Tensor, label_ids: list[list[int]]) -> torch.Tensor:
    """[B, L] float64 label log-probabilities of a batch whose last query token gave `logp` [B, V].

    The first label token is read from `logp`; labels of several tokens continue from the cache
    after the query (rows repeated per label, `PrefixCache.select`).
    """
    lm = prefix.lm
    first = torch.as_tensor([ids[0] for ids in label_ids], dtype=torch.long, device=lm.device)
    multi = [j for j, ids in enumerate(label_ids) if len(ids) > 1]
    scores = logp[:, first].double()
    if multi:
        items = range(logp.shape[0])
        rows = torch.as_tensor([b for b in items for _ in multi], dtype=torch.long, device=lm.device)
        cont = [label_ids[j][:-1] for _ in items for j in multi]
        tails = [label_ids[j][1:] for _ in items for j in multi]
        cont_batch = PrefixCache.select(batch, rows, lm.model.config)
        _, cont_logp = prefix.extend(cont_batch, cont, keep="all")  # [R, W, V]
        for r, tail in enumerate(tails):
            b, j = divmod(r, len(multi))
            steps = torch.arange(len(tail), device=lm.device)
            target = torch.as_tensor(tail, dtype=torch.long, device=lm.device)
            scores[b, multi[j]] += cont_logp[r, steps, target].double().sum()
    return scores


def label_logprobs(lm, spec: TaskSpec, demos: Sequence[DemoItem], queries: Sequence[str],
                   labels: Sequence[str] | None = None, batch_size: int = 16,
                   progress: Callable[[int], None] | None = None,
                   past: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> np.ndarray:
    """[n, L] log p(" " + verbalizer(label) | prompt(demos, query)), a sum over the label's tokens.

    `past`: a trained prompt's per-layer cache (`dpcore.dpsgd.soft_prompt.TrainablePrompt.cache_layers`)
    placed before the text prompt: PromptDPSGD's scores (Duan et al. Section 4.1).

    The longest token prefix shared by all prompts (instruction + demos, usually) is run once
    (`PrefixCache`); per batch of items the query tokens run once on the expanded cache, the
    first label token is read from the last query position, and labels of several tokens
    continue from the cache after the query (rows repeated per label).
    """
    labels = _labels(spec, labels)
    if not queries:
        return np.zeros((0, len(labels)))
    label_ids = label_token_ids(lm, spec, labels)
    contexts = [lm.encode(prompt_text(spec, demos, q)) for q in queries]
    shared = common_prefix_length(contexts, reserve=1)
    prefix = PrefixCache(lm, contexts[0][:shared], past=past)
    suffixes = [ctx[shared:] for ctx in contexts]
    out = np.zeros((len(queries), len(labels)))
    order = sorted(range(len(queries)), key=lambda i: len(suffixes[i]))  # similar lengths batch together
    done = 0
    for start in range(0, len(order), batch_size):
        items = order[start:start + batch_size]
        batch, logp = prefix.extend(prefix.start(len(items)), [suffixes[i] for i in items], keep="last")
        out[items] = score_labels(prefix, batch, logp, label_ids).cpu().numpy()
        done += len(items)
        if progress is not None:
            progress(done)
    return out


@torch.inference_mode()
def label_logprobs_naive(lm, spec: TaskSpec, demos: Sequence[DemoItem], queries: Sequence[str],
                         labels: Sequence[str] | None = None) -> np.ndarray:
    """The reference: one full forward (batch 1, no cache) per item and label; same tokens as `label_logprobs`."""
    labels = _labels(spec, labels)
    label_ids = label_token_ids(lm, spec, labels)
    out = np.zeros((len(queries), len(labels)))
    for i, query in enumerate(queries):
        context = lm.encode(prompt_text(spec, demos, query))
        for j, tail in enumerate(label_ids):
            ids = torch.as_tensor([context + tail], dtype=torch.long, device=lm.device)
            mask = torch.ones_like(ids)
            began = time.perf_counter()
            # logits only where the label's tokens are predicted (the last len(tail) + 1 positions)
            logits = lm.model(input_ids=ids, attention_mask=mask, use_cache=False,
                              logits_to_keep=len(tail) + 1).logits[0].float()
            lm.stats.record(mask, began)
            logp = torch.log_softmax(logits[:-1], dim=-1)
            target = torch.as_tensor(tail, dtype=torch.long, device=lm.device)
            out[i, j] = float(logp[torch.arange(len(tail), device=lm.device), target].double().sum())
    return out


def normalise_probs(logprobs: np.ndarray) -> np.ndarray:
    """Label probabilities normalised over the labels (softmax of the label log-probabilities)."""
    logprobs = np.asarray(logprobs, dtype=float)
    shifted = logprobs - logprobs.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def calibrate_probs(probs: np.ndarray, content_free_probs: np.ndarray) -> np.ndarray:
    """Contextual calibration (Zhao et al. 2021): q proportional to p / p_cf, renormalised over the labels.

    `content_free_probs` is p_cf [L] or one row per content-free input [k, L] (averaged).
    The argmax of the result is the calibrated prediction.
    """
    probs = np.asarray(probs, dtype=float)
    p_cf = np.asarray(content_free_probs, dtype=float)
    if p_cf.ndim == 2:
        p_cf = p_cf.mean(axis=0)
    if p_cf.shape[-1] != probs.shape[-1]:
        raise ConfigError(f"calibrate_probs: {probs.shape[-1]} labels but {p_cf.shape[-1]} content-free probabilities")
    scaled = probs / np.maximum(p_cf, np.finfo(float).tiny)
    return scaled / scaled.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- extraction


_PUNCTUATION = set(string.punctuation)


def normalise_answer(text: str) -> str:
    """Lower-case, drop punctuation (ASCII and Unicode P*), collapse and strip whitespace."""
    kept = "".join(
        " " if ch.isspace() else ch
        for ch in str(text).lower()
        if ch not in _PUNCTUATION and not unicodedata.category(ch).startswith("P")
    )
    return " ".join(kept.split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalise_answer(prediction) == normalise_answer(gold)


def _cut_answer(lm, tokens: Sequence[int]) -> tuple[str, bool]:
    text = lm.decode(tokens)
    if "\n" in text:
        return text.split("\n", 1)[0].strip(), True
    return text.strip(), False


def extract_answers(lm, spec: TaskSpec, demos: Sequence[DemoItem], queries: Sequence[str],
                    max_new_tokens: int = 12, batch_size: int = 16,
                    progress: Callable[[int], None] | None = None) -> list[str]:
    """Greedy answers (Table 8 format), stopped at a newline or an end token; the prefix cache is shared."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens: must be >= 1, got {max_new_tokens}")
    if not queries:
        return []
    contexts = [lm.encode(prompt_text(spec, demos, q)) for q in queries]
    shared = common_prefix_length(contexts, reserve=1)
    prefix = PrefixCache(lm, contexts[0][:shared])
    answers = [""] * len(queries)
    order = sorted(range(len(queries)), key=lambda i: len(contexts[i]))
    for start in range(0, len(order), batch_size):
        items = order[start:start + batch_size]
        batch, logp = prefix.extend(prefix.start(len(items)), [contexts[i][shared:] for i in items], keep="last")
        generated: list[list[int]] = [[] for _ in items]
        finished = [False] * len(items)
        for step in range(max_new_tokens):
            tokens = logp.argmax(dim=-1).tolist()
            for b, token in enumerate(tokens):
                if finished[b]:
                    continue
                if token in lm.eos_token_ids:
                    finished[b] = True
                    continue
                generated[b].append(token)
                finished[b] = _cut_answer(lm, generated[b])[1]
            if all(finished) or step == max_new_tokens - 1:
                break
            batch, logp = prefix.extend(batch, [[t] for t in tokens], keep="last")
        for b, i in enumerate(items):
            answers[i] = _cut_answer(lm, generated[b])[0]
        if progress is not None:
            progress(min(len(order), start + batch_size))
    return answers


# --------------------------------------------------------------------------- evaluation


def _pool(demo_pool) -> list[DemoItem]:
    if demo_pool is None:
        return []
    if isinstance(demo_pool, pd.DataFrame):
        for column in ("text", "label"):
            if column not in demo_pool.columns:
                raise DataValidationError(f"demos: missing column {column!r}")
        ids = demo_pool["id"].astype(str).tolist() if "id" in demo_pool.columns else [None] * len(demo_pool)
        return [DemoItem(str(t), str(lab), i) for t, lab, i in zip(demo_pool["text"], demo_pool["label"], ids,
                                                                  strict=True)]
    return [DemoItem.of(item) for item in demo_pool]


def evaluate(lm, spec: TaskSpec, test: pd.DataFrame, demo_pool, method: DemoSource, epsilon: float,
             config: EvalConfig, labels: Sequence[str] | None = None, *, test_seed: int = 0,
             batch_size: int = 16, max_new_tokens: int = 12,
             progress: Callable[[str], None] | None = None,
             items_progress: Callable[[int, int], None] | None = None,
             past: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
             score: LabelScorer | None = None,
             answer: TextAnswerer | None = None,
             content: PromptContent | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ICL accuracy of one method over `config.seeds` seeds; returns (predictions, metrics), writes nothing.

    `progress` gets one line per seed; `items_progress(done, total)` the items scored over all seeds.

    `test`: the public test split (columns id, text, label); the first `config.test_size` items of a
    shuffle seeded by `test_seed` are used, the same for every seed and method. `demo_pool`: the
    demos to choose from, (text, label[, id]) tuples or a frame with text/label[/id] columns
    (synthetic demos, or real records for random-real: only their ids reach the outputs).
    Seed s chooses and orders the demos with `choose_demos(pool, labels, shots, s)`; zero-shot
    uses no demos. Classification: raw and calibrated predictions (calibration only when
    `config.calibrate`). Extraction: exact match of greedy answers; no calibration applies, so
    `pred_calibrated` = `pred_raw` and `calibrated_accuracy` = `accuracy` (metrics column
    `calibrated` is False).

    `past`: a trained prompt's cache placed before every prompt (a PromptDPSGD soft prompt or prefix, no
    demonstrations; classification only).

    `content`: what the prompt holds besides the query (`PromptContent`); only "demonstrations" draws them.
    None: nothing for the zero-shot baseline and a trained prompt (`past`), demonstrations otherwise.

    `score` / `answer` replace the local model (`lm` is then unused): `score(demos, queries)` gives the label
    log-probabilities, `answer(demos, queries)` the answers as text. A classification task with `answer` and
    no `score` is scored by its answers (the matched label, "" for none: wrong), without calibration.
    """
    pool, shots, labels, demo_labels = _evaluation_inputs(spec, test, demo_pool, method, config, labels,
                                                          trained_prompt=past is not None, content=content)
    classification = spec.kind == "classification"
    items = select_test(test, config.test_size, seed=test_seed)
    queries = items["text"].astype(str).tolist()
    gold = items["label"].astype(str).tolist()
    test_ids = items["id"].astype(str).tolist()
    by_text = classification and score is None and answer is not None  # no probabilities: nothing to calibrate
    calibrate = classification and config.calibrate and not by_text
    epsilon = float(epsilon)

    prediction_frames, metric_rows = [], []
    memo: dict[tuple, tuple] = {}
    total_items = config.seeds * len(queries)

    def scored(seed: int):  # items done within this seed -> the progress over all seeds
        if items_progress is None:
            return None
        return lambda done: items_progress(seed * len(queries) + min(done, len(queries)), total_items)

    for seed in range(config.seeds):
        began = time.perf_counter()
        demos = choose_demos(pool, demo_labels, shots, seed) if shots else []
        key = tuple((d.text, d.label) for d in demos)
        reused = key in memo
        if not reused:  # zero-shot (and repeated demo sets) are scored once
            memo[key] = _predict(lm, spec, demos, queries, labels, calibrate, batch_size=batch_size,
                                 max_new_tokens=max_new_tokens, progress=scored(seed), past=past,
                                 score=score, answer=answer, by_text=by_text)
        raw, cal, probs, calibrated = memo[key]
        if classification:
            correct_raw = [p == g for p, g in zip(raw, gold, strict=True)]
            correct_cal = [p == g for p, g in zip(cal, gold, strict=True)]
        else:
            correct_raw = [exact_match(p, g) for p, g in zip(raw, gold, strict=True)]
            correct_cal = correct_raw
        ids = demo_ids(demos)
        prediction_frames.append(pd.DataFrame({
            "test_id": test_ids, "method": method, "epsilon": epsilon, "seed": seed, "gold": gold,
            "pred_raw": raw, "pred_calibrated": cal, "label_probs": probs, "calibrated_probs": calibrated,
            "correct_raw": correct_raw, "correct_calibrated": correct_cal, "demo_ids": [ids] * len(gold),
        }))
        n = len(gold)
        metric_rows.append({
            "method": method, "epsilon": epsilon, "seed": seed, "n": n,
            "accuracy": float(np.mean(correct_raw)) if n else math.nan,
            "calibrated_accuracy": float(np.mean(correct_cal)) if n else math.nan,
            # whole seconds: a finer time of work on the test records is a timing channel on them
            "calibrated": calibrate, "shots": len(demos), "seconds": round(time.perf_counter() - began),
            "reused": reused,
        })
        if items_progress is not None:
            items_progress((seed + 1) * len(queries), total_items)
        if progress is not None:
            row = metric_rows[-1]
            progress(f"{method} eps={epsilon:g} seed {seed}: accuracy {row['accuracy']:.3f}, "
                     f"calibrated {row['calibrated_accuracy']:.3f} ({row['seconds']} s)")
    predictions = pd.concat(prediction_frames, ignore_index=True)[PREDICTION_COLUMNS]
    metrics = pd.DataFrame(metric_rows, columns=METRIC_COLUMNS)
    return predictions, metrics


def _evaluation_inputs(spec: TaskSpec, test: pd.DataFrame, demo_pool, method: DemoSource, config: EvalConfig,
                       labels: Sequence[str] | None, trained_prompt: bool,
                       content: PromptContent | None = None) -> tuple[list, int, list[str], list[str]]:
    """`evaluate`'s inputs checked: (the demo pool, the shots per prompt, the labels scored, the labels demos
    are chosen by); a bad method, test split, demo set or label is an error naming it."""
    if method not in DEMO_SOURCES:
        raise ConfigError(f"method: {method!r} is not one of {', '.join(DEMO_SOURCES)}")
    for column in ("id", "text", "label"):
        if column not in test.columns:
            raise DataValidationError(f"test split: missing column {column!r}")
    if content is None:
        content = "none" if method == ZERO_SHOT or trained_prompt else "demonstrations"
    elif content not in get_args(PromptContent):
        raise ConfigError(f"content: {content!r} is not one of {', '.join(get_args(PromptContent))}")
    with_demos = content == "demonstrations"
    pool = _pool(demo_pool) if with_demos else []
    shots = config.shots if with_demos else 0
    if trained_prompt and spec.kind != "classification":
        raise ConfigError(f"task {spec.name!r}: a trained prompt scores classification tasks only")
    if shots > 0 and not pool:
        raise ConfigError(f"demos: method {method!r} with shots={shots} needs demonstrations, none were given")
    if spec.kind != "classification":
        return pool, shots, [], list(dict.fromkeys(item.label for item in pool))
    labels = _labels(spec, labels)
    unknown = sorted({item.label for item in pool} - set(labels))
    if unknown:
        raise DataValidationError(f"demos: label(s) {', '.join(unknown)} are not labels of task {spec.name!r}")
    return pool, shots, labels, labels


def _predict(lm, spec: TaskSpec, demos: Sequence, queries: list[str], labels: list[str], calibrate: bool, *,
             batch_size: int, max_new_tokens: int, progress: Callable[[int], None] | None,
             past, score: Callable | None = None, answer: Callable | None = None,
             by_text: bool = False) -> tuple[list[str], list[str], list, list]:
    """One demo set's predictions on every query: (raw, calibrated, label probabilities, calibrated
    probabilities). Classification: the most probable label, and after contextual calibration (Zhao et al.
    2021) when `calibrate`; `by_text`: the label matched in `answer`'s text, twice, no probabilities.
    Extraction: the greedy answer twice, no probabilities. `score` / `answer` replace the local model."""
    if by_text or spec.kind != "classification":
        answers = (answer(demos, queries) if answer is not None else
                   extract_answers(lm, spec, demos, queries, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                   progress=progress))
        return answers, answers, [[] for _ in queries], [[] for _ in queries]
    extra = list(CONTENT_FREE_INPUTS) if calibrate else []
    logprobs = (score(demos, queries + extra) if score is not None else
                label_logprobs(lm, spec, demos, queries + extra, labels, batch_size=batch_size, progress=progress,
                               past=past))
    probs = normalise_probs(logprobs[: len(queries)])
    calibrated = calibrate_probs(probs, normalise_probs(logprobs[len(queries):])) if calibrate else probs
    return ([labels[k] for k in probs.argmax(axis=1)], [labels[k] for k in calibrated.argmax(axis=1)],
            probs.tolist(), calibrated.tolist())


def split_private_demo_ids(predictions: pd.DataFrame, free_text: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(public predictions with `demo_ids` blanked, private table of the demo ids per seed).

    For the random-real baseline the demo ids name real training records: which records
    were used is membership information, so the ids belong in the private store. With
    `free_text` (extraction tasks) the generated answers are blanked too: a model prompted
    with real records may copy their words into its answer (correctness flags stay).
    """
    private = (predictions.groupby(["method", "epsilon", "seed"], sort=True, dropna=False)["demo_ids"]
               .first().reset_index())
    public = predictions.assign(demo_ids=[[] for _ in range(len(predictions))])
    if free_text:
        public = public.assign(pred_raw="", pred_calibrated="")
    return public, private


def seconds_per_100_items(metrics: pd.DataFrame) -> float:
    """Wall seconds per 100 test items for one demo set (seeds whose scores were reused are left out)."""
    scored = metrics[~metrics["reused"]] if "reused" in metrics.columns else metrics
    items = float((scored["n"]).sum())
    return 100.0 * float(scored["seconds"].sum()) / items if items else math.nan


