"""DP-OPT's privacy accounting as events, and its plan (Hong et al. 2024, Section 4 and Theorem 1's setting).

One token step (`dpcore.dp_opt.selection`): a Poisson sample of the generation records at rate q, a disjoint
keyed partition into M subsets, one vote per subset and a noisy argmax of scale 2 sigma over the vote histogram
(L_inf sensitivity 1): a pure 1/sigma-DP step on the sample, `ReportNoisyMaxDpEvent(sigma)`, amplified by the
Poisson sampling: `PoissonSampledDpEvent(q, ReportNoisyMaxDpEvent(sigma))` (epsilon' = log(1 + q (e^{1/sigma} - 1)),
`dpcore.privacy.composition.rnm_step_epsilon`).

A run: J candidate instructions of at most T tokens each, every step with a fresh sample, composed adaptively:
`SelfComposedDpEvent(step, J T)` (a candidate that stops early spends less; the plan charges J T). With J > 1
the candidates are scored on a disjoint holdout and one is kept by the exponential mechanism:
`ReportNoisyMaxDpEvent(sigma_sel)` (q = 1, one step).

The authors compose the token steps by RDP (autodp: the RDP of an epsilon_0-DP step, Poisson-subsampled) with
the limited-domain delta_0 added per step, and take the holdout selection in parallel (max). Here: the steps are
pure DP (no delta_0), composed through `dpcore.privacy.composition` (PRV / PLD / the exact randomised-response
form; tighter than RDP); the selection is composed sequentially with the generation (the ledger composes every
spend of a plan: a sound upper bound of the parallel composition), with `selection_share` of the target epsilon
(its own 1/sigma_sel), and the token noise calibrated so that the whole plan meets the target.
"""

from __future__ import annotations

import math

from dpcore.dp_opt.presets import DpOptParams
from dpcore.dp_opt.sampling import sampling_rate
from dpcore.errors import ConfigError, check_positive
from dpcore.privacy import composition
from dpcore.privacy.events import ComposedDpEvent, DpEvent, sampled_steps_event
from dpcore.privacy.plan import PrivacyPlan
from dpcore.privacy.spend import Spend

METHOD = "dp-opt"       # the plan's name and the ledger purpose of its spends
MECHANISM = "rnm"       # a pure 1/sigma-DP noisy argmax (`ReportNoisyMaxDpEvent`)


def token_event(noise_multiplier: float, rate: float) -> DpEvent:
    """One token step: `PoissonSampledDpEvent(q, ReportNoisyMaxDpEvent(sigma))`."""
    return sampled_steps_event(MECHANISM, noise_multiplier, rate, 1).event


def generation_event(noise_multiplier: float, rate: float, max_tokens: int, candidates: int = 1) -> DpEvent:
    """J candidates of T token steps: `SelfComposedDpEvent(token_event, J T)`."""
    return sampled_steps_event(MECHANISM, noise_multiplier, rate, int(max_tokens) * int(candidates))


def selection_event(noise_multiplier: float) -> DpEvent:
    """The candidate choice on the holdout: one `ReportNoisyMaxDpEvent(sigma_sel)` on all of it (q = 1)."""
    return sampled_steps_event(MECHANISM, noise_multiplier, 1.0, 1)


def dp_opt_spends(noise_multiplier: float, rate: float, max_tokens: int, candidates: int = 1,
                  selection_noise_multiplier: float | None = None) -> tuple[Spend, ...]:
    """The spends the ledger charges: the token steps, and (J > 1) the candidate choice."""
    spends = [Spend(generation_event(noise_multiplier, rate, max_tokens, candidates), METHOD,
                    f"DP-OPT instruction tokens: {candidates} candidate(s) x {max_tokens} noisy-argmax votes of "
                    "Poisson-sampled subsets")]
    if candidates > 1:
        if selection_noise_multiplier is None:
            raise ConfigError("dp-opt: several candidates need the selection's noise multiplier")
        spends.append(Spend(selection_event(selection_noise_multiplier), METHOD,
                            "DP-OPT candidate choice: exponential mechanism on holdout correct counts"))
    return tuple(spends)


def dp_opt_epsilon(noise_multiplier: float, rate: float, max_tokens: int, delta: float, candidates: int = 1,
                   selection_noise_multiplier: float | None = None) -> float:
    """Epsilon at delta of `dp_opt_spends`: exactly what the ledger charges for them."""
    spends = dp_opt_spends(noise_multiplier, rate, max_tokens, candidates, selection_noise_multiplier)
    return composition.compose([s.event for s in spends], delta).epsilon


def dp_opt_plan(epsilon: float, delta: float, max_tokens: int, subsets: int, *, shots: int, records: int,
                candidates: int = 1, selection_share: float = 0.1) -> PrivacyPlan:
    """DP-OPT's plan at a target epsilon: the smallest token noise sigma (calibrated, `composition.calibrate`) with
    compose(tokens [+ selection]) <= epsilon at delta; q = min(1, M k / n) with n = `records`, the public count of
    the records the generation reads (the holdout excluded). J > 1: sigma_sel = 1 / (selection_share epsilon).

    epsilon = inf: no noise (sigma = 0), an infinite spend. `parameters`: noise_multiplier,
    selection_noise_multiplier, sampling_rate, steps, max_tokens, candidates, subsets, shots, records,
    per_token_epsilon (epsilon' of one sampled step), epsilon_upper (the composition at sigma)."""
    target = float(epsilon)
    if math.isnan(target) or target <= 0:
        raise ConfigError(f"dp-opt epsilon must be > 0 or inf, got {epsilon}")
    probe = DpOptParams(subsets=subsets, shots=shots, max_tokens=max_tokens, candidates=candidates,
                        selection_share=selection_share)  # validates the counts and the share
    q = sampling_rate(probe.subsets, probe.shots, int(records))
    if math.isinf(target):
        sigma, sigma_sel, upper = 0.0, (0.0 if candidates > 1 else None), math.inf
    else:
        target = check_positive("epsilon", target)
        sigma_sel = 1.0 / (selection_share * target) if candidates > 1 else None
        fixed = [selection_event(sigma_sel)] if sigma_sel is not None else []

        def family(sigma: float) -> DpEvent:
            return ComposedDpEvent([generation_event(sigma, q, max_tokens, candidates), *fixed])

        result = composition.calibrate(family, target, delta)
        sigma, upper = result.noise_multiplier, result.composition.epsilon
    spends = dp_opt_spends(sigma, q, max_tokens, candidates, sigma_sel)
    parameters = {"noise_multiplier": sigma, "selection_noise_multiplier": sigma_sel, "sampling_rate": q,
                  "steps": max_tokens * candidates, "max_tokens": max_tokens, "candidates": candidates,
                  "subsets": subsets, "shots": shots, "records": int(records), "selection_share": selection_share,
                  "per_token_epsilon": (composition.rnm_step_epsilon(sigma, q) if sigma > 0 else math.inf),
                  "epsilon_upper": upper}
    return PrivacyPlan(method=METHOD, epsilon=target, delta=delta, spends=spends, parameters=parameters)


def planned_params(plan: PrivacyPlan, params: DpOptParams) -> DpOptParams:
    """`params` with the plan's noise multipliers (and its T, J, M, k checked against the plan's)."""
    p = plan.parameters
    for name in ("max_tokens", "candidates", "subsets", "shots"):
        if p[name] != getattr(params, name):
            raise ConfigError(f"dp-opt: the plan was made for {name} = {p[name]}, the run asks {getattr(params, name)}")
    return params.with_noise(p["noise_multiplier"], p["selection_noise_multiplier"] or 0.0)
