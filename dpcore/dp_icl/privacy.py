"""DP-ICL's privacy plan: Q answered queries as Poisson-subsampled Gaussian steps (Wu et al. 2024, Section 3;
the authors' accounting: prv-accountant's subsampled Gaussian at q = M k / |D| composed over the queries).

One query (`dpcore.dp_icl.aggregation`): RNM-Gaussian with noise std s on a vote histogram of L2 sensitivity
sqrt(2) is a Gaussian mechanism of noise multiplier sigma = s / sqrt(2). Its subsets come from a fresh Poisson
subsample of rate q = M k / |D| (`dpcore.dp_icl.subsets`), and the histogram, as a function of the subsample,
moves by at most sqrt(2) when one record joins it: one query is `PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`
and Q queries compose adaptively, `SelfComposedDpEvent(..., Q)`: `Spend.sampled_steps("gaussian", sigma, q, Q)`.

Extraction (`dpcore.dp_icl.keywords`, aggregation "keywords"): the histogram over the query's public keyword space
moves by at most sqrt(2K) in L2 norm when one record joins (one subset's vote of at most K keywords changes), and
its noise std is s = sigma sqrt(2K): the same Gaussian mechanism of multiplier sigma, so the same event, the same
accounting and the same spends; only the std per count (`noise_std` in the plan's parameters) follows the
aggregation's sensitivity (`query_sensitivity`).

Draws shared by B queries (`queries_per_draw`, an option beyond the paper, default 1 = the paper): B queries
answered from one subsample are, on that subsample, B Gaussian mechanisms of multiplier sigma, i.e. one Gaussian
mechanism on the B stacked histograms with L2 sensitivity sqrt(2 B): multiplier sigma / sqrt(B) (exactly: the
Gaussian privacy loss composes in closed form). One draw is then `PoissonSampledDpEvent(q,
GaussianDpEvent(sigma / sqrt(B)))` and Q queries are ceil(Q / B) draws. Sharing a draw batches the model work
(one prompt per subset for B queries) at the price of amplifying once per draw instead of once per query.

Everything here is a function of public quantities only (|D|, M, k, Q, B, delta, epsilon): no charged quantity
depends on the private records, so no bound can fail (no `BoundFailureDpEvent`). The plan is charged before any
query is answered; a server answering in batches charges `batch_spend` of each batch before answering it (the
batches' spends compose to the plan's).
"""

from __future__ import annotations

import math

from dpcore.dp_icl.aggregation import VOTE_SENSITIVITY
from dpcore.dp_icl.keywords import DEFAULT_MAX_KEYWORDS, keyword_sensitivity
from dpcore.dp_icl.subsets import check_count, sampling_rate
from dpcore.errors import ConfigError, check_positive
from dpcore.privacy import composition
from dpcore.privacy.events import DpEvent, NoOpDpEvent, sampled_steps_event
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

METHOD = "dp-icl"      # the plan's name (`dpcore.names.PREDICTION_METHODS`)
PURPOSE = "dp-icl"     # the ledger purpose of its spends
MAX_QUERIES = 10**8    # `queries_within` searches no further
WHAT = "DP-ICL answers: RNM-Gaussian on the vote histogram of M subsets of a Poisson subsample"
AGGREGATIONS = ("rnm", "keywords")  # classification: report-noisy-max; extraction: keyword space aggregation


def aggregation_for(kind: str) -> str:
    """The aggregation of a task kind: "keywords" for extraction, "rnm" for classification."""
    return "keywords" if kind == "extraction" else "rnm"


def query_sensitivity(aggregation: str = "rnm", max_keywords: int | None = None) -> float:
    """One query's histogram L2 sensitivity: sqrt(2) for RNM's votes, sqrt(2K) for K keywords per vote."""
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if aggregation == "rnm":
        return VOTE_SENSITIVITY
    return keyword_sensitivity(DEFAULT_MAX_KEYWORDS if max_keywords is None else max_keywords)


