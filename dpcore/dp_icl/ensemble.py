"""DP-ICL's ensemble: each draw's M exemplar subsets (`dpcore.dp_icl.subsets`) and the vote each subset's prompt
casts on each query (Wu et al. 2024, Section 3.1, steps 1-2: "exemplar-query pairs" answered by the LLM).

The model work is PromptPATE's flock engine (`dpcore.pate.flock.flock_scores` and `votes`): a draw's M prompts
score the draw's queries in batched forwards, each prompt's prefix run once. With one query per draw (the paper)
a draw is M prompts x 1 query; `queries_per_draw` = B lets B queries share a draw's prompts (the accounting of
`dpcore.dp_icl.privacy`). Votes are "calibrated" (contextual calibration, as the authors' code scores every
prompt with its calibration inputs) or "black-box" (the greedy token; "other" is class L). For extraction each
subset's prompt answers greedily instead (`ensemble_answers`, `dpcore.lm.icl.extract_answers`): its answer is the
raw material of keyword space aggregation (`dpcore.dp_icl.keywords`).

Query i of a run (counted from the run's first answered query, across batches) belongs to draw i // B, so a
server answering in batches continues the same sequence of subsamples under the same key.

Everything returned here is PRIVATE (a function of the private records); it writes nothing and logs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dpcore.data.taskspec import TaskSpec
from dpcore.dp_icl.subsets import Subsets, check_count, draw_subsets
from dpcore.errors import ConfigError, DataValidationError
from dpcore.lm.icl import DemoItem, extract_answers
from dpcore.pate import flock

ANSWER_TOKENS = 12  # a subset's greedy answer: the extraction evaluation's length


def records_by_id(records: Sequence) -> dict[str, DemoItem]:
    """The private records as {id: DemoItem}: (text, label, id) items, every id present and distinct."""
    items = [DemoItem.of(item) for item in records]
    by_id = {str(item.id): item for item in items if item.id is not None}
    if len(by_id) != len(items):
        raise DataValidationError("records: every private record needs an id of its own (missing or duplicated)")
    return by_id


def draw_of(query_index: int, queries_per_draw: int) -> int:
    """The draw that answers the run's query i: i // B."""
    return check_count("query index", query_index, 0) // check_count("queries_per_draw", queries_per_draw)


def ensemble_subsets(record_ids: Sequence[str], key: bytes, first_query: int, count: int, *, subsets: int,
                     shots: int, rate: float, queries_per_draw: int = 1) -> dict[int, Subsets]:
    """{draw: its M subsets} for the run's queries [first, first + count) (PRIVATE)."""
    first, n = check_count("first_query", first_query, 0), check_count("count", count, 0)
    wanted = sorted({draw_of(i, queries_per_draw) for i in range(first, first + n)})
    return {d: draw_subsets(record_ids, key, d, subsets, shots, rate) for d in wanted}


def ensemble_votes(lm, spec: TaskSpec, records: Sequence, queries: Sequence[str], key: bytes, *, subsets: int,
                   shots: int, rate: float, labels: Sequence[str] | None = None, first_query: int = 0,
                   queries_per_draw: int = 1, mode: str = "calibrated", max_rows: int = 64,
                   progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """[M, Q] the vote of each subset of each query's draw (a label index; L = "other" in black-box mode).

    `records`: the private records ((text, label, id) or DemoItem, ids distinct); `queries`: the run's queries
    first_query, first_query + 1, ...; `key`: the run's secret subset key; `rate`: q = M k / |D|."""
    if mode not in flock.VOTE_MODES:
        raise ConfigError(f"vote mode must be one of {', '.join(flock.VOTE_MODES)}, got {mode!r}")
    by_id = records_by_id(records)
    labels = list(spec.label_names if labels is None else labels)
    queries = list(queries)
    m = check_count("subsets (M)", subsets)
    out = np.zeros((m, len(queries)), dtype=np.int64)
    draws = ensemble_subsets(list(by_id), key, first_query, len(queries), subsets=m, shots=shots, rate=rate,
                             queries_per_draw=queries_per_draw)
    done = 0
    for d, drawn in draws.items():
        columns = [j for j in range(len(queries)) if draw_of(first_query + j, queries_per_draw) == d]
        prompts = [[by_id[rid] for rid in demos] for demos in drawn.demos]
        scores = flock.flock_scores(lm, spec, prompts, [queries[j] for j in columns], labels,
                                    calibrate=mode == "calibrated", max_rows=max_rows)
        out[:, columns] = flock.votes(lm, spec, scores, labels, mode)
        done += len(columns)
        if progress is not None:
            progress(done, len(queries))
    return out


def ensemble_answers(lm, spec: TaskSpec, records: Sequence, queries: Sequence[str], key: bytes, *, subsets: int,
                     shots: int, rate: float, first_query: int = 0, queries_per_draw: int = 1,
                     max_new_tokens: int = ANSWER_TOKENS,
                     progress: Callable[[int, int], None] | None = None) -> list[list[str]]:
    """[M][Q] the greedy answer of each subset of each query's draw (PRIVATE): one prompt of the subset's records
    and the query, stopped at a newline or after `max_new_tokens` tokens. Arguments as `ensemble_votes`'."""
    by_id = records_by_id(records)
    queries = list(queries)
    m = check_count("subsets (M)", subsets)
    out = [[""] * len(queries) for _ in range(m)]
    draws = ensemble_subsets(list(by_id), key, first_query, len(queries), subsets=m, shots=shots, rate=rate,
                             queries_per_draw=queries_per_draw)
    done = 0
    for d, drawn in draws.items():
        columns = [j for j in range(len(queries)) if draw_of(first_query + j, queries_per_draw) == d]
        for subset, demos in enumerate(drawn.demos):
            answers = extract_answers(lm, spec, [by_id[rid] for rid in demos], [queries[j] for j in columns],
                                      max_new_tokens=max_new_tokens)
            for j, text in zip(columns, answers, strict=True):
                out[subset][j] = text
        done += len(columns)
        if progress is not None:
            progress(done, len(queries))
    return out


__all__ = ["ANSWER_TOKENS", "draw_of", "ensemble_answers", "ensemble_subsets", "ensemble_votes", "records_by_id"]
