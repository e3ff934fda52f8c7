"""DP-ICL's privacy (Wu et al. 2024): what a reviewer of the paper asks of the mechanism and its accounting.

The histogram's sensitivity, brute force (add or remove one record: the vote histogram moves by at most the
sqrt(2) the accountant uses); the noise drawn has the std the accountant assumes; the plan's epsilon agrees with
dp-accounting's own PLD and RDP accountants built from the mechanism's parameters; `queries_within` is monotone
and exact at its boundary; the keyed-hash sampler includes each record with probability q, independently across
records and draws, and is neighbour-stable (adding a record moves no other record).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy import stats

from dpcore.dp_icl import aggregation, presets, privacy, subsets
from dpcore.errors import ConfigError
from dpcore.privacy import composition
from dpcore.privacy.events import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent

DELTA = 1e-5


def _ids(n: int, prefix: str = "rec") -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def _key(seed: int = 0) -> bytes:
    return subsets.run_key(np.random.default_rng(seed))


# ---------------------------------------------------------------- sampler and partition


def test_subsets_are_disjoint_at_most_k_and_independent_of_record_order():
    ids, key = _ids(400), _key(1)
    drawn = subsets.draw_subsets(ids, key, 3, 10, 4, 0.1)
    used = drawn.ids()
    assert drawn.count == 10 and max(len(d) for d in drawn.demos) <= 4
    assert len(used) == len(set(used)) and set(used) <= set(ids)
    assert subsets.draw_subsets(list(reversed(ids)), key, 3, 10, 4, 0.1) == drawn
    assert subsets.draw_subsets(ids, key, 4, 10, 4, 0.1) != drawn          # a fresh subsample per draw
    assert subsets.draw_subsets(ids, _key(2), 3, 10, 4, 0.1) != drawn      # the key comes from the generator


def test_inclusion_rate_is_q_and_subsets_are_uniform():
    n, q, m = 20_000, 0.05, 10
    ids, key = _ids(n), _key(3)
    draws = [[subsets.record_draw(key, 0, rid, m) for rid in ids]]
    threshold = subsets.inclusion_threshold(q)
    included = np.array([p < threshold for _, p in draws[0]])
    sd = math.sqrt(n * q * (1 - q))
    assert abs(included.sum() - n * q) < 4 * sd
    buckets = np.array([b for b, _ in draws[0]])[included]
    counts = np.bincount(buckets, minlength=m)
    assert stats.chisquare(counts).pvalue > 1e-3                        # subsets uniform among included
    # q = 1 keeps everything; q out of (0, 1] is refused
    assert subsets.inclusion_threshold(1.0) == 2**64
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ConfigError):
            subsets.inclusion_threshold(bad)


def test_inclusion_is_independent_across_records_and_draws():
    """Pairs of records, and one record in consecutive draws, are both included at rate q^2 (not more: a shared
    hash would correlate them), and each draw's sample size has the binomial variance n q (1 - q)."""
    n, q, draws = 300, 0.2, 200
    ids, key = _ids(n), _key(4)
    threshold = subsets.inclusion_threshold(q)
    x = np.array([[subsets.record_draw(key, t, rid, 5)[1] < threshold for rid in ids] for t in range(draws)],
                 dtype=float)
    assert abs(x.mean() - q) < 4 * math.sqrt(q * (1 - q) / x.size)
    pairs = x[:, 0::2] * x[:, 1::2]                                     # disjoint record pairs
    assert abs(pairs.mean() - q * q) < 4 * math.sqrt(q * q * (1 - q * q) / pairs.size)
    consecutive = x[:-1] * x[1:]
    assert abs(consecutive.mean() - q * q) < 4 * math.sqrt(q * q * (1 - q * q) / consecutive.size)
    sizes = x.sum(axis=1)
    ratio = sizes.var(ddof=1) / (n * q * (1 - q))
    assert stats.chi2(draws - 1).ppf(0.0005) / (draws - 1) < ratio < stats.chi2(draws - 1).ppf(0.9995) / (draws - 1)


def test_adding_a_record_moves_no_other_record():
    """Neighbour stability: on D plus x every draw's subsets equal D's but in the one subset x's hash names
    (and are equal outright when x is not sampled)."""
    ids, key, m = _ids(200), _key(5), 5
    rate = subsets.sampling_rate(m, 4, len(ids))
    moved_any = False
    for extra in ["new-a", "new-b", "new-c"]:
        for t in range(60):
            base = subsets.draw_subsets(ids, key, t, m, 4, rate)
            more = subsets.draw_subsets(ids + [extra], key, t, m, 4, rate)
            bucket, priority = subsets.record_draw(key, t, extra, m)
            changed = [j for j in range(m) if base.demos[j] != more.demos[j]]
            if priority >= subsets.inclusion_threshold(rate):
                assert changed == []
            else:
                assert changed in ([], [bucket])
                moved_any = moved_any or bool(changed)
            for rid in ids:  # every other record's own draw is unchanged
                assert (rid in more.ids()) == (rid in base.ids()) or (rid in base.demos[bucket])
    assert moved_any