def draws(queries: int, queries_per_draw: int = 1) -> int:
    """ceil(Q / B): the subsamples drawn (each one Poisson-sampled step) to answer Q queries B per draw."""
    return -(-check_count("queries", queries) // check_count("queries_per_draw", queries_per_draw))


def draw_noise_multiplier(noise_multiplier: float, queries_per_draw: int = 1) -> float:
    """One draw's noise multiplier: sigma / sqrt(B) (B Gaussian steps of multiplier sigma on one subsample)."""
    return float(noise_multiplier) / math.sqrt(check_count("queries_per_draw", queries_per_draw))


def dp_icl_event(noise_multiplier: float, rate: float, queries: int, queries_per_draw: int = 1) -> DpEvent:
    """Q queries: `SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma / sqrt(B))), ceil(Q / B))`
    (sigma = 0: no noise, the event of a non-private run)."""
    return sampled_steps_event("gaussian", draw_noise_multiplier(noise_multiplier, queries_per_draw), rate,
                               draws(queries, queries_per_draw))


def dp_icl_epsilon(noise_multiplier: float, rate: float, queries: int, delta: float,
                   queries_per_draw: int = 1) -> float:
    """Epsilon at `delta` of Q queries (`dpcore.privacy.composition.compose` of `dp_icl_event`): what the ledger
    charges for them."""
    return composition.compose([dp_icl_event(noise_multiplier, rate, queries, queries_per_draw)], delta).epsilon


def queries_within(epsilon: float, delta: float, noise_multiplier: float, records: int, *, subsets: int,
                   shots: int, queries_per_draw: int = 1, limit: int | None = None) -> int:
    """The most queries (at most `limit`, default MAX_QUERIES) that (epsilon, delta) affords at query noise
    multiplier sigma on |D| = `records`: B x the most draws whose composition stays within epsilon (capped at
    `limit`); 0 when not even one draw fits (`composition.largest_count`)."""
    target = check_positive("epsilon", epsilon)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    b = check_count("queries_per_draw", queries_per_draw)
    cap = MAX_QUERIES if limit is None else check_count("limit", limit)
    rate = sampling_rate(subsets, shots, records)
    max_draws = draws(cap, b)

    def fits(t: int) -> bool:
        return dp_icl_epsilon(sigma, rate, t * b, delta, b) <= target

    return min(cap, composition.largest_count(fits, max_draws) * b)


def calibrate_noise(epsilon: float, delta: float, queries: int, rate: float,
                    queries_per_draw: int = 1) -> composition.Calibration:
    """The smallest draw noise multiplier (to `composition.SIGMA_TOLERANCE`) whose Q queries stay within epsilon
    (`composition.calibrate`); the query multiplier is it x sqrt(B)."""
    t = draws(queries, queries_per_draw)
    return composition.calibrate(lambda m: sampled_steps_event("gaussian", m, rate, t), epsilon, delta)


def dp_icl_spend(noise_multiplier: float, rate: float, queries: int, queries_per_draw: int = 1,
                 what: str = WHAT) -> Spend:
    """The spend of Q queries (ceil(Q / B) Poisson-sampled Gaussian draws) under the ledger purpose "dp-icl"."""
    return Spend.sampled_steps("gaussian", draw_noise_multiplier(noise_multiplier, queries_per_draw), rate,
                               draws(queries, queries_per_draw), PURPOSE, what)


def dp_icl_plan(epsilon: float | None, delta: float, queries: int, records: int, *, subsets: int, shots: int,
                queries_per_draw: int = 1, noise_multiplier: float | None = None, aggregation: str = "rnm",
                max_keywords: int | None = None) -> PrivacyPlan:
    """DP-ICL's plan (method "dp-icl") for answering Q queries from |D| = `records` private records.

    `epsilon` finite > 0: the query noise multiplier sigma calibrated so that the Q queries compose within it
    (`noise_multiplier` must then be None). `epsilon` None: the plan at the given `noise_multiplier`, its epsilon
    the composition. `epsilon` inf: no noise (sigma = 0), an infinite spend. One spend: the Q queries. The
    `aggregation`: "rnm" (classification) or "keywords" (extraction, at most `max_keywords` K per vote, default
    `DEFAULT_MAX_KEYWORDS`): the same events, the noise std per count sigma x its sensitivity. The `parameters`:
    subsets, shots, records, sampling_rate, queries, queries_per_draw, draws, noise_multiplier (sigma, per
    query), draw_noise_multiplier, noise_std (per count and query), vote_sensitivity, aggregation, max_keywords
    (None for "rnm"), epsilon_composed (the accountant's upper bound at sigma)."""
    m, k, n = check_count("subsets (M)", subsets), check_count("shots (k)", shots), check_count("records", records)
    if aggregation == "keywords":
        max_keywords = check_count("max_keywords", DEFAULT_MAX_KEYWORDS if max_keywords is None else max_keywords)
    else:
        max_keywords = None
    sensitivity = query_sensitivity(aggregation, max_keywords)
    q_count, b = check_count("queries", queries), check_count("queries_per_draw", queries_per_draw)
    rate = sampling_rate(m, k, n)
    if epsilon is None:
        if noise_multiplier is None:
            raise ConfigError("dp-icl plan: give a target epsilon or a noise multiplier")
        sigma = check_positive("noise_multiplier", noise_multiplier)
    elif noise_multiplier is not None:
        raise ConfigError("dp-icl plan: give a target epsilon or a noise multiplier, not both")
    elif isinstance(epsilon, int | float) and math.isinf(epsilon) and epsilon > 0:
        sigma = 0.0
    else:
        target = check_positive("epsilon", epsilon)
        if target > composition.MAX_EPSILON:
            raise ConfigError(f"epsilon {target:g} is above {composition.MAX_EPSILON:g}: a vacuous guarantee "
                              "(use inf for a non-private run)")
        sigma = calibrate_noise(target, delta, q_count, rate, b).noise_multiplier * math.sqrt(b)
    spend = dp_icl_spend(sigma, rate, q_count, b)
    composed = math.inf if sigma == 0 else composition.compose([spend.event], delta).epsilon
    parameters = {"subsets": m, "shots": k, "records": n, "sampling_rate": rate, "queries": q_count,
                  "queries_per_draw": b, "draws": draws(q_count, b), "noise_multiplier": sigma,
                  "draw_noise_multiplier": draw_noise_multiplier(sigma, b), "noise_std": sigma * sensitivity,
                  "vote_sensitivity": sensitivity, "aggregation": aggregation, "max_keywords": max_keywords,
                  "epsilon_composed": composed}
    return PrivacyPlan(method=METHOD, epsilon=composed if epsilon is None else float(epsilon), delta=delta,
                       spends=(spend,), parameters=parameters)


def batch_spend(plan: PrivacyPlan, first_query: int, count: int) -> Spend:
    """What answering queries [first, first + count) of `plan` costs, charged before they are answered: the draws
    that batch begins (draw d begins at query d B), at the plan's sigma and q. Consecutive batches' spends compose
    to the plan's own; ConfigError for queries beyond the plan's Q."""
    if plan.method != METHOD:
        raise ConfigError(f"batch_spend: a {METHOD} plan expected, got {plan.method!r}")
    first, n = check_count("first_query", first_query, 0), check_count("count", count)
    b, planned = int(plan.parameters["queries_per_draw"]), int(plan.parameters["queries"])
    if first + n > planned:
        raise ConfigError(f"queries {first}..{first + n - 1}: the plan covers {planned} queries only")
    begun = -(-(first + n) // b) - (-(-first // b))
    if begun == 0:  # the batch lies inside a draw already charged: it costs nothing more
        return Spend(NoOpDpEvent(), PURPOSE, "DP-ICL answers from a draw already charged")
    return Spend.sampled_steps("gaussian", float(plan.parameters["draw_noise_multiplier"]),
                               float(plan.parameters["sampling_rate"]), begun, PURPOSE, WHAT)


__all__ = [
    "AGGREGATIONS", "MAX_QUERIES", "METHOD", "PURPOSE", "aggregation_for", "batch_spend", "calibrate_noise", "draw_noise_multiplier", "draws",
    "dp_icl_epsilon", "dp_icl_event", "dp_icl_plan", "dp_icl_spend", "queries_within", "query_sensitivity",
]
