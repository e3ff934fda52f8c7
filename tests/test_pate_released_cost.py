"""PromptPATE's data-dependent accounting (`--accounting data-dependent`, Papernot et al. 2018): the release and
its failure probability charged before any teacher votes, the labelling at the released upper bound on its cost
before any label is published (below the true cost in at most delta0 of the draws), refused without publishing
over the epsilon asked, and a settled run released through the gate on its ledger entries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pipeline_support import home, mini_agnews, prefect_harness, share_tiny_model  # noqa: F401
from scipy.special import ndtri

from dpcore.audit.config import AuditConfig
from dpcore.errors import BudgetExceededError, ConfigError
from dpcore.pate import data_dependent as dd
from dpcore.pate import released_cost as rc
from dpcore.pate import smooth_sensitivity as gnss
from dpcore.privacy.composition import compose, renyi_epsilon
from dpcore.privacy.events import (
    BoundFailureDpEvent,
    ComposedDpEvent,
    PoissonSampledDpEvent,
    RenyiDpEvent,
    SelfComposedDpEvent,
    event_from_json,
    event_to_json,
)

DELTA = 1e-5


def test_the_default_order_is_the_largest_where_the_analysis_applies():
    release = rc.release_parameters(20.0, 4, DELTA)
    assert all(gnss.check_conditions(20.0, 4, release.order))
    assert not all(gnss.check_conditions(20.0, 4, release.order + 1))
    assert release.sigma_ss == 10.0 and release.delta0 == DELTA * rc.DELTA0_FRACTION
    assert release.cost == gnss.gnss_rdp(release.beta, 10.0, release.order)


def test_the_default_beta_keeps_the_bound_s_noise_at_most_twice_sigma_ss():
    for sigma2, classes, delta in ((20.0, 4, DELTA), (50.0, 2, 1e-8), (10.0, 2, 1e-3)):
        release = rc.release_parameters(sigma2, classes, delta)
        z = -ndtri(release.delta0)
        assert release.beta == pytest.approx(min(rc.BETA_FRACTION / release.order,
                                                 math.log1p(rc.SHIFT_GROWTH / (z * release.sigma_ss))))
        shift, scale = gnss.upper_bound_factors(release.beta, release.sigma_ss, release.delta0)
        assert 1.0 < scale <= 2.0 + 1e-12 and shift / (scale * release.sigma_ss) == pytest.approx(z, rel=1e-12)


@pytest.mark.parametrize("kwargs, needle", [
    ({"order": 40.0}, "--pate-gnss-order"),            # condition C6 fails at sigma2 20
    ({"order": 10.0, "beta": 0.05}, "--pate-gnss-beta"),  # beta must stay below 1 / (2 order)
    ({"order": 10.0, "beta": 0.04}, "--pate-gnss-beta"),  # no finite shift: z sigma_ss (e^beta - 1) >= 1
    ({"sigma_ss": 0.0}, "--pate-gnss-sigma"),
    ({"delta0": DELTA}, "--pate-gnss-delta0"),          # delta0 is part of delta: below it
])
def test_release_parameters_outside_the_analysis_are_refused(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        rc.release_parameters(20.0, 2, DELTA, **kwargs)


def _plan(target: float = 8.0):
    return rc.data_dependent_plan(epsilon_target=target, delta=DELTA, queries=100, threshold_sigma=5.0,
                                  vote_sigma=20.0, teachers=200, threshold=180.0,
                                  release=rc.release_parameters(20.0, 2, DELTA))


def test_the_plan_charges_the_release_and_its_failure_and_settles_the_labelling_against_the_target():
    plan = _plan()
    release = rc.release_parameters(20.0, 2, DELTA)
    order = plan.parameters["gnss_order"]
    assert [s.event for s in plan.spends] == [RenyiDpEvent(order, release.cost), BoundFailureDpEvent(DELTA / 2)]
    assert plan.epsilon == 8.0 and plan.parameters["gnss_delta0"] == DELTA / 2
    assert plan.parameters["epsilon_release"] == compose([s.event for s in plan.spends], DELTA).epsilon
    settled = rc.settled_plan(plan, 0.5)
    assert [s.event for s in settled.spends] == [*(s.event for s in plan.spends), RenyiDpEvent(order, 0.5)]
    # what the run spent: both Renyi guarantees added at the order, converted once at delta - delta0
    # (Canonne et al. 2020), delta0 being the released bound's failure probability
    rest = DELTA - DELTA / 2
    expected = release.cost + 0.5 + math.log1p(-1 / order) - math.log(rest * order) / (order - 1)
    assert settled.epsilon == pytest.approx(expected, rel=1e-12) and settled.parameters["released_rdp"] == 0.5
    with pytest.raises(BudgetExceededError, match="no label is published"):
        rc.settled_plan(plan, 50.0)


@pytest.mark.parametrize("target", [math.inf, 0.5])
def test_an_infinite_target_or_one_the_release_alone_exceeds_is_refused(target):
    with pytest.raises(ConfigError, match="--pate-accounting data-dependent"):
        _plan(target)


def test_the_released_cost_is_the_gnss_release_of_every_repeat_stacked():
    histograms = np.array([[30, 0], [29, 1], [20, 10], [28, 2]])
    answered = [np.array([True, True, False, True]), np.array([True, False, False, True])]
    release = rc.release_parameters(20.0, 2, DELTA)
    got = rc.released_labelling_rdp(histograms, answered, teachers=30, threshold=25.0, sigma1=5.0, sigma2=20.0,
                                    delta=DELTA, release=release, rng=np.random.default_rng(4))
    direct = gnss.release_data_dependent_epsilon(
        np.concatenate([histograms] * 2), np.concatenate(answered), teachers=30, threshold=25.0, sigma1=5.0,
        sigma2=20.0, delta=DELTA, order=release.order, beta=release.beta, sigma_ss=release.sigma_ss,
        delta0=release.delta0, rng=np.random.default_rng(4))
    assert got == direct.rdp_released


# --------------------------------------------------------------------------- the charge is a bound

# Fixed vote histograms (E teachers, answered masks of one repeat): high consensus, mixed, near the threshold.
BOUND_CASES = [
    ("consensus", [[200, 0], [198, 2], [195, 5], [190, 10], [199, 1], [193, 7]], [True] * 6, 200, 180.0, 5.0, 20.0),
    ("mixed", [[181, 9, 5, 5], [150, 30, 10, 10], [179, 21, 0, 0], [100, 100, 0, 0], [190, 4, 3, 3],
               [175, 10, 10, 5]], [True, False, True, False, True, False], 200, 180.0, 5.0, 20.0),
    ("cpu preset", [[18, 2], [12, 8], [20, 0], [15, 5], [17, 3]], [True, False, True, False, True], 20, 18.0, 10.0,
     10.0),
]
DRAWS = 20_000
BOUND_DELTA0 = 0.05


@pytest.mark.parametrize("case", BOUND_CASES, ids=[c[0] for c in BOUND_CASES])
def test_the_charged_bound_falls_below_the_true_cost_in_at_most_delta0_of_draws(case):
    """The labelling's charge (`released_labelling_rdp`, what `settled_plan` charges and decides on) drawn
    DRAWS times on fixed votes: below the true data-dependent RDP R(D) in at most delta0 of the draws (a
    binomial test at 3.5 standard deviations), and not far more conservative than asked. An estimate centred
    on R(D) falls below it about half the time. R(D) and SS_beta(D) are functions of the votes; only the
    release's noise varies: the first draws go through `released_labelling_rdp` whole, and its arithmetic
    (`shifted_release`) takes the rest at once on the same stream of normals."""
    _, votes, answered, teachers, threshold, sigma1, sigma2 = case
    votes, answered = np.array(votes), np.array(answered)
    release = rc.release_parameters(sigma2, votes.shape[1], delta=0.2, delta0=BOUND_DELTA0)
    truth = dd.data_dependent_epsilon(votes, threshold, sigma1, sigma2, 1e-5, orders=[release.order],
                                      answered=answered).rdp[0]
    ss = gnss.smooth_sensitivity(votes, answered, teachers=teachers, threshold=threshold, sigma1=sigma1,
                                 sigma2=sigma2, order=release.order, beta=release.beta)
    assert truth > 0 and ss > 0  # the draws can fall below: the test can fail
    rng = np.random.default_rng(2024)
    whole = [rc.released_labelling_rdp(votes, [answered], teachers=teachers, threshold=threshold, sigma1=sigma1,
                                       sigma2=sigma2, delta=1e-5, release=release, rng=rng) for _ in range(20)]
    noise = np.random.default_rng(2024).standard_normal(DRAWS)
    charged = gnss.shifted_release(truth, ss, noise, beta=release.beta, sigma_ss=release.sigma_ss,
                                   delta0=release.delta0)
    np.testing.assert_allclose(charged[:20], whole, rtol=1e-12)
    below = float(np.mean(charged < truth))
    spread = 3.5 * math.sqrt(BOUND_DELTA0 * (1 - BOUND_DELTA0) / DRAWS)
    assert below <= BOUND_DELTA0 + spread
    assert below >= BOUND_DELTA0 - spread  # exactly delta0 in law while the clip at 0 is not reached


def _neighbour(votes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One teacher's prompt changed: in every query its vote may move from one class to another."""
    out = votes.copy()
    for row in out:
        src = rng.choice(np.flatnonzero(row > 0))
        row[src] -= 1
        row[rng.integers(len(row))] += 1
    return out