@pytest.mark.parametrize("subsets_, shots, records", [(10, 4, 39), (0, 4, 100), (10, 0, 100)])
def test_too_few_records_or_bad_sizes_are_errors(subsets_, shots, records):
    with pytest.raises(ConfigError):
        subsets.sampling_rate(subsets_, shots, records)


# ---------------------------------------------------------------- sensitivity (brute force)


def _vote(demos: tuple[str, ...], query: int, classes: int) -> int:
    """An adversarial vote: any change of a prompt may change it (a hash of the prompt and the query)."""
    digest = hashlib.sha256(repr((demos, query)).encode()).digest()
    return digest[0] % classes


def _histograms(ids, key, m, k, rate, queries, classes):
    votes = np.array([[_vote(demos, i, classes) for demos in subsets.draw_subsets(ids, key, i, m, k, rate).demos]
                      for i in range(queries)]).T
    return aggregation.vote_histograms(votes, classes)


@pytest.mark.parametrize("change", ["add", "remove"])
def test_vote_histogram_sensitivity_is_at_most_sqrt2(change):
    m, k, classes, queries = 6, 3, 4, 80
    ids, key = _ids(60), _key(6)
    rate = subsets.sampling_rate(m, k, len(ids))
    base = _histograms(ids, key, m, k, rate, queries, classes)
    assert (base.sum(axis=1) == m).all()                                # every subset votes
    largest = 0.0
    for r in range(8):
        other = ids + [f"added-{r}"] if change == "add" else [i for i in ids if i != ids[r * 7]]
        diff = _histograms(other, key, m, k, rate, queries, classes) - base
        largest = max(largest, float(np.linalg.norm(diff, axis=1).max()))
    assert largest <= aggregation.VOTE_SENSITIVITY + 1e-12
    assert largest == pytest.approx(math.sqrt(2))                       # the bound is reached: it is tight


# ---------------------------------------------------------------- noise


def test_noise_drawn_is_gaussian_at_sigma_times_sensitivity():
    plan = privacy.dp_icl_plan(None, DELTA, 200, 1000, subsets=10, shots=4, noise_multiplier=1.3)
    std = plan.parameters["noise_std"]
    sigma = plan.parameters["noise_multiplier"]
    # the std drawn is the accountant's multiplier times the sensitivity it assumes
    assert std == pytest.approx(sigma * math.sqrt(2))
    event = plan.spends[0].event
    assert event.event.event.noise_multiplier * aggregation.VOTE_SENSITIVITY == pytest.approx(std)
    counts = np.zeros((20_000, 3))
    noise = aggregation.noisy_histograms(counts, std, np.random.default_rng(7)).ravel()
    assert stats.kstest(noise / std, "norm").pvalue > 1e-3
    assert noise.std() == pytest.approx(std, rel=0.02)


def test_rnm_picks_the_noisy_argmax_with_the_gaussian_probability():
    """Two classes at counts (6, 4), std s: class 0 wins with probability Phi(2 / (s sqrt 2))."""
    std, n = 1.7, 40_000
    hist = np.tile([6.0, 4.0], (n, 1))
    answers = aggregation.rnm_gaussian(hist, std, np.random.default_rng(8))
    expected = stats.norm.cdf(2.0 / (std * math.sqrt(2)))
    assert abs((answers == 0).mean() - expected) < 4 * math.sqrt(expected * (1 - expected) / n)
    again = aggregation.rnm_gaussian(hist[:50], std, np.random.default_rng(8))
    assert again.tolist() == answers[:50].tolist()                      # deterministic in the generator
    assert aggregation.rnm_gaussian(hist[:3], 0.0, np.random.default_rng(0)).tolist() == [0, 0, 0]


# ---------------------------------------------------------------- accounting


@pytest.mark.parametrize("epsilon, queries, records", [(1.0, 500, 2000), (4.0, 300, 800)])
def test_plan_epsilon_matches_dp_accountings_accountants(epsilon, queries, records):
    """The calibrated plan composes within its target, and dp-accounting's PLD accountant, built from the
    mechanism (std s on a histogram of L2 sensitivity sqrt(2), Poisson rate M k / |D|, Q queries), agrees with
    the plan's epsilon within 2%; its RDP accountant is an upper bound no smaller."""
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    plan = privacy.dp_icl_plan(epsilon, DELTA, queries, records, subsets=10, shots=4)
    assert plan.method == "dp-icl" and plan.spends[0].purpose == "dp-icl"
    composed = plan.composed().epsilon
    assert composed <= epsilon
    std, q = plan.parameters["noise_std"], 10 * 4 / records
    event = SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(std / math.sqrt(2))), queries)
    pld = PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA)
    assert pld == pytest.approx(composed, rel=0.02)
    rdp = RdpAccountant().compose(event).get_epsilon(DELTA)
    assert rdp >= composed * 0.98
    # calibrated, not merely valid: a little less noise breaks the target
    t = plan.parameters["draws"]
    less = composition.compose([privacy.dp_icl_event(plan.parameters["noise_multiplier"] - 2e-3, q, t)], DELTA)
    assert less.epsilon > epsilon


