"""AdaDPSyn's accounting (dpcore/adadpsyn/accounting.py, plan.py): the noise the mechanism draws is the noise
charged, the step's Gaussian composition as one Gaussian (also under Poisson sampling, checked in the full
dimension), the plan's epsilon against dp-accounting's PLD and RDP accountants built from the mechanism's
own parameters, the calibration's minimality and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.adadpsyn.accounting import (
    adadpsyn_event,
    effective_noise_multiplier,
    epsilon_for,
    step_event,
    step_event_composed,
    step_mechanisms,
)
from dpcore.adadpsyn.params import PAPER, RADIUS_MAX, PfirrParams
from dpcore.adadpsyn.pfirr import COUNT_SENSITIVITY, average_sensitivity, pfirr
from dpcore.adadpsyn.plan import adadpsyn_plan, calibrate_sigma_avg, pfirr_params
from dpcore.adadpsyn.radius import L_SENSITIVITY
from dpcore.errors import ConfigError
from dpcore.privacy import composition
from dpcore.privacy.composition import SIGMA_TOLERANCE
from dpcore.privacy.events import GaussianDpEvent, steps_parameters

DELTA = 1e-5
TOLERANCE = 0.02  # the brief's agreement with an independent accountant


def _full_path_trace(params: PfirrParams):
    """A trace that takes every update (identical points, a radius search and tests with little noise)."""
    pts = np.repeat(np.random.default_rng(0).dirichlet(np.ones(10))[None, :], 100, axis=0)
    for seed in range(200):
        trace = pfirr(pts, params, np.random.default_rng(seed))
        if len(trace.averages) == params.averages:
            return trace
    raise AssertionError("no trace took every update")


def _trace_multipliers(trace) -> list[float]:
    """Every query's noise std / its sensitivity, as the mechanism drew it."""
    out = [trace.radius_std / L_SENSITIVITY] * len(trace.radius_queries)
    out += [trace.test_std / COUNT_SENSITIVITY] * len(trace.tests)
    out += [a.std / average_sensitivity(a.radius) for a in trace.averages]
    return out


def test_the_noise_drawn_on_the_longest_path_is_the_noise_charged():
    params = PfirrParams(sigma_avg=1.3, sigma_radius=0.05, sigma_test=0.07, shrink=1.0, updates=3)
    drawn = sorted(_trace_multipliers(_full_path_trace(params)))
    charged = sorted(m.noise_multiplier for m in step_mechanisms(params) for _ in range(m.count))
    np.testing.assert_allclose(drawn, charged, rtol=1e-12)
    assert effective_noise_multiplier(params) == pytest.approx(1 / math.sqrt(sum(1 / s ** 2 for s in drawn)), rel=1e-12)
    # the paper's parameters: 6 radius queries at 15, 2 tests at 5, 3 averages at sigma_avg
    expected = 1 / math.sqrt(6 / 15 ** 2 + 2 / 5 ** 2 + 3 / PAPER.sigma_avg ** 2)
    assert effective_noise_multiplier(PAPER) == pytest.approx(expected, rel=1e-12)
    assert step_event(PAPER) == GaussianDpEvent(expected)


