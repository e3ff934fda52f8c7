"""DP-ICL end to end: a batch of user queries answered under a charged plan (Wu et al. 2024, Section 3, Figure 1:
partition, exemplar-query pairs, private aggregation).

For the run's queries [first, first + n): each query's draw of M subsets (`dpcore.dp_icl.subsets`), their votes
(`dpcore.dp_icl.ensemble`), the vote histogram and its RNM-Gaussian answer at the plan's noise
(`dpcore.dp_icl.aggregation`). Only the answers are public; they are a DP function of the private records when
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
from dpcore.dp_icl.ensemble import ensemble_votes
from dpcore.dp_icl.privacy import METHOD
from dpcore.dp_icl.subsets import check_count
from dpcore.errors import ConfigError
from dpcore.privacy.plan import PrivacyPlan


@dataclass(frozen=True)
class Answers:
    """The released answers of a batch (PUBLIC): one label per query (None: "other", black-box votes only), and
    the run's index of the batch's first query."""

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
                   mode: str = "calibrated", max_rows: int = 64,
                   progress: Callable[[int, int], None] | None = None) -> Answers:
    """The RNM-Gaussian answers of `queries` (the run's queries first_query, first_query + 1, ...) under `plan`
    (`dpcore.dp_icl.privacy.dp_icl_plan`), the subsets drawn under the run's secret `key`
    (`dpcore.dp_icl.subsets.run_key`) and the noise from `rng`."""
    queries = list(queries)
    check_batch(plan, first_query, len(queries))
    labels = list(spec.label_names if labels is None else labels)
    p = plan.parameters
    votes = ensemble_votes(lm, spec, records, queries, key, subsets=int(p["subsets"]), shots=int(p["shots"]),
                           rate=float(p["sampling_rate"]), labels=labels, first_query=first_query,
                           queries_per_draw=int(p["queries_per_draw"]), mode=mode, max_rows=max_rows,
                           progress=progress)
    classes = len(labels) + (1 if mode == "black-box" else 0)
    released = rnm_gaussian(vote_histograms(votes, classes), float(p["noise_std"]), rng)
    return Answers(tuple(labels[c] if c < len(labels) else None for c in released.tolist()), int(first_query))


__all__ = ["Answers", "answer_queries", "check_batch"]