@pytest.mark.parametrize("case", BOUND_CASES[:2], ids=[c[0] for c in BOUND_CASES[:2]])
def test_the_shifted_function_s_local_sensitivity_is_within_its_smooth_bound(case):
    """What makes the shifted release a GNSS release: on neighbouring vote histograms SS_beta is beta-smooth
    (SS(D') <= e^beta SS(D)) and f = R + k SS moves by at most c SS(D)."""
    _, votes, answered, teachers, threshold, sigma1, sigma2 = case
    votes, answered = np.array(votes), np.array(answered)
    release = rc.release_parameters(sigma2, votes.shape[1], delta=1e-5)
    shift, scale = gnss.upper_bound_factors(release.beta, release.sigma_ss, release.delta0)

    def f(v):
        r = dd.data_dependent_epsilon(v, threshold, sigma1, sigma2, 1e-5, orders=[release.order],
                                      answered=answered).rdp[0]
        s = gnss.smooth_sensitivity(v, answered, teachers=teachers, threshold=threshold, sigma1=sigma1,
                                    sigma2=sigma2, order=release.order, beta=release.beta)
        return r, s

    r0, s0 = f(votes)
    rng = np.random.default_rng(7)
    moved = 0.0
    for _ in range(60):
        r1, s1 = f(_neighbour(votes, rng))
        assert s1 <= math.exp(release.beta) * s0 * (1 + 1e-9)
        assert abs((r1 + shift * s1) - (r0 + shift * s0)) <= scale * s0 * (1 + 1e-9)
        moved = max(moved, abs(r1 - r0))
    assert moved > 0  # the neighbours moved the data-dependent cost: the bounds were exercised