def test_unsampled_plan_epsilon_matches_a_pld_of_every_sub_mechanism_composed():
    """q = 1: dp-accounting's PLD of each sub-mechanism at its own noise std and sensitivity (2 sigma_radius on
    2, sigma_test on 1, 2 R sigma_avg on 2R), composed, T times; against the reduced event's epsilon."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    params, steps = PfirrParams(sigma_avg=3.0), 8
    parts = [(L_SENSITIVITY * params.sigma_radius, L_SENSITIVITY, params.radius_queries),
             (COUNT_SENSITIVITY * params.sigma_test, COUNT_SENSITIVITY, params.tests),
             (average_sensitivity(RADIUS_MAX) * params.sigma_avg, average_sensitivity(RADIUS_MAX), params.averages)]
    step = None
    for std, sensitivity, count in parts:
        one = pld.from_gaussian_mechanism(standard_deviation=std, sensitivity=sensitivity,
                                          value_discretization_interval=1e-3).self_compose(count)
        step = one if step is None else step.compose(one)
    independent = step.self_compose(steps).get_epsilon_for_delta(DELTA)
    ours = epsilon_for(params, 1.0, steps, DELTA).epsilon
    assert ours == pytest.approx(independent, rel=TOLERANCE)
    # the composed form of the step, composed by dpcore's accountant, agrees too
    from dpcore.privacy.events import SelfComposedDpEvent

    composed = composition.compose([SelfComposedDpEvent(step_event_composed(params), steps)], DELTA).epsilon
    assert composed == pytest.approx(independent, rel=TOLERANCE)


def test_one_sampled_step_in_the_full_dimension_is_the_sampled_effective_gaussian():
    """Poisson sampling of the whole step, each sub-mechanism a coordinate: Monte Carlo of both hockey-stick
    divergences of ((1 - q) N(0, I) + q N(mu, I), N(0, I)), mu_i = 1 / sigma_i from the noise the mechanism
    draws, against dp-accounting's PLD of ONE sampled Gaussian at the effective noise multiplier."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    from scipy.special import logsumexp

    params, q = PfirrParams(sigma_avg=2.5, sigma_radius=4.0, sigma_test=3.0, shrink=1.0, updates=2), 0.4
    mu = 1 / np.array(sorted(m.noise_multiplier for m in step_mechanisms(params) for _ in range(m.count)))
    rng = np.random.default_rng(1)
    n = 200_000

    def loss(x):  # log P(x) / Q(x), P the mixture, Q = N(0, I)
        shifted = x @ mu - 0.5 * mu @ mu
        return logsumexp(np.stack([np.zeros_like(shifted), shifted]), axis=0, b=np.array([[1 - q], [q]]))

    from_q = rng.standard_normal((n, mu.size))
    from_p = from_q + np.where(rng.random(n) < q, 1.0, 0.0)[:, None] * mu
    sampled = pld.from_gaussian_mechanism(standard_deviation=effective_noise_multiplier(params), sampling_prob=q,
                                          value_discretization_interval=1e-3)
    for eps in (0.1, 0.3, 0.6):
        remove = np.mean(np.maximum(0.0, 1 - np.exp(eps - loss(from_p))))
        add = np.mean(np.maximum(0.0, 1 - np.exp(eps + loss(from_q))))
        assert max(remove, add) == pytest.approx(sampled.get_delta_for_epsilon(eps), rel=0.03, abs=2e-4)


def test_sampled_plan_epsilon_matches_dp_accountings_pld_and_stays_under_its_rdp():
    from dp_accounting import dp_event
    from dp_accounting.pld import privacy_loss_distribution as pld
    from dp_accounting.rdp import rdp_privacy_accountant

    q, steps = 40 / 835, 15  # the authors' TREC rate and T_max
    params = PfirrParams(sigma_avg=0.9)
    sigma = effective_noise_multiplier(params)
    independent = pld.from_gaussian_mechanism(standard_deviation=sigma, sampling_prob=q,
                                              value_discretization_interval=1e-3).self_compose(steps)
    ours = epsilon_for(params, q, steps, DELTA).epsilon
    assert ours == pytest.approx(independent.get_epsilon_for_delta(DELTA), rel=TOLERANCE)
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)),
                                             steps))
    assert ours <= rdp.get_epsilon(DELTA)


def test_the_plan_is_calibrated_minimal_and_holds_what_the_generation_runs_with():
    q, steps, target = 40 / 835, 15, 8.0
    plan = adadpsyn_plan(target, 1 / 5452, q, steps, num_groups=20, top_k=100)
    p = plan.parameters
    assert plan.method == "adadpsyn" and plan.epsilon == target and plan.reads_private_data
    assert p["epsilon_upper"] <= target
    params = pfirr_params(plan)
    assert (params.sigma_radius, params.sigma_test, params.tolerance, params.updates) == (15.0, 5.0, 0.1, 2)
    # one step under the calibrated sigma_avg breaks the target: the smallest noise that meets it
    lower = epsilon_for(params.with_sigma_avg(params.sigma_avg - SIGMA_TOLERANCE), q, steps, 1 / 5452).epsilon
    assert lower > target
    (spend,) = plan.spends
    assert spend.purpose == "adadpsyn"
    assert steps_parameters(spend.event) == ("gaussian", effective_noise_multiplier(params), q, steps)
    assert plan.composed().epsilon == pytest.approx(p["epsilon_upper"])
    assert p["num_subsets"] == 20 and p["top_k"] == 100
    assert [m["count"] for m in p["sub_mechanisms"]] == [6, 2, 3]


def test_refusals_and_the_no_noise_plan():
    # the radius search and the tests alone cost more than this target at q = 1
    with pytest.raises(ConfigError, match="sigma_radius"):
        calibrate_sigma_avg(0.5, DELTA, 1.0, 50)
    with pytest.raises(ConfigError):
        adadpsyn_plan(0.0, DELTA, 0.1, 10)
    free = adadpsyn_plan(math.inf, DELTA, 0.1, 10)
    (spend,) = free.spends
    assert spend.non_private and free.parameters["noise_multiplier"] == 0.0
    assert composition.compose(free.events(), DELTA).epsilon == math.inf
    assert adadpsyn_event(pfirr_params(free), 0.1, 10) == spend.event
