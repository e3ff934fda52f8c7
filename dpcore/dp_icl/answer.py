"""DP-ICL end to end: a batch of user queries answered under a charged plan (Wu et al. 2024, Section 3, Figure 1:
partition, exemplar-query pairs, private aggregation).

For the run's queries [first, first + n): each query's draw of M subsets (`dpcore.dp_icl.subsets`), their votes
(`dpcore.dp_icl.ensemble`), the vote histogram and its RNM-Gaussian answer at the plan's noise
(`dpcore.dp_icl.aggregation`); for an extraction plan (its `aggregation` "keywords"), the subsets' greedy answers
and the noisy majority of their keywords in the query's own words (`dpcore.dp_icl.keywords`). Only the answers are public; they are a DP function of the private records when
the plan's spends (or `dpcore.dp_icl.privacy.batch_spend` of the batch) were charged first, which the caller
(the ledger's charge) does. The inclusion rate is the plan's q, whatever the number of records passed, so the
accounting holds on every dataset (a neighbouring one included) for the same plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dpcore.data.taskspec import TaskSpec
from dpcore.dp_icl.aggregation import rnm_gaussian, vote_histograms
from dpcore.dp_icl.ensemble import ANSWER_TOKENS, ensemble_answers, ensemble_votes
from dpcore.dp_icl.keywords import aggregate
from dpcore.dp_icl.privacy import METHOD
from dpcore.dp_icl.subsets import check_count
from dpcore.errors import ConfigError
from dpcore.privacy.plan import PrivacyPlan


@dataclass(frozen=True)
class Answers:
    """The released answers of a batch (PUBLIC): one per query, a label (None: "other", black-box votes only) or,
    for extraction, the released keywords ("" when none has a noisy majority); the run's index of the batch's
    first query."""

    labels: tuple[str | None, ...]
    first_query: int = 0


def check_batch(plan: PrivacyPlan, first_query: int, count: int) -> None:
    """The batch lies within the queries the plan was charged for (ConfigError otherwise)."""
    if plan.method != METHOD:
        raise ConfigError(f"a {METHOD} plan expected, got {plan.method!r}")
    first, n = check_count("first_query", first_query, 0), check_count("queries", count, 0)
    planned = int(plan.parameters["queries"])
    if first + n > planned:
        raise ConfigError(f"queries {first}..{first + n - 1}: the plan covers {planned} queries; plan more "
                          "queries (a new charge) to answer these")


def answer_queries(lm, spec: TaskSpec, records: Sequence, queries: Sequence[str], plan: PrivacyPlan, key: bytes,
                   rng: np.random.Generator, *, first_query: int = 0, labels: Sequence[str] | None = None,
                   mode: str = "calibrated", max_rows: int = 64, max_new_tokens: int = ANSWER_TOKENS,
                   progress: Callable[[int, int], None] | None = None) -> Answers:
    """The RNM-Gaussian answers of `queries` (the run's queries first_query, first_query + 1, ...) under `plan`
    (`dpcore.dp_icl.privacy.dp_icl_plan`), the subsets drawn under the run's secret `key`
    (`dpcore.dp_icl.subsets.run_key`) and the noise from `rng`; an extraction plan's are `answer_extraction`'s
    (`labels` and `mode` unused)."""
    queries = list(queries)
    check_batch(plan, first_query, len(queries))
    if plan.parameters.get("aggregation") == "keywords":
        return answer_extraction(lm, spec, records, queries, plan, key, rng, first_query=first_query,
                                 max_new_tokens=max_new_tokens, progress=progress)
    labels = list(spec.label_names if labels is None else labels)
    p = plan.parameters
    votes = ensemble_votes(lm, spec, records, queries, key, subsets=int(p["subsets"]), shots=int(p["shots"]),
                           rate=float(p["sampling_rate"]), labels=labels, first_query=first_query,
                           queries_per_draw=int(p["queries_per_draw"]), mode=mode, max_rows=max_rows,
                           progress=progress)
    classes = len(labels) + (1 if mode == "black-box" else 0)
    released = rnm_gaussian(vote_histograms(votes, classes), float(p["noise_std"]), rng)
    return Answers(tuple(labels[c] if c < len(labels) else None for c in released.tolist()), int(first_query))


def answer_extraction(lm, spec: TaskSpec, records: Sequence, queries: Sequence[str], plan: PrivacyPlan, key: bytes,
                      rng: np.random.Generator, *, first_query: int = 0, max_new_tokens: int = ANSWER_TOKENS,
                      progress: Callable[[int, int], None] | None = None) -> Answers:
    """Keyword space aggregation of `queries` under an extraction plan (its `aggregation` "keywords"): each
    query's M subsets answer greedily (`ensemble_answers`), and its answer is the query's words that a noisy
    majority of them name (`dpcore.dp_icl.keywords.aggregate`, at the plan's K and noise std)."""
    queries = list(queries)
    check_batch(plan, first_query, len(queries))
    p = plan.parameters
    if p.get("aggregation") != "keywords":
        raise ConfigError("answer_extraction: an extraction plan (aggregation \"keywords\") expected")
    answers = ensemble_answers(lm, spec, records, queries, key, subsets=int(p["subsets"]), shots=int(p["shots"]),
                               rate=float(p["sampling_rate"]), first_query=first_query,
                               queries_per_draw=int(p["queries_per_draw"]), max_new_tokens=max_new_tokens,
                               progress=progress)
    released = [aggregate([subset[j] for subset in answers], query, max_keywords=int(p["max_keywords"]),
                          std=float(p["noise_std"]), rng=rng) for j, query in enumerate(queries)]
    return Answers(tuple(released), int(first_query))


__all__ = ["Answers", "answer_extraction", "answer_queries", "check_batch"]