def test_a_bound_s_failure_probability_is_taken_out_of_delta():
    order, rdp = 12.0, 1.3
    events = [RenyiDpEvent(order, rdp), BoundFailureDpEvent(2e-6)]
    assert compose(events, 1e-5).epsilon == pytest.approx(renyi_epsilon(rdp, order, 8e-6), rel=1e-12)
    assert compose([BoundFailureDpEvent(1e-5)], 1e-5).epsilon == math.inf  # no delta left
    twice = SelfComposedDpEvent(ComposedDpEvent([RenyiDpEvent(order, rdp), BoundFailureDpEvent(2e-6)]), 2)
    assert compose([twice], 1e-5).epsilon == pytest.approx(renyi_epsilon(2 * rdp, order, 6e-6), rel=1e-12)
    with pytest.raises(ConfigError, match="inside PoissonSampledDpEvent"):  # no amplification is applied to it
        compose([PoissonSampledDpEvent(0.1, BoundFailureDpEvent(1e-6))], 1e-5)
    assert event_from_json(event_to_json(BoundFailureDpEvent(2e-6))) == BoundFailureDpEvent(2e-6)  # the ledger's form


# --------------------------------------------------------------------------- through dpicl pate and the gate

TINY_AUDIT = AuditConfig(trials=15, members=2, non_members=6, reference_prompts=2, auc_tolerance=0.49,
                         test="equivalence")  # the release path under test needs a pass: a band nearly [0, 1]


