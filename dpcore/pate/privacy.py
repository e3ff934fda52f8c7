"""PromptPATE's data-independent privacy plan: Confident-GNMax as two Gaussian mechanisms.

Confident-GNMax (Papernot et al. 2018, "Scalable Private Learning with PATE", Algorithm 1;
Duan et al. 2023, App. C.2 Algorithm 2) answers a public query x from the teachers' vote
histogram n(x) = (n_1(x), ..., n_m(x)) (n_j: how many of the E teachers vote class j):

1. threshold test: if max_j n_j(x) + N(0, sigma1^2) >= T ...
2. ... GNMax: answer argmax_j (n_j(x) + N(0, sigma2^2)), else answer "bottom".

Neighbouring datasets: add/remove one private record. Teachers are built from disjoint
records (Duan et al. App. C.3, "PromptPATE"), so one record is in at most one teacher, and
changing that teacher changes at most its one vote (or removes it):

- the threshold test is a Gaussian mechanism on the scalar max_j n_j(x), whose sensitivity
  is THRESHOLD_SENSITIVITY = 1 (each count moves by at most 1, so their maximum does too);
  noise multiplier sigma1 / 1.
- GNMax is a Gaussian mechanism on the histogram n(x) (the argmax is post-processing), whose
  L2 sensitivity is VOTE_SENSITIVITY = sqrt(2) (one vote moves from class i to class j:
  n_i - 1, n_j + 1); noise multiplier sigma2 / sqrt(2). (Removing the teacher altogether
  changes one count by 1, which is within sqrt(2).)

Which queries get answered depends on the private votes, so a bound valid for any vote
histogram charges GNMax on every one of the Q queries, like the threshold test: two spends
of Q Gaussian steps each on all the data (sampling rate q = 1). Their composition
(`dpcore.privacy.composition.compose`, the one accountant) is the data-independent epsilon the ledger
charges. With a target epsilon, the plan covers the most queries the target affords
(`max_queries_within`): labelling stops when the budget is reached. The data-dependent
analysis, which needs the private vote histograms, is `dpcore.pate.data_dependent`.
"""

from __future__ import annotations

import math
import numbers

from dpcore.errors import ConfigError, check_positive
from dpcore.flags import flag
from dpcore.privacy import composition
from dpcore.privacy.events import gaussian_event
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

THRESHOLD_SENSITIVITY = 1.0         # |max_j n_j - max_j n'_j| <= 1 under add/remove of one record
VOTE_SENSITIVITY = math.sqrt(2.0)   # ||n - n'||_2 <= sqrt(2): one teacher's vote moves to another class
PURPOSE = "pate"                    # the ledger purpose of both spends
MAX_QUERIES = 10**9                 # `max_queries_within` searches no further


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or int(value) != value or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def threshold_noise_multiplier(sigma1: float) -> float:
    """The threshold test's noise multiplier: sigma1 / THRESHOLD_SENSITIVITY."""
    return float(gaussian_event(check_positive(flag("pate_sigma1"), sigma1), THRESHOLD_SENSITIVITY)
                 .noise_multiplier)


def vote_noise_multiplier(sigma2: float) -> float:
    """GNMax's noise multiplier: sigma2 / VOTE_SENSITIVITY = sigma2 / sqrt(2)."""
    return float(gaussian_event(check_positive(flag("pate_sigma2"), sigma2), VOTE_SENSITIVITY).noise_multiplier)


def pate_spends(sigma1: float, sigma2: float, queries: int) -> tuple[Spend, Spend]:
    """The two spends of Q Confident-GNMax queries on the whole private set (q = 1): the threshold
    test and GNMax, each Q Gaussian steps (GNMax charged on every query: data-independent)."""
    q = _count("queries", queries)
    return (
        Spend.sampled_steps("gaussian", threshold_noise_multiplier(sigma1), 1.0, q, PURPOSE,
                            "Confident-GNMax threshold test on every public query (Gaussian on the max vote count)"),
        Spend.sampled_steps("gaussian", vote_noise_multiplier(sigma2), 1.0, q, PURPOSE,
                            "GNMax noisy argmax on every public query (Gaussian on the vote histogram)"),
    )


def data_independent_epsilon(sigma1: float, sigma2: float, queries: int, delta: float) -> float:
    """Epsilon at `delta` of Q Confident-GNMax queries, valid for any vote histograms: the
    composition (`dpcore.privacy.composition.compose`) of the events of `pate_spends`, exactly what the
    ledger charges for them."""
    return composition.compose([s.event for s in pate_spends(sigma1, sigma2, queries)], delta).epsilon


