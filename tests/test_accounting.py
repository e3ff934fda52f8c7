"""dpcore.fewshot.accounting and `dpicl epsilon / calibrate`: the paper's noise table, the dp-accounting
cross-check, monotonicity, report-noisy-max against an exact computation, parallel composition,
bad input, the disk cache and the CLI contract.

Calibrations are slow (seconds each), so the four AG News calibrations run once per module
and every test shares the session's default cache ($DPICL_HOME/cache/accounting).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom

from dpcore.errors import ConfigError
from dpcore.fewshot import accounting
from dpcore.fewshot.accounting import PrivacyReport
from dpcore.names import MECHANISMS
from dpcore.privacy import composition, memo

AGNEWS_Q, DBPEDIA_Q, STEPS = 20 / 30000, 80 / 40000, 100
AGNEWS_DELTA, DBPEDIA_DELTA = 1 / 30000, 1 / 40000
TARGETS = (1.0, 2.0, 4.0, 8.0)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def agnews_calibrations() -> dict[float, PrivacyReport]:
    return {eps: accounting.calibrate(eps, AGNEWS_Q, STEPS, AGNEWS_DELTA) for eps in TARGETS}


# --- the paper's noise table (Tang et al. Table 9; REFERENCE.md "Accounting numbers") ---------


@pytest.mark.parametrize("target, sigma", [(1.0, 0.508), (2.0, 0.451), (4.0, 0.385), (8.0, 0.310)])
def test_calibrated_sigma_matches_the_agnews_table(agnews_calibrations, target, sigma):
    report = agnews_calibrations[target]
    assert report.noise_multiplier == pytest.approx(sigma, abs=0.002)
    assert report.epsilon <= target
    assert report.crosscheck_agreed and report.warnings == ()
    # smallest sigma to 1e-3: a little less noise breaks the target
    assert accounting.epsilon_for(report.noise_multiplier - 0.0015, AGNEWS_Q, STEPS, AGNEWS_DELTA).epsilon > target


@pytest.mark.parametrize("q, delta, sigmas", [
    (AGNEWS_Q, AGNEWS_DELTA, (0.51, 0.46, 0.39, 0.31)),
    (DBPEDIA_Q, DBPEDIA_DELTA, (0.63, 0.54, 0.45, 0.36)),
], ids=["agnews", "dbpedia"])
def test_paper_sigmas_meet_their_epsilons(q, delta, sigmas):
    for target, sigma in zip(TARGETS, sigmas, strict=True):
        report = accounting.epsilon_for(sigma, q, STEPS, delta)
        assert report.epsilon <= target, (sigma, report.epsilon)
        assert report.epsilon > 0.85 * target  # and not vacuously: the table is tight
        assert report.epsilon_lower <= report.epsilon_estimate <= report.epsilon
        assert report.crosscheck_agreed


def test_reference_numbers_at_sigma_half():
    report = accounting.epsilon_for(0.5, AGNEWS_Q, STEPS, AGNEWS_DELTA)
    assert report.epsilon_lower == pytest.approx(1.0845, abs=2e-3)
    assert report.epsilon_estimate == pytest.approx(1.0949, abs=1e-3)
    assert report.epsilon == pytest.approx(1.1053, abs=2e-3)
    assert report.epsilon_crosscheck == pytest.approx(1.0949, abs=1e-3)


# --- cross-check with dp-accounting, computed here independently -------------------------------


def _pld_reference(sigma: float, q: float, steps: int, delta: float) -> float:
    from dp_accounting.pld import privacy_loss_distribution as pld

    dist = pld.from_gaussian_mechanism(standard_deviation=sigma, sampling_prob=q, use_connect_dots=True,
                                       value_discretization_interval=3e-4)
    return dist.self_compose(steps).get_epsilon_for_delta(delta)


@pytest.mark.parametrize("sigma, q, steps, delta", [
    (0.6, 0.001, 50, 1e-5),
    (0.45, 0.002, 150, 1e-5),
    (1.0, 0.01, 300, 1e-5),
    (2.0, 0.1, 100, 1e-6),
    (0.8, 1.0, 1, 1e-5),
    (5.0, 0.01, 1000, 1e-5),
])
def test_agrees_with_dp_accounting_pld(sigma, q, steps, delta):
    report = accounting.epsilon_for(sigma, q, steps, delta)
    reference = _pld_reference(sigma, q, steps, delta)
    assert report.crosscheck_agreed, report.warnings
    assert report.epsilon_estimate == pytest.approx(reference, rel=0.02)
    assert report.epsilon_crosscheck == pytest.approx(reference, rel=0.02)
    assert report.epsilon >= reference * (1 - 1e-3)  # the reported value is an upper bound
    assert report.epsilon <= reference * 1.03 + 1e-3  # ... and a tight one


def test_monotone_in_noise_and_steps():
    # sigmas and T = 100 repeat the paper-table inputs, so they come from the cache
    by_sigma = [accounting.epsilon_for(s, AGNEWS_Q, STEPS, AGNEWS_DELTA).epsilon for s in (0.39, 0.46, 0.51)]
    assert by_sigma[0] > by_sigma[1] > by_sigma[2] > 0
    by_steps = [accounting.epsilon_for(0.46, AGNEWS_Q, t, AGNEWS_DELTA).epsilon for t in (50, 100, 200)]
    assert by_steps[0] < by_steps[1] < by_steps[2]
    by_delta = [accounting.epsilon_for(0.46, AGNEWS_Q, STEPS, d).epsilon for d in (AGNEWS_DELTA, 1e-6)]
    assert by_delta[0] < by_delta[1]


def test_sigma_zero_is_infinite_never_a_number():
    for mechanism in MECHANISMS:
        report = accounting.epsilon_for(0.0, AGNEWS_Q, STEPS, AGNEWS_DELTA, mechanism=mechanism)
        for value in (report.epsilon, report.epsilon_lower, report.epsilon_estimate, report.epsilon_crosscheck):
            assert value == math.inf
        assert report.noise_multiplier == 0.0 and report.warnings
    report = accounting.calibrate(math.inf, AGNEWS_Q, STEPS, AGNEWS_DELTA)
    assert report.noise_multiplier == 0.0 and report.epsilon == math.inf


# --- report-noisy-max (Appendix A, Theorems A.4 and A.5) --------------------------------------


def _exact_randomized_response_epsilon(step_eps: float, steps: int, delta: float) -> float:
    """Exact epsilon(delta) of T-fold randomised response with epsilon' (dominates any epsilon'-DP step)."""
    k = np.arange(steps + 1)
    loss = step_eps * (2 * k - steps)
    logpmf = binom.logpmf(k, steps, math.exp(step_eps) / (1 + math.exp(step_eps)))

    def delta_at(eps: float) -> float:
        above = loss > eps
        return float(np.sum(np.exp(logpmf[above]) * -np.expm1(eps - loss[above])))

    return brentq(lambda e: delta_at(e) - delta, 0.0, steps * step_eps, xtol=1e-10)


def test_rnm_step_epsilon_by_hand():
    # sigma = 0.5: epsilon_0 = 1/sigma = 2; amplified by q = 1/1500: log(1 + (e^2 - 1)/1500)
    hand = math.log(1 + (math.e ** 2 - 1) / 1500)
    assert accounting.rnm_step_epsilon(0.5, 1 / 1500) == pytest.approx(hand, rel=1e-12)
    assert accounting.rnm_step_epsilon(0.5, 1.0) == pytest.approx(2.0, rel=1e-12)  # no amplification at q = 1
    # stable far beyond exp overflow: log(1 + q(e^a - 1)) ~ a + log(q)
    assert accounting.rnm_step_epsilon(1e-3, 0.01) == pytest.approx(1000 + math.log(0.01), rel=1e-12)


@pytest.mark.parametrize("sigma, q, steps, delta", [
    (0.2, 1 / 1500, 100, 1 / 30000),
    (0.5, 1 / 1500, 100, 1 / 30000),
    (1.0, 0.01, 1000, 1e-5),
])
def test_rnm_matches_exact_composition(sigma, q, steps, delta):
    report = accounting.epsilon_for(sigma, q, steps, delta, mechanism="rnm")
    step_eps = math.log1p(q * math.expm1(1 / sigma))
    exact = _exact_randomized_response_epsilon(step_eps, steps, delta)
    assert report.step_epsilon == pytest.approx(step_eps, rel=1e-12)
    assert report.epsilon_pure == pytest.approx(steps * step_eps, rel=1e-12)
    assert report.epsilon_crosscheck == pytest.approx(exact, rel=1e-6)  # dp-accounting on the exact grid
    assert report.epsilon_exact == pytest.approx(exact, rel=1e-9)
    assert report.epsilon_estimate == pytest.approx(exact, rel=0.02)
    assert exact <= report.epsilon <= exact + 0.011
    assert report.epsilon < report.epsilon_pure and report.crosscheck_agreed


def test_rnm_prv_failure_is_caught_by_the_crosscheck():
    """prv-accountant truncates its grid and reports ~23 where the exact epsilon is ~275: the larger,
    correct value is reported, and the cross-check holds only because PLD matches the exact composition."""
    sigma, q, steps, delta = 0.1, 1 / 1500, 100, 1 / 30000
    report = accounting.epsilon_for(sigma, q, steps, delta, mechanism="rnm")
    exact = _exact_randomized_response_epsilon(math.log1p(q * math.expm1(1 / sigma)), steps, delta)
    assert report.epsilon_estimate < 0.5 * exact  # prv-accountant's wrong answer is visible ...
    assert any("disagree" in w for w in report.warnings)  # ... and flagged
    assert report.epsilon == pytest.approx(exact, rel=1e-6) and report.epsilon <= report.epsilon_pure
    assert report.epsilon_exact == pytest.approx(exact, rel=1e-9)
    assert report.crosscheck_agreed and any("agrees with the exact" in w for w in report.warnings)


def test_rnm_crosscheck_fails_when_pld_and_exact_disagree(monkeypatch):
    monkeypatch.setattr(composition, "_randomized_response_epsilon", lambda *args: 50.0)
    monkeypatch.setattr(composition, "_prv_epsilon", lambda *args, **kwargs: (0.1, 0.2, 0.3))
    report = accounting.epsilon_for(0.5, 0.01, 10, 1e-5, mechanism="rnm", cache_dir=False)
    assert not report.crosscheck_agreed and any("DISAGREES" in w for w in report.warnings)
    assert report.epsilon == min(50.0, report.epsilon_pure)  # the largest value, capped by the pure bound


def test_prv_exception_falls_back_to_pld_with_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("Discrete mean differs from continuous mean significantly.")

    monkeypatch.setattr(composition, "_prv_epsilon", broken)
    report = accounting.epsilon_for(0.45, AGNEWS_Q, STEPS, AGNEWS_DELTA, cache_dir=False)
    assert not report.crosscheck_agreed
    assert any("prv-accountant failed" in w for w in report.warnings)
    assert report.epsilon == report.epsilon_crosscheck > 0
    assert math.isnan(report.epsilon_estimate)


def test_rnm_calibration_meets_target():
    report = accounting.calibrate(4.0, AGNEWS_Q, STEPS, AGNEWS_DELTA, mechanism="rnm")
    assert report.mechanism == "rnm" and report.epsilon <= 4.0
    assert accounting.epsilon_for(report.noise_multiplier - 0.0015, AGNEWS_Q, STEPS, AGNEWS_DELTA,
                                  mechanism="rnm").epsilon > 4.0


# --- labels: parallel composition -------------------------------------------------------------


def test_calibrate_for_labels_is_max_over_labels_not_sum(agnews_calibrations):
    counts = {"World": 30000, "Sports": 60000, "Business": 60000, "Empty": 0}
    result = accounting.calibrate_for_labels(4.0, counts, num_subsets=10, subset_size=2, steps=STEPS,
                                             delta=AGNEWS_DELTA)
    per_label = result["per_label"]
    assert set(per_label) == {"World", "Sports", "Business"} and result["empty_labels"] == ["Empty"]
    assert result["limiting_label"] == "World"
    assert result["sampling_rate"] == pytest.approx(AGNEWS_Q)
    assert result["noise_multiplier"] == agnews_calibrations[4.0].noise_multiplier  # one sigma, at the largest q
    epsilons = [report.epsilon for report in per_label.values()]
    assert result["epsilon"] == max(epsilons) <= 4.0
    assert per_label["Sports"].epsilon < per_label["World"].epsilon
    assert result["epsilon"] < sum(epsilons)
    assert result["report"] is accounting.parallel_composition(per_label)
    assert result["crosscheck_agreed"]


def test_sampling_rate_steps_and_delta_helpers():
    assert accounting.sampling_rate(10, 2, 30000) == pytest.approx(20 / 30000)
    assert accounting.total_steps(40, 3) == 120
    assert accounting.default_delta(30000) == pytest.approx(1 / 30000)


# --- bad input ---------------------------------------------------------------------------------

GOOD = {"noise_multiplier": 0.5, "sampling_rate": 0.01, "steps": 10, "delta": 1e-5}


@pytest.mark.parametrize("field, value", [
    ("noise_multiplier", -0.1), ("noise_multiplier", math.nan), ("noise_multiplier", math.inf),
    ("sampling_rate", 0.0), ("sampling_rate", 1.5), ("sampling_rate", -0.1), ("sampling_rate", math.nan),
    ("steps", 0), ("steps", 2.5), ("steps", True), ("steps", "ten"),
    ("delta", 0.0), ("delta", 1.0), ("delta", -1e-5), ("delta", math.nan),
])
def test_epsilon_for_rejects_bad_input(field, value):
    with pytest.raises(ConfigError, match=field):
        accounting.epsilon_for(**{**GOOD, field: value})


def test_unknown_mechanism_rejected():
    with pytest.raises(ConfigError, match="mechanism"):
        accounting.epsilon_for(**GOOD, mechanism="laplace")


@pytest.mark.parametrize("target, match", [
    (0.0, "target_epsilon"), (-1.0, "target_epsilon"), (math.nan, "target_epsilon"),
    (1000.0, "vacuous"), (0.0005, "unreachable"),
])
def test_calibrate_rejects_bad_or_unreachable_targets(target, match):
    with pytest.raises(ConfigError, match=match):
        accounting.calibrate(target, 0.01, 10, 1e-5, cache_dir=False)


@pytest.mark.parametrize("call, match", [
    (lambda: accounting.sampling_rate(10, 2, 5), r"sampling rate q > 1"),
    (lambda: accounting.sampling_rate(10, 2, 0), "label_count"),
    (lambda: accounting.sampling_rate(0, 2, 100), "num_subsets"),
    (lambda: accounting.total_steps(0, 1), "max_tokens"),
    (lambda: accounting.total_steps(40, 0), "demos_per_label"),
    (lambda: accounting.default_delta(1), "num_private_records"),
    (lambda: accounting.calibrate_for_labels(1.0, {}, 10, 2, 10, 1e-5), "label_counts"),
    (lambda: accounting.calibrate_for_labels(1.0, {"a": -3}, 10, 2, 10, 1e-5), "label_counts"),
    (lambda: accounting.calibrate_for_labels(1.0, {"a": 0}, 10, 2, 10, 1e-5), "label_counts"),
    (lambda: accounting.calibrate_for_labels(1.0, {"a": 100, "b": 15}, 10, 2, 10, 1e-5), r"sampling rate q > 1"),
])
def test_helpers_reject_bad_input(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


# --- the disk cache -----------------------------------------------------------------------------


def test_cache_hit_is_served_without_the_accountants_and_identical(agnews_calibrations, dpicl_home, monkeypatch):
    def no_accountant(*args, **kwargs):
        raise AssertionError("a cache hit must not run the accountants")

    monkeypatch.setattr(composition, "calibrate", no_accountant)
    again = accounting.calibrate(4.0, AGNEWS_Q, STEPS, AGNEWS_DELTA)
    assert again == agnews_calibrations[4.0]
    files = list((dpicl_home / "cache" / "accounting").glob("calibrate-*.json"))
    assert len(files) >= len(TARGETS)


def test_cache_keyed_by_inputs_and_corruption_ignored(tmp_path):
    first = accounting.epsilon_for(1.0, 0.01, 10, 1e-5, cache_dir=tmp_path)
    other = accounting.epsilon_for(1.0, 0.01, 10, 2e-5, cache_dir=tmp_path)
    assert other.epsilon < first.epsilon and len(list(tmp_path.glob("epsilon-*.json"))) == 2
    assert len(list(tmp_path.glob("compose-*.json"))) == 2  # the compositions behind them, in the same folder
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    assert accounting.epsilon_for(1.0, 0.01, 10, 1e-5, cache_dir=tmp_path) == first


def test_cache_can_be_disabled(tmp_path, monkeypatch):
    monkeypatch.setenv("DPICL_HOME", str(tmp_path))
    accounting.epsilon_for(1.0, 0.01, 10, 1e-5, cache_dir=False)
    assert not (tmp_path / "cache").exists()


def test_report_round_trips_and_versions():
    report = accounting.epsilon_for(1.0, 0.01, 10, 1e-5)
    assert PrivacyReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    versions = memo.accountant_versions()
    assert versions["prv-accountant"] == "0.2.0" and versions["dp-accounting"] != "unknown"


# --- CLI ----------------------------------------------------------------------------------------

CLI_KEYS = {"noise_multiplier", "epsilon", "epsilon_lower", "epsilon_estimate", "epsilon_crosscheck", "delta",
            "sampling_rate", "steps", "mechanism", "warnings", "seconds", "crosscheck_agreed"}


def test_cli_calibrate_json_agnews_row(agnews_calibrations, cli):
    code, out, _ = cli(["calibrate", "--target-epsilon", "4", "--sampling-rate", repr(AGNEWS_Q), "--steps", "100",
                        "--delta", repr(AGNEWS_DELTA), "--json"])
    assert code == 0
    payload = json.loads(out.strip().splitlines()[-1])
    assert CLI_KEYS | {"target_epsilon"} <= set(payload)
    assert payload["noise_multiplier"] == agnews_calibrations[4.0].noise_multiplier
    assert payload["epsilon"] <= 4.0 and payload["mechanism"] == "gaussian"


def test_cli_epsilon_json_inf_and_table(cli):
    code, out, _ = cli(["epsilon", "--noise-multiplier", "0", "--sampling-rate", "0.01", "--steps", "10",
                        "--delta", "1e-5", "--json"])
    payload = json.loads(out)
    assert code == 0 and CLI_KEYS <= set(payload)
    assert payload["epsilon"] == "inf" and payload["epsilon_crosscheck"] == "inf"
    code, out, _ = cli(["epsilon", "--noise-multiplier", "1.0", "--sampling-rate", "0.01", "--steps", "10",
                        "--delta", "1e-5", "--mechanism", "rnm"])
    assert code == 0 and "pure-DP bound" in out and "cross-check" in out


@pytest.mark.parametrize("argv", [
    ["epsilon", "--noise-multiplier", "-1", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
    ["epsilon", "--noise-multiplier", "1", "--sampling-rate", "1.5", "--steps", "10", "--delta", "1e-5"],
    ["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps", "0", "--delta", "1e-5"],
    ["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1"],
    ["calibrate", "--target-epsilon", "0", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
    ["calibrate", "--target-epsilon", "-2", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
    ["calibrate", "--target-epsilon", "0.0005", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
])
def test_cli_bad_input_exits_2(argv, cli):
    code, _, err = cli(argv)
    assert code == 2 and "error" in err


@pytest.mark.parametrize("argv", [
    ["epsilon", "--noise-multiplier", "x", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
    ["epsilon", "--noise-multiplier", "1", "--sampling-rate", "0.01", "--steps", "1.5", "--delta", "1e-5"],
    ["calibrate", "--target-epsilon", "1", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5",
     "--mechanism", "laplace"],
    ["calibrate", "--sampling-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
])
def test_cli_argparse_errors_exit_2(argv, cli):
    with pytest.raises(SystemExit) as exc:
        cli(argv)
    assert exc.value.code == 2


def test_cli_subprocess_cached_epsilon(agnews_calibrations):
    """The installed entry point, against the session's cache (warm from the fixture)."""
    sigma = agnews_calibrations[2.0].noise_multiplier
    accounting.epsilon_for(sigma, AGNEWS_Q, STEPS, AGNEWS_DELTA)  # warm the epsilon cache for this sigma
    entry = [sys.executable, "-c", "import sys; from flows.cli import main; sys.exit(main())"]

    def run(sampling_rate: str) -> subprocess.CompletedProcess:
        argv = ["epsilon", "--noise-multiplier", repr(sigma), "--sampling-rate", sampling_rate, "--steps", "100",
                "--delta", repr(AGNEWS_DELTA), "--json"]
        return subprocess.run(entry + argv, cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                              timeout=120)

    done = run(repr(AGNEWS_Q))
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout.strip().splitlines()[-1])
    assert payload["epsilon"] <= 2.0 and payload["noise_multiplier"] == sigma
    bad = run("2.0")
    assert bad.returncode == 2 and "sampling_rate" in bad.stderr
