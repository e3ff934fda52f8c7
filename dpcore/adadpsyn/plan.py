"""AdaDPSyn's privacy plan: sigma_avg calibrated to a target epsilon, the radius search's and the tests'
noise fixed at the paper's values (Gao et al. 2024; the authors vary sigma_avg only, `trec_eps_8.sh`,
`privacy_analysis.py`).

The spend is one label's T token steps, each Poisson-sampled at q = MN/|D_y| (the largest q over the
labels: labels compose in parallel, as for Tang et al.'s Algorithm 1, `dpcore.fewshot.plan`), each the
Gaussian composition of PFIRR's sub-mechanisms (`dpcore.adadpsyn.accounting`): a `Spend.sampled_steps` of
the "gaussian" kind at the effective noise multiplier, so the ledger shows and composes it like Tang's.
The radius search and the tests cost a fixed share of every step whatever sigma_avg is; a target below
what that share alone costs is refused (raise sigma_radius and sigma_test, publicly, or the target).
"""

from __future__ import annotations

import math

from dpcore.adadpsyn.accounting import (
    MECHANISM,
    adadpsyn_event,
    effective_noise_multiplier,
    epsilon_for,
    step_mechanisms,
)
from dpcore.adadpsyn.params import PAPER, PfirrParams
from dpcore.errors import ConfigError
from dpcore.privacy import composition
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

METHOD = "adadpsyn"   # the plan's name (`dpcore.names.Method`)
PURPOSE = "adadpsyn"  # the ledger purpose of its spend


def calibrate_sigma_avg(epsilon: float, delta: float, sampling_rate: float, steps: int,
                        hyper: PfirrParams = PAPER, *, cache=True) -> tuple[PfirrParams, composition.Composition]:
    """The smallest sigma_avg (to `composition.SIGMA_TOLERANCE`) whose T sampled steps, with `hyper`'s other
    parameters, stay within `epsilon` at `delta`: (the parameters with it, their composition).
    `composition.calibrate` over sigma_avg -> `adadpsyn_event`. ConfigError when even sigma_avg at the search's
    top (`composition.SIGMA_MAX`) breaks the target: the radius search and the tests alone cost more."""
    floor = epsilon_for(hyper.with_sigma_avg(composition.SIGMA_MAX), sampling_rate, steps, delta, cache=cache)
    if floor.epsilon > epsilon:
        raise ConfigError(
            f"adadpsyn: target epsilon {epsilon:g} is unreachable: the radius search (sigma_radius = "
            f"{hyper.sigma_radius:g}) and the coverage tests (sigma_test = {hyper.sigma_test:g}) alone cost "
            f"epsilon {floor.epsilon:.3g} at q = {sampling_rate:.3g}, T = {steps}: raise them or the target")
    result = composition.calibrate(lambda sigma: adadpsyn_event(hyper.with_sigma_avg(sigma), sampling_rate, steps),
                                   epsilon, delta, cache=cache)
    return hyper.with_sigma_avg(result.noise_multiplier), result.composition


def adadpsyn_plan(epsilon: float, delta: float, q: float, T: int, *, hyper: PfirrParams = PAPER,
                  num_groups: int | None = None, top_k: int | None = None, purpose: str = PURPOSE,
                  cache=True) -> PrivacyPlan:
    """AdaDPSyn's `PrivacyPlan` for target `epsilon` at `delta`: T token steps Poisson-sampled at rate `q`
    (q = max over labels of MN/|D_y|, T = max_tokens x demos per label), sigma_avg calibrated
    (`calibrate_sigma_avg`), the other PFIRR parameters `hyper`'s (the paper's by default).

    epsilon = inf: no noise anywhere (sigma_avg = sigma_radius = sigma_test = 0), an infinite spend.
    `parameters` holds every PFIRR parameter (`pfirr_params` rebuilds them), the effective noise
    multiplier, q, T, the accountant's epsilon and each sub-mechanism's count, multiplier and sensitivity;
    `num_groups` (M) and `top_k` (K) are recorded when given. ConfigError for a bad input or an
    unreachable target."""
    target = float(epsilon)
    if math.isnan(target) or target <= 0:
        raise ConfigError(f"adadpsyn epsilon must be > 0 or inf, got {epsilon!r}")
    if math.isinf(target):
        params = PfirrParams(sigma_avg=0.0, sigma_radius=0.0, sigma_test=0.0, tolerance=hyper.tolerance,
                             coverage=hyper.coverage, shrink=hyper.shrink, test_fraction=hyper.test_fraction,
                             updates=hyper.updates)
        epsilon_upper = math.inf
        what = "AdaDPSyn token steps without noise"
    else:
        params, composed = calibrate_sigma_avg(target, delta, q, T, hyper, cache=cache)
        epsilon_upper = composed.epsilon
        what = "AdaDPSyn token steps (PFIRR: radius search, coverage tests, DP averages)"
    sigma_eff = effective_noise_multiplier(params)
    spend = Spend(adadpsyn_event(params, q, T), purpose, what)
    parameters = {
        "mechanism": MECHANISM, "noise_multiplier": sigma_eff, "sampling_rate": float(q), "steps": int(T),
        "epsilon_upper": epsilon_upper,
        "sigma_avg": params.sigma_avg, "sigma_radius": params.sigma_radius, "sigma_test": params.sigma_test,
        "tolerance": params.tolerance, "coverage": params.coverage, "shrink": params.shrink,
        "test_fraction": params.test_fraction, "updates": params.updates,
        "sub_mechanisms": [{"name": m.name, "count": m.count, "noise_multiplier": m.noise_multiplier,
                            "sensitivity": m.sensitivity} for m in step_mechanisms(params)],
    }
    if num_groups is not None:
        parameters["num_subsets"] = int(num_groups)
    if top_k is not None:
        parameters["top_k"] = int(top_k)
    return PrivacyPlan(method=METHOD, epsilon=target, delta=delta, spends=(spend,), parameters=parameters)


def pfirr_params(plan: PrivacyPlan) -> PfirrParams:
    """The PFIRR parameters a plan was made for (what the generation runs with)."""
    p = plan.parameters
    return PfirrParams(sigma_avg=p["sigma_avg"], sigma_radius=p["sigma_radius"], sigma_test=p["sigma_test"],
                       tolerance=p["tolerance"], coverage=p["coverage"], shrink=p["shrink"],
                       test_fraction=p["test_fraction"], updates=p["updates"])


__all__ = ["METHOD", "PURPOSE", "adadpsyn_plan", "calibrate_sigma_avg", "pfirr_params"]