def max_queries_within(epsilon: float, delta: float, sigma1: float, sigma2: float, *,
                       limit: int | None = None) -> int:
    """The largest Q (at most `limit`, default MAX_QUERIES) with data_independent_epsilon(sigma1,
    sigma2, Q, delta) <= epsilon; 0 when not even one query fits (`composition.largest_count`: epsilon
    grows with Q)."""
    target = check_positive("epsilon", epsilon)
    cap = MAX_QUERIES if limit is None else _count("limit", limit)

    def fits(q: int) -> bool:
        return data_independent_epsilon(sigma1, sigma2, q, delta) <= target

    return composition.largest_count(fits, cap)


def labelling_checkpoints(epsilons, delta: float, sigma1: float, sigma2: float, *, repeats: int,
                          queries: int) -> list[tuple[float, int, float]]:
    """Smaller epsilons read off one labelling: (requested epsilon, Q_i per repeat, its data-independent
    epsilon) for each finite requested epsilon whose most affordable R x Q_i queries are fewer than the
    run's R x Q (and at least one per repeat), in increasing order.

    Confident-GNMax answers the queries of each repeat in order, each from its own histogram and its own
    noise, so the first Q_i answers of every repeat are exactly a run of R x Q_i queries: a student
    built from them is (data_independent_epsilon(R x Q_i), delta)-DP. As a function of the whole
    labelling it costs nothing beyond the run's own charge (post-processing), which is why a run can
    report PromptPATE at every epsilon of a comparison and be charged for the largest only."""
    n_repeats = _count("repeats", repeats)
    per_repeat = _count("queries", queries)
    checkpoints = []
    for requested in sorted({float(e) for e in epsilons if 0.0 < float(e) < math.inf}):
        prefix = max_queries_within(requested, delta, sigma1, sigma2, limit=per_repeat * n_repeats) // n_repeats
        if 1 <= prefix < per_repeat:
            checkpoints.append((requested, prefix, data_independent_epsilon(sigma1, sigma2, prefix * n_repeats,
                                                                            delta)))
    return checkpoints


def pate_plan(*, epsilon_target: float | None, delta: float, queries: int, threshold_sigma: float,
              vote_sigma: float, teachers: int, threshold: float) -> PrivacyPlan:
    """PromptPATE's privacy plan (method "pate"): the spends of `pate_spends` for Q queries.

    Without `epsilon_target` the plan covers all `queries` and its epsilon is their
    data-independent composition. With it, the plan covers min(queries, max_queries_within(...))
    queries (labelling stops when the budget is reached) and its epsilon is the target; a target
    that affords not even one query is a ConfigError. `parameters`: teachers, threshold, sigma1,
    sigma2, queries (planned), queries_requested, epsilon_data_independent, sensitivities."""
    sigma1 = check_positive(flag("pate_sigma1"), threshold_sigma)
    sigma2 = check_positive(flag("pate_sigma2"), vote_sigma)
    n_teachers = _count("teachers", teachers)
    requested = _count("queries", queries)
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag('pate_threshold')} must be a number, got {threshold!r}") from None
    if not (math.isfinite(t) and 0.0 <= t <= n_teachers):
        raise ConfigError(f"{flag('pate_threshold')} must be in [0, teachers = {n_teachers}] (the largest vote count), "
                          f"got {threshold}")
    planned = requested
    if epsilon_target is not None:
        target = check_positive(flag("pate_target_epsilon"), epsilon_target)
        planned = max_queries_within(target, delta, sigma1, sigma2, limit=requested)
        if planned == 0:
            raise ConfigError(f"{flag('pate_target_epsilon')} {target:g} affords not even one query at sigma1 = {sigma1:g}, "
                              f"sigma2 = {sigma2:g} (delta = {delta:g}): raise the noise or the target")
    spends = pate_spends(sigma1, sigma2, planned)
    epsilon = data_independent_epsilon(sigma1, sigma2, planned, delta)
    parameters = {"teachers": n_teachers, "threshold": t, "sigma1": sigma1, "sigma2": sigma2, "queries": planned,
                  "queries_requested": requested, "epsilon_data_independent": epsilon,
                  "threshold_sensitivity": THRESHOLD_SENSITIVITY, "vote_sensitivity": VOTE_SENSITIVITY}
    return PrivacyPlan(method="pate", epsilon=epsilon if epsilon_target is None else float(epsilon_target),
                       delta=delta, spends=spends, parameters=parameters)


__all__ = [
    "MAX_QUERIES", "PURPOSE", "THRESHOLD_SENSITIVITY", "VOTE_SENSITIVITY",
    "data_independent_epsilon", "labelling_checkpoints", "max_queries_within", "pate_plan", "pate_spends",
    "threshold_noise_multiplier", "vote_noise_multiplier",
]
