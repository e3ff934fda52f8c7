"""dpcore.privacy.composition: one composition of events for the accountant and the ledger, checked
against dp-accounting's own accountants, the exact randomised-response composition, the speed
guards, and calibration over any event family. Small T throughout (seconds in all)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from dp_accounting.dp_event import (
    ComposedDpEvent,
    GaussianDpEvent,
    NonPrivateDpEvent,
    NoOpDpEvent,
    PoissonSampledDpEvent,
    SelfComposedDpEvent,
)

from dpcore.errors import ConfigError
from dpcore.fewshot import accounting
from dpcore.privacy import composition, memo
from dpcore.privacy.composition import compose
from dpcore.privacy.events import ReportNoisyMaxDpEvent, tang_event
from dpcore.privacy.ledger import Ledger, Spend

DELTA = 1e-5


@pytest.fixture()
def fresh_cache(monkeypatch):
    """Compositions computed anew: the memory cache emptied and the disk cache (`dpcore.privacy.memo`) off."""
    monkeypatch.setattr(memo, "folder", lambda cache_dir=None: None)
    composition._compose_cached.cache_clear()
    yield
    composition._compose_cached.cache_clear()


def test_ledger_spend_is_the_composition_of_its_entries_events(tmp_path, monkeypatch, fresh_cache):
    ledger = Ledger(tmp_path / "ledger.db")
    bound = dict(dataset_id="ds", content_hash="h", delta=DELTA)
    ledger.charge([Spend.sampled_steps("gaussian", 0.7, 0.01, 30, "pipeline", run_id="run-1", **bound)],
                  replay_recorded=False)
    ledger.charge([Spend.sampled_steps("rnm", 1.0, 0.01, 20, "generate", run_id="run-2", **bound)],
                  replay_recorded=False)
    calls = []
    real = composition.compose

    def spy(events, delta, **kwargs):
        events = list(events)
        calls.append((events, delta))
        return real(events, delta, **kwargs)

    monkeypatch.setattr(composition, "compose", spy)
    spend = ledger.spend("ds", delta=DELTA)
    entries = ledger.entries("ds")
    assert calls == [([e.event for e in entries], DELTA)]  # the ledger's spend is this one call ...
    direct = real([tang_event("gaussian", 0.7, 0.01, 30), tang_event("rnm", 1.0, 0.01, 20)], DELTA,
                  cache=False)
    assert (spend.epsilon, spend.epsilon_prv, spend.epsilon_pld, spend.crosscheck_agreed, spend.warnings) == (
        direct.epsilon, direct.epsilon_prv, direct.epsilon_pld, direct.crosscheck_agreed, direct.warnings)
    # ... and the accountant's report of one label is the same composition of that label's event
    report = accounting.epsilon_for(0.7, 0.01, 30, DELTA, cache_dir=False)
    alone = real([entries[0].event], DELTA)
    assert (report.epsilon, report.epsilon_crosscheck, report.epsilon_estimate) == (
        alone.epsilon, alone.epsilon_pld, alone.epsilon_estimate)
    assert entries[0].epsilon_upper == alone.epsilon


@pytest.mark.parametrize("sigma, q, steps", [(0.8, 0.02, 20), (2.0, 1.0, 3)])
def test_single_gaussian_agrees_with_dp_accountings_accountants(sigma, q, steps):
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    event = SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)
    ours = compose([event], DELTA)
    pld = PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA)
    rdp = RdpAccountant().compose(event).get_epsilon(DELTA)
    assert ours.crosscheck_agreed and ours.warnings == ()
    assert ours.epsilon_estimate == pytest.approx(pld, rel=0.02)
    assert ours.epsilon_pld == pytest.approx(pld, rel=0.02)
    assert pld * (1 - 1e-3) <= ours.epsilon <= pld * 1.03 + 1e-3  # an upper bound, and a tight one
    assert ours.epsilon_lower <= ours.epsilon_estimate <= ours.epsilon_prv
    assert rdp >= pld and rdp >= ours.epsilon_estimate  # RDP is the looser bound


# A grid point at eps = 0 (dp-accounting's b == 0 branch), points near the edge log(1 - q), q = 1, a tiny q
# and a large sigma (a grid of one point)
@pytest.mark.parametrize("sigma, q, interval", [(0.7, 0.01, 1e-3), (0.61, 0.0379, 5e-3), (2.0, 1.0, 1e-3),
                                                (0.18, 6.1e-5, 1e-3), (0.3, 0.5, 1e-2), (28.3, 1.0, 1e-3)])
def test_the_gaussian_pld_is_dp_accountings_bit_for_bit(sigma, q, interval):
    from dp_accounting.pld import privacy_loss_distribution as pld

    theirs = pld.from_gaussian_mechanism(standard_deviation=sigma, sensitivity=1.0, sampling_prob=q,
                                         use_connect_dots=True, pessimistic_estimate=True,
                                         value_discretization_interval=interval)
    ours = composition._gaussian_pld.__wrapped__(sigma, q, interval)
    assert ours._symmetric == theirs._symmetric == (q == 1.0)
    for side in ("_pmf_remove", "_pmf_add"):
        a, b = getattr(ours, side).to_dense_pmf(), getattr(theirs, side).to_dense_pmf()
        assert (a._lower_loss, a._infinity_mass, a._discretization) == (b._lower_loss, b._infinity_mass,
                                                                        b._discretization)
        assert a._probs.tobytes() == b._probs.tobytes()
    assert ours.get_epsilon_for_delta(DELTA) == theirs.get_epsilon_for_delta(DELTA)


@pytest.mark.parametrize("q", [1.0, 0.02])
@pytest.mark.parametrize("adjacency", ["ADD", "REMOVE"])
def test_the_hockey_stick_divergences_are_dp_accountings_on_either_side(adjacency, q):
    """Both adjacencies and q = 1 (whose add side the PLD never builds), over a grid through eps = 0 and
    past the edges +-log(1 - q)."""
    import numpy as np
    from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss

    loss = GaussianPrivacyLoss(0.8, sensitivity=1.0, sampling_prob=q, adjacency_type=AdjacencyType[adjacency])
    epsilons = np.arange(-400, 401) * 1e-3
    ours = composition._gaussian_hockey_stick(loss, 0.8, q, epsilons)
    assert ours.tobytes() == loss.get_delta_for_epsilon(epsilons).tobytes()
    assert ours.min() < ours.max()


def test_rnm_exact_closed_form_brackets_the_numerical_bounds():
    sigma, q, steps = 0.5, 0.01, 40
    ours = compose([tang_event("rnm", sigma, q, steps)], DELTA)
    step = composition.rnm_step_epsilon(sigma, q)
    assert step == pytest.approx(math.log1p(q * math.expm1(1 / sigma)), rel=1e-12)
    assert ours.epsilon_pure == pytest.approx(steps * step, rel=1e-12)
    assert ours.epsilon_exact >= ours.epsilon_lower - 1e-9  # exact >= prv-accountant's lower bound
    assert ours.epsilon_pld == pytest.approx(ours.epsilon_exact, rel=1e-6)  # PLD on the epsilon' grid: exact
    assert ours.epsilon_exact <= ours.epsilon <= ours.epsilon_pure
    assert ours.crosscheck_agreed


def test_heterogeneous_pure_steps_have_a_pure_bound_but_no_closed_form():
    events = [tang_event("rnm", 0.5, 0.01, 10), tang_event("rnm", 1.0, 0.02, 10)]
    ours = compose(events, DELTA)
    pure = 10 * composition.rnm_step_epsilon(0.5, 0.01) + 10 * composition.rnm_step_epsilon(1.0, 0.02)
    assert ours.epsilon_pure == pytest.approx(pure) and ours.epsilon_exact is None
    assert 0 < ours.epsilon <= pure


def test_trivial_and_non_private_compositions():
    assert compose([], DELTA).epsilon == 0.0 and compose([NoOpDpEvent()], DELTA).epsilon == 0.0
    for event in (NonPrivateDpEvent(), tang_event("rnm", 0.0, 0.1, 5), GaussianDpEvent(0.0)):
        result = compose([GaussianDpEvent(5.0), event], DELTA)
        assert result.epsilon == math.inf and result.warnings
    with pytest.raises(ConfigError, match="delta"):
        compose([GaussianDpEvent(1.0)], 0.0)


def test_composition_is_order_free_and_not_additive():
    a, b = tang_event("gaussian", 0.7, 0.01, 30), tang_event("gaussian", 0.9, 0.02, 20)
    both = compose([a, b], DELTA)
    assert compose([ComposedDpEvent([b, a])], DELTA) == both
    assert max(compose([a], DELTA).epsilon, compose([b], DELTA).epsilon) < both.epsilon
    assert both.epsilon < compose([a], DELTA).epsilon + compose([b], DELTA).epsilon


def test_one_tolerance_flags_the_accountant_and_the_ledger_alike(tmp_path, monkeypatch, fresh_cache):
    real = composition._prv_epsilon
    ledger = Ledger(tmp_path / "ledger.db")
    ledger.charge([Spend.sampled_steps("gaussian", 0.7, 0.01, 30, "pipeline", dataset_id="ds",
                                       content_hash="h", run_id="run", delta=DELTA)], replay_recorded=False)
    for factor, agreed in ((0.99, True), (0.96, False)):  # within and beyond CROSSCHECK_TOLERANCE = 2%
        def skewed(*args, factor=factor):
            return tuple(v * factor for v in real(*args))

        monkeypatch.setattr(composition, "_prv_epsilon", skewed)
        composition._compose_cached.cache_clear()
        report = accounting.epsilon_for(0.7, 0.01, 30, DELTA, cache_dir=False)
        spend = ledger.spend("ds", delta=DELTA)
        assert report.crosscheck_agreed is agreed and spend.crosscheck_agreed is agreed
        assert spend.epsilon == report.epsilon >= report.epsilon_crosscheck


def test_speed_guards_only_loosen_the_bound(monkeypatch):
    event = tang_event("gaussian", 0.7, 0.01, 30)
    plain = compose([event], DELTA, cache=False)
    monkeypatch.setattr(composition, "PRV_MAX_GRID_POINTS", 20_000)  # forces a coarser prv-accountant grid
    coarse = compose([event], DELTA, cache=False)
    assert coarse.prv_eps_error > plain.prv_eps_error and any("eps_error raised" in w for w in coarse.warnings)
    assert coarse.epsilon_prv >= plain.epsilon_prv and coarse.epsilon >= plain.epsilon
    monkeypatch.setattr(composition, "PRV_MAX_GRID_POINTS", 10)  # no grid fits: PLD alone answers
    skipped = compose([event], DELTA, cache=False)
    assert skipped.epsilon_prv is None and not skipped.crosscheck_agreed
    assert skipped.epsilon == skipped.epsilon_pld and any("skipped" in w for w in skipped.warnings)


def _gaussian_family(sigma: float):
    return GaussianDpEvent(sigma)  # one Gaussian release: sigma ~ 4 for epsilon 1


def _mixed_family(sigma: float):
    """Gaussian steps of sensitivity 2 (noise multiplier sigma / 2) and report-noisy-max steps, sampled."""
    return ComposedDpEvent([
        SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(sigma / 2)), 20),
        SelfComposedDpEvent(PoissonSampledDpEvent(0.05, ReportNoisyMaxDpEvent(sigma)), 5),
    ])


@pytest.mark.parametrize("family, target", [(_gaussian_family, 1.0), (_mixed_family, 2.0)],
                         ids=["gaussian", "composed"])
def test_calibration_over_a_family_is_the_smallest_sigma(family, target):
    result = composition.calibrate(family, target, DELTA)
    sigma = result.noise_multiplier
    assert sigma > 1  # so that sigma * 1e-3 exceeds the search tolerance
    assert result.composition == compose([family(sigma)], DELTA)
    assert result.composition.epsilon <= target
    assert compose([family(sigma * (1 - 1e-3))], DELTA).epsilon > target
    assert compose([family(sigma - composition.SIGMA_TOLERANCE)], DELTA).epsilon > target


def test_a_bracket_one_tolerance_wide_ends_the_calibration(monkeypatch):
    """First pass at 0.5512, which holds; 0.5502 breaks the target: the bracket is the tolerance (up to
    rounding), so two full compositions decide sigma = 0.5512, and no third one bisects it."""
    fake = composition.Composition(0.0, DELTA, None, None, True)
    monkeypatch.setattr(composition, "_solve_fast", lambda *args, **kwargs: 0.5512)
    monkeypatch.setattr(composition, "compose",
                        lambda events, delta, cache=True: dataclasses.replace(fake, epsilon=1 / events[0]))
    assert 0.5512 - 0.5502 > composition.SIGMA_TOLERANCE  # the rounding the loop must tolerate
    result = composition.calibrate(lambda sigma: sigma, 1 / 0.5507, DELTA)
    assert (result.noise_multiplier, result.evaluations) == (0.5512, 2)


def test_calibration_rejects_bad_or_unreachable_targets():
    for target in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ConfigError, match="target_epsilon"):
            composition.calibrate(_gaussian_family, target, DELTA)
    with pytest.raises(ConfigError, match="unreachable"):
        composition.calibrate(_gaussian_family, 1e-4, DELTA)
    with pytest.raises(ConfigError, match="unreachable"):
        composition.calibrate(_gaussian_family, 1e-2, DELTA, sigma_max=10.0)


@pytest.mark.parametrize("groups", [
    (("gaussian", 0.8, 0.01, 1000),),
    (("gaussian", 1.1, 0.004, 200), ("rnm", 0.5, 0.02, 30)),
    (("rnm", 2.0, 1.0, 40), ("gaussian", 0.6, 0.1, 10), ("gaussian", 0.9, 0.05, 300)),
    (("laplace", 2.0, 1.0, 3), ("gaussian", 3.0, 1.0, 5)),
])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_the_safe_domain_from_cached_rdp_curves_covers_prv_accountants(groups, delta):
    """The prv-accountant grid's half-width is computed from per-step RDP curves, at fewer orders, cached
    across compositions: never narrower than prv-accountant's own `compute_safe_domain_size` (a narrower grid
    would drop privacy loss its error bound counts on), and at most 4% wider, before and after the cache is
    warm."""
    import warnings

    from prv_accountant.accountant import compute_safe_domain_size

    prvs, counts = composition._prv_variables(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = compute_safe_domain_size(prvs, counts, eps_error=composition.PRV_EPS_ERROR_MAX,
                                             delta_error=composition._delta_error(delta))
    composition._rdp_curve.cache_clear()
    cold = composition._safe_domain(groups, delta)
    assert reference * (1 - 1e-12) <= cold <= reference * 1.04
    assert composition._safe_domain(groups, delta) == cold  # from the cache


@pytest.mark.parametrize("groups", [
    (("gaussian", 0.61, 0.01, 100),),  # 79,598 points on the safe domain: 2 x 39,799, a prime
    (("gaussian", 1.0, 0.02, 1000),),
    (("gaussian", 1.1, 0.004, 200), ("rnm", 0.5, 0.02, 30)),
])
def test_the_prv_grid_is_widened_to_a_fast_fft_length_and_gives_the_same_epsilon(groups, monkeypatch):
    """prv-accountant's grid is widened from the safe domain to the next even 2^a 3^b 5^c length (its FFTs
    at a length with a large prime factor are tens of times slower): the grid it builds has exactly the
    length `_grid_points` says, the domain is never narrower than the safe one, and the epsilon is the
    safe domain's to 1e-5 (relative; prv-accountant's own error bound is 0.01 absolute)."""
    import prv_accountant.composers as composers

    delta, eps_error = 1e-5, composition.PRV_EPS_ERROR_MAX
    domain = composition._safe_domain(groups, delta)
    total = sum(n for *_, n in groups)
    half_width, points = composition._grid_points(domain, eps_error, total, delta)
    mesh = half_width / (points / 2 - 1.5)  # _grid_points: half width (cells - 1/2) mesh, 2 (cells + 1) points
    assert half_width >= domain and points == composition.fast_fft_length(points)
    assert points <= 1.05 * 2 * (math.ceil(domain / mesh) + 1)  # at most 5% more points than the safe domain's
    lengths = []
    fourier = composers.Fourier.__init__
    monkeypatch.setattr(composers.Fourier, "__init__",
                        lambda self, prvs: (lengths.append(len(prvs[0].pmf)), fourier(self, prvs))[1])
    widened = composition._prv_epsilon(groups, delta, eps_error, half_width)
    assert lengths == [points] * len(groups)
    safe = composition._prv_epsilon(groups, delta, eps_error, domain)
    assert widened == pytest.approx(safe, rel=1e-5)


def test_fast_fft_lengths_are_the_smallest_even_5_smooth_lengths():
    def smooth(n: int) -> bool:
        for p in (2, 3, 5):
            while n % p == 0:
                n //= p
        return n == 1

    for n in [*range(1, 400), 40_064, 79_598, 187_886]:
        length = composition.fast_fft_length(n)
        assert length >= n and length % 2 == 0 and smooth(length)
        assert not any(k % 2 == 0 and smooth(k) for k in range(n, length))


def test_a_composition_is_stored_under_its_full_key_and_read_back_equal(tmp_path, monkeypatch):
    """The disk memo (`dpcore.privacy.memo`): a composition computed once is the same `Composition` when read
    back from disk; other inputs, another accountant version or another composition.py are misses; an
    unreadable or foreign file is ignored (recomputed), never trusted."""
    import json
    import subprocess
    import sys

    monkeypatch.setattr(memo, "folder", lambda cache_dir=None: tmp_path)
    events = [tang_event("gaussian", 0.83, 0.013, 17)]
    composition._compose_cached.cache_clear()
    first = compose(events, DELTA)
    stored = list(tmp_path.glob("compose-*.json"))
    assert len(stored) == 1 and first == compose(events, DELTA, cache=False)
    composition._compose_cached.cache_clear()
    calls = []
    monkeypatch.setattr(composition, "_compose_groups", lambda *args: calls.append(args))
    assert compose(events, DELTA) == first and not calls  # from disk: nothing computed
    # the key holds every input exactly, the accountants' versions and the code's digest
    key = json.loads(stored[0].read_text())["key"]
    assert key["delta"] == repr(DELTA) and key["groups"] == [["gaussian", "0.83", "0.013", 17]]
    assert key["versions"] == memo.accountant_versions() and len(key["code"]) == 16
    assert memo.get(tmp_path, {**key, "code": "0" * 16}) is None
    assert memo.get(tmp_path, {**key, "versions": {"prv-accountant": "9", "dp-accounting": "9"}}) is None
    # a file whose stored key differs (a collision, an edit) or that is not JSON is a miss
    text = stored[0].read_text()
    stored[0].write_text(text.replace('"0.83"', '"0.84"'))
    assert memo.get(tmp_path, key) is None
    stored[0].write_text("{not json")
    assert memo.get(tmp_path, key) is None
    # another process sharing the folder reads what this one wrote
    stored[0].write_text(text)
    probe = ("import sys; from dpcore.privacy import composition, memo; from dpcore.privacy.events import tang_event; "
             "from pathlib import Path; memo.folder = lambda cache_dir=None: Path(sys.argv[1]); "
             "composition._compose_groups = None; "
             "print(composition.compose([tang_event('gaussian', 0.83, 0.013, 17)], 1e-5).epsilon)")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert float(out.stdout) == first.epsilon


def test_a_calibration_repeated_in_a_fresh_process_computes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(memo, "folder", lambda cache_dir=None: tmp_path)
    composition._compose_cached.cache_clear()
    first = composition.calibrate(_gaussian_family, 1.0, DELTA)
    composition._compose_cached.cache_clear()  # as a new process: the memory cache is empty
    monkeypatch.setattr(composition, "_compose_groups", None)  # any computation would raise
    monkeypatch.setattr(composition, "_fast_epsilon", None)
    again = composition.calibrate(_gaussian_family, 1.0, DELTA)
    assert (again.noise_multiplier, again.composition) == (first.noise_multiplier, first.composition)


@pytest.mark.parametrize("cap", [1, 2, 7, 64, 1000])
def test_largest_count_is_the_last_count_that_fits_and_asks_few_times(cap):
    """The most queries or steps a budget affords: the largest n <= cap that fits, 0 when none, in O(log n) asks."""
    for last in (0, 1, 2, 3, 5, 63, 64, 65, 999, 5000):
        asked = []

        def fits(n: int, last=last, asked=asked) -> bool:
            asked.append(n)
            return n <= last

        assert composition.largest_count(fits, cap) == min(last, cap)
        assert len(asked) <= 2 * math.ceil(math.log2(cap + 1)) + 2
        assert all(1 <= n <= cap for n in asked)