def _args(dataset_id: str, epsilon: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    return ["pate", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--model", "tiny-random", "--epsilon", epsilon, "--teachers", "30", "--queries", "12", "--threshold", "3",
            "--sigma1", "5", "--sigma2", "20", "--repeats", "1", "--test-size", "8", "--student-candidates", "3",
            "--public", "ood", "--accounting", "data-dependent", "--dataset-id", dataset_id, "--json"]


def _public_files(run_id: str) -> set[str]:
    return {p.name for p in (home() / "runs").rglob(f"{run_id}/*")}


def test_a_settled_run_is_charged_three_spends_and_released_on_its_entries(tiny_lm, capsys):
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main
    from flows.release import release

    share_tiny_model(tiny_lm)
    capsys.readouterr()
    assert main(_args("pate-dd", "1000")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["accounting"] == "data-dependent" and out["epsilon_per_repeat"] is None
    entries = Ledger().entries("pate-dd")
    order = out["parameters"]["gnss"]["order"]
    gnss_release = rc.release_parameters(20.0, 4, out["delta"])
    assert out["gnss_delta0"] == gnss_release.delta0 == out["delta"] / 2
    assert [(e.run_id, e.purpose, e.event) for e in entries] == [
        (out["run_id"], "pate", RenyiDpEvent(order, gnss_release.cost)),
        (out["run_id"], "pate", BoundFailureDpEvent(gnss_release.delta0)),
        (out["run_id"], "pate", RenyiDpEvent(order, out["released_rdp"]))]
    assert out["epsilon"] == pytest.approx(compose([e.event for e in entries], out["delta"]).epsilon)
    assert out["epsilon_data_independent"] > 0 and "pate_noisy_labels.parquet" in _public_files(out["run_id"])
    result = release(run_id=out["run_id"], method="pate", audit_config=TINY_AUDIT, seed=11)
    manifest = json.loads((Path(result["release_dir"]) / "release.json").read_text())
    assert manifest["epsilon"] == pytest.approx(out["epsilon"])
    assert any("gnss_delta0" in line and "upper bound" in line for line in manifest["assumptions"])
    assert [e["id"] for e in manifest["ledger_entries"]] == [e.id for e in entries]


def test_a_labelling_over_the_epsilon_asked_publishes_nothing(tiny_lm, capsys):
    from dpcore.privacy.ledger import Ledger
    from flows.cli import main

    share_tiny_model(tiny_lm)
    capsys.readouterr()
    # seeded: the release's noise is drawn the same every time (unseeded, it may clip the released cost at 0)
    assert main([*_args("pate-dd-over", "1.5"), "--seed", "3"]) == 3
    _, err = capsys.readouterr()
    assert "no label is published" in err and "Traceback" not in err
    release, failure = Ledger().entries("pate-dd-over")  # charged before any teacher voted
    assert isinstance(release.event, RenyiDpEvent) and isinstance(failure.event, BoundFailureDpEvent)
    # the queries (public) and what the run kept of its own inputs; no label, nothing made from one
    assert _public_files(release.run_id) - {"run_inputs.json"} == {"pate_queries.parquet"}