def test_a_shared_draw_is_one_gaussian_of_multiplier_sigma_over_sqrt_b():
    """B Gaussian steps of multiplier sigma on one subsample compose exactly to one of sigma / sqrt(B)."""
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    sigma, b = 3.0, 4
    composed_b = PLDAccountant(value_discretization_interval=1e-4).compose(
        SelfComposedDpEvent(GaussianDpEvent(sigma), b)).get_epsilon(DELTA)
    one = PLDAccountant(value_discretization_interval=1e-4).compose(
        GaussianDpEvent(privacy.draw_noise_multiplier(sigma, b))).get_epsilon(DELTA)
    assert one == pytest.approx(composed_b, rel=0.01)
    plan = privacy.dp_icl_plan(None, DELTA, 10, 400, subsets=10, shots=4, queries_per_draw=b, noise_multiplier=sigma)
    assert plan.parameters["draws"] == 3 and plan.spends[0].steps == 3
    assert plan.spends[0].noise_multiplier == pytest.approx(sigma / 2)


def test_queries_within_is_exact_at_its_boundary_and_monotone():
    records, sigma = 400, 2.0
    kwargs = {"subsets": 10, "shots": 4}
    q = privacy.queries_within(1.0, DELTA, sigma, records, **kwargs)
    rate = subsets.sampling_rate(10, 4, records)
    assert q >= 1
    assert privacy.dp_icl_epsilon(sigma, rate, q, DELTA) <= 1.0 < privacy.dp_icl_epsilon(sigma, rate, q + 1, DELTA)
    assert privacy.queries_within(0.5, DELTA, sigma, records, **kwargs) <= q <= \
        privacy.queries_within(2.0, DELTA, sigma, records, **kwargs)
    assert q <= privacy.queries_within(1.0, DELTA, 2.5, records, **kwargs)
    assert privacy.queries_within(1.0, DELTA, sigma, records, limit=5, **kwargs) == min(5, q)
    # three queries per draw: a multiple of 3 affordable, one query more needs a draw more
    q3 = privacy.queries_within(1.0, DELTA, 4.0, records, queries_per_draw=3, **kwargs)
    assert q3 >= 3 and q3 % 3 == 0
    assert privacy.dp_icl_epsilon(4.0, rate, q3, DELTA, 3) <= 1.0 < privacy.dp_icl_epsilon(4.0, rate, q3 + 1, DELTA, 3)
    assert privacy.queries_within(0.01, DELTA, 0.3, records, **kwargs) == 0


def test_batch_spends_compose_to_the_plans_charge():
    plan = privacy.dp_icl_plan(None, DELTA, 10, 400, subsets=10, shots=4, queries_per_draw=4, noise_multiplier=2.0)
    batches = [(0, 3), (3, 2), (5, 5)]                                  # draws begun: 1 (q0), 1 (q4), 1 (q8)
    spends = [privacy.batch_spend(plan, first, n) for first, n in batches]
    assert [s.steps for s in spends] == [1, 1, 1]
    together = composition.compose([s.event for s in spends], DELTA).epsilon
    assert together == pytest.approx(plan.composed().epsilon, rel=1e-9)
    assert privacy.batch_spend(plan, 1, 2).steps is None                # inside a draw already charged
    assert composition.compose([privacy.batch_spend(plan, 1, 2).event], DELTA).epsilon == 0.0
    with pytest.raises(ConfigError, match="covers 10"):
        privacy.batch_spend(plan, 8, 3)


def test_plan_inputs_and_the_non_private_plan():
    infinite = privacy.dp_icl_plan(math.inf, DELTA, 10, 400, subsets=10, shots=4)
    assert infinite.spends[0].non_private and infinite.parameters["noise_std"] == 0.0
    with pytest.raises(ConfigError):
        privacy.dp_icl_plan(1.0, DELTA, 10, 400, subsets=10, shots=4, noise_multiplier=1.0)
    with pytest.raises(ConfigError):
        privacy.dp_icl_plan(None, DELTA, 10, 400, subsets=10, shots=4)
    with pytest.raises(ConfigError):
        privacy.dp_icl_plan(1.0, DELTA, 0, 400, subsets=10, shots=4)
    with pytest.raises(ConfigError, match="exceeds"):
        privacy.dp_icl_plan(1.0, DELTA, 10, 30, subsets=10, shots=4)


def test_presets_are_the_papers_ensemble():
    for name in ("cpu", "gpu"):
        _, values = presets.preset(name)
        assert (values["subsets"], values["shots"], values["queries_per_draw"]) == (10, 4, 1)
    assert presets.preset("auto", "cuda")[0] == "gpu" and presets.preset("auto", "cpu")[0] == "cpu"
    with pytest.raises(ValueError):
        presets.preset("tpu")
