"""The privacy budget ledger: heterogeneous composition, budget refusal, atomicity across
processes, crash safety, sigma = 0, no-budget behaviour and the `dpicl ledger` CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpcore.errors import BudgetExceededError, ConfigError
from dpcore.privacy import ledger as ledger_module
from dpcore.privacy.ledger import Ledger, Spend, compose_epsilon, rnm_step_epsilon

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-5
# One small Gaussian run: alone epsilon ~1.88 at DELTA, two of them compose to ~2.15.
SIGMA, Q, T = 0.7, 0.01, 30
BUDGET_FOR_ONE = 2.0


def _charge(ledger: Ledger, run_id: str, dataset_id: str = "ds", sigma: float = SIGMA, q: float = Q,
            steps: int = T, mechanism: str = "gaussian", content_hash: str | None = None, purpose: str = "pipeline"):
    # each dataset id its own records unless a test says otherwise (a budget belongs to the records)
    content_hash = f"hash-of-{dataset_id}" if content_hash is None else content_hash
    request = Spend.sampled_steps(mechanism, sigma, q, steps, purpose, dataset_id=dataset_id,
                                  content_hash=content_hash, run_id=run_id, delta=DELTA)
    return ledger.charge([request], replay_recorded=False).charged[0]


@pytest.fixture()
def ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


def test_default_path_is_under_dpicl_home(dpicl_home):
    assert Ledger().path == (dpicl_home / "ledger.db").resolve()


def test_rnm_step_epsilon_is_amplified_pure_dp():
    eps0 = 1 / 2.0
    assert rnm_step_epsilon(2.0, 1.0) == pytest.approx(eps0)
    assert rnm_step_epsilon(2.0, 0.01) == pytest.approx(math.log(1 + 0.01 * (math.exp(eps0) - 1)))
    assert rnm_step_epsilon(0.0, 0.01) == math.inf


def test_composition_of_heterogeneous_entries_matches_direct_prv(ledger):
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism, PureDPMechanism

    # Same dataset id across a data refresh (two content hashes): composition continues.
    _charge(ledger, "run-1", content_hash="hash-a")
    _charge(ledger, "run-2", content_hash="hash-b")  # same (sigma, q): one PRV with 60 steps
    _charge(ledger, "run-3", sigma=0.9, q=0.02, steps=20, purpose="audit")
    _charge(ledger, "run-4", sigma=1.0, q=0.01, steps=20, mechanism="rnm", purpose="generate")
    _charge(ledger, "other", dataset_id="another-dataset")  # composes separately

    spend = ledger.spend("ds", delta=DELTA)
    assert [e.run_id for e in spend.entries] == ["run-1", "run-2", "run-3", "run-4"]

    prvs = [PoissonSubsampledGaussianMechanism(sampling_probability=Q, noise_multiplier=SIGMA),
            PoissonSubsampledGaussianMechanism(sampling_probability=0.02, noise_multiplier=0.9),
            PureDPMechanism(eps=math.log1p(0.01 * math.expm1(1.0)))]
    counts = [2 * T, 20, 20]
    direct = PRVAccountant(prvs=prvs, max_self_compositions=counts, eps_error=0.01, delta_error=DELTA / 1000)
    _, _, direct_upper = direct.compute_epsilon(delta=DELTA, num_self_compositions=counts)
    assert spend.epsilon_prv == pytest.approx(direct_upper, rel=1e-9)

    direct_pld = (
        pld.from_gaussian_mechanism(SIGMA, sampling_prob=Q, value_discretization_interval=1e-3).self_compose(2 * T)
        .compose(pld.from_gaussian_mechanism(0.9, sampling_prob=0.02, value_discretization_interval=1e-3)
                 .self_compose(20))
        .compose(pld.from_privacy_parameters(common.DifferentialPrivacyParameters(math.log1p(0.01 * math.expm1(1.0))),
                                             value_discretization_interval=1e-3).self_compose(20))
    ).get_epsilon_for_delta(DELTA)
    assert spend.epsilon_pld == pytest.approx(direct_pld, rel=1e-9)
    assert spend.epsilon == pytest.approx(max(direct_upper, direct_pld), rel=1e-9)  # (FFTs differ by machine)
    assert spend.crosscheck_agreed and abs(spend.epsilon_prv - spend.epsilon_pld) < 0.05

    # Composition, not addition: far below the sum of the entries' own epsilons.
    assert spend.epsilon < 0.8 * sum(e.epsilon_upper for e in spend.entries)
    assert all(e.epsilon_upper > 0 and e.status == "charged" for e in spend.entries)
    # Order of entries does not matter; a smaller delta costs more epsilon.
    assert compose_epsilon(list(reversed(spend.entries)), DELTA).epsilon == spend.epsilon
    assert ledger.spend("ds", delta=DELTA / 10).epsilon > spend.epsilon


def test_spend_delta_defaults_to_budget_then_smallest_entry_delta(ledger):
    assert ledger.spend("ds").epsilon == 0.0 and ledger.spend("ds").entries == ()
    ledger.charge([Spend.sampled_steps("gaussian", SIGMA, Q, T, "generate", dataset_id="ds", content_hash="h",
                                       run_id="r1", delta=1e-4)], replay_recorded=False)
    _charge(ledger, "r2")  # delta 1e-5
    assert ledger.spend("ds").delta == DELTA
    ledger.set_budget("ds", 50.0, 1e-6)
    assert ledger.spend("ds").delta == 1e-6
    assert ledger.spend("ds", delta=1e-3).delta == 1e-3


def test_refusal_at_budget_names_spend_cost_and_budget(ledger):
    ledger.set_budget("ds", BUDGET_FOR_ONE, DELTA)
    first = _charge(ledger, "run-1")
    current = ledger.spend("ds").epsilon
    assert current == pytest.approx(first.epsilon_upper) and current <= BUDGET_FOR_ONE

    with pytest.raises(BudgetExceededError) as refused:
        _charge(ledger, "run-2")
    message = str(refused.value)
    assert refused.value.exit_code == 3
    assert "dataset 'ds'" in message and "run-2" in message
    assert f"Current spend epsilon={current:.4g}" in message
    assert f"this run's cost epsilon={first.epsilon_upper:.4g}" in message
    assert f"budget epsilon={BUDGET_FOR_ONE:.4g}" in message and f"delta={DELTA:.4g}" in message
    assert len(ledger.entries("ds")) == 1 and not ledger.has_entry("run-2") and ledger.has_entry("run-1")

    # A larger budget (raised knowingly: it was spent on) lets it through; a budget below the spend refuses
    # everything after.
    ledger.set_budget("ds", 3.0, DELTA, allow_raise=True)
    _charge(ledger, "run-2")
    ledger.set_budget("ds", 1.0, DELTA)
    with pytest.raises(BudgetExceededError):
        _charge(ledger, "run-3", sigma=5.0, steps=1)


def test_a_charge_of_several_spends_is_all_or_nothing(ledger):
    ledger.set_budget("ds", BUDGET_FOR_ONE, DELTA)
    requests = [Spend.sampled_steps("gaussian", SIGMA, Q, T, "audit", dataset_id="ds", content_hash="h",
                                    run_id=f"run-{i}", delta=DELTA) for i in range(2)]
    with pytest.raises(BudgetExceededError):
        ledger.charge(requests, replay_recorded=False)
    assert ledger.entries("ds") == []
    assert ledger.projected_spend(requests).epsilon > BUDGET_FOR_ONE  # what it would have been
    assert [e.run_id for e in ledger.charge(requests[:1], replay_recorded=False).charged] == ["run-0"]


def test_sigma_zero_is_infinite_and_refused_once_a_budget_is_set(ledger):
    entry = _charge(ledger, "nonprivate", sigma=0.0)
    assert entry.epsilon_upper == math.inf
    assert ledger.spend("ds").epsilon == math.inf
    # The infinite entry stays: once a budget is set, the dataset is spent.
    ledger.set_budget("ds", 100.0, DELTA)
    with pytest.raises(BudgetExceededError):
        _charge(ledger, "any", sigma=50.0, steps=1)

    ledger.set_budget("fresh", 100.0, DELTA)
    with pytest.raises(BudgetExceededError) as refused:
        _charge(ledger, "nonprivate-2", dataset_id="fresh", sigma=0.0, mechanism="rnm")
    assert "epsilon=inf" in str(refused.value) and "budget epsilon=100" in str(refused.value)
    assert ledger.entries("fresh") == []


def test_a_charge_that_raced_another_recomposes_inside_the_lock(ledger, monkeypatch):
    """Another process commits between this charge's first composition and its lock: the
    charge must see that entry and be refused (the optimistic precomputation is not trusted)."""
    ledger.set_budget("ds", BUDGET_FOR_ONE, DELTA)
    other_process = Ledger(ledger.path)  # its own connections, like another process
    real = ledger_module.compose_epsilon
    calls: list[list[str]] = []

    def racing(parts, delta):
        parts = list(parts)
        runs = [p.run_id for p in parts]
        if "slow" in runs:
            calls.append(runs)
            if len(calls) == 2:  # the precomputation outside the lock: the competitor commits now
                _charge(other_process, "fast")
        return real(parts, delta)

    monkeypatch.setattr(ledger_module, "compose_epsilon", racing)
    with pytest.raises(BudgetExceededError):
        _charge(ledger, "slow")
    assert calls[1] == ["slow"] and calls[2] == ["fast", "slow"]  # recomposed with the new entry
    assert [e.run_id for e in ledger.entries("ds")] == ["fast"]


def test_no_budget_records_and_never_refuses(ledger):
    for i in range(3):
        _charge(ledger, f"run-{i}", sigma=0.5, q=0.2, steps=5)
    spend = ledger.spend("ds")
    assert spend.budget is None and spend.remaining is None
    assert len(spend.entries) == 3 and spend.epsilon > 5


def test_invalid_charges_and_budgets_are_config_errors(ledger):
    bad = [dict(mechanism="laplace"), dict(q=0.0), dict(q=1.5), dict(steps=0), dict(sigma=-1.0),
           dict(dataset_id=""), dict(dataset_id="bad id with spaces"), dict(purpose="fun"), dict(content_hash="")]
    for kwargs in bad:
        with pytest.raises(ConfigError):
            _charge(ledger, "r", **kwargs)
    for eps, delta in [(math.inf, DELTA), (0.0, DELTA), (-1.0, DELTA), (1.0, 0.0), (1.0, 1.0), (100.5, DELTA),
                       (1e300, DELTA)]:
        with pytest.raises(ConfigError):
            ledger.set_budget("ds", eps, delta)
    assert ledger.entries() == [] and ledger.get_budget("ds") is None and ledger.budget_history("ds") == []
    assert ledger.set_budget("ds", 100.0, DELTA).epsilon == 100.0  # the largest epsilon a run is planned for


def test_raising_a_spent_budget_is_explicit_and_every_change_is_kept(ledger):
    assert ledger.set_budget("ds", 8.0, DELTA).change == "first"
    assert ledger.set_budget("ds", 9.0, DELTA).change == "raised"  # nothing spent yet: an ordinary change
    _charge(ledger, "run-1")
    for epsilon, delta in ((100.0, DELTA), (9.0, 1e-3)):  # a larger epsilon, or a larger delta, is a raise
        with pytest.raises(ConfigError, match="must be explicit: pass --raise") as refused:
            ledger.set_budget("ds", epsilon, delta)
        assert "budget epsilon 9 at delta 1e-05 has been spent on (1 entries)" in str(refused.value)
    assert ledger.get_budget("ds").epsilon == 9.0 and len(ledger.budget_history("ds")) == 2  # nothing changed
    assert ledger.set_budget("ds", 4.0, DELTA).change == "lowered"  # tightening is never refused
    raised = ledger.set_budget("ds", 100.0, DELTA, allow_raise=True)
    assert (raised.change, raised.previous_epsilon, raised.epsilon, raised.entries) == ("raised", 4.0, 100.0, 1)
    assert raised.describe() == "raised from epsilon 4 at delta 1e-05 to epsilon 100 at delta 1e-05"
    history = ledger.budget_history("ds")
    assert [(c.change, c.previous_epsilon, c.epsilon, c.entries) for c in history] == [
        ("first", None, 8.0, 0), ("raised", 8.0, 9.0, 0), ("lowered", 9.0, 4.0, 1), ("raised", 4.0, 100.0, 1)]
    assert ledger.spend("ds").budget_history == tuple(history)


def test_fifty_distinct_entries_compose_within_two_percent_of_dp_accountings_pld(ledger):
    """A ledger of months of scheduled runs is heterogeneous: every distinct (mechanism, sigma, q) is composed
    as it is. The old speed guard merged them as the worst sigma and q per mechanism (a valid bound 3-20x too
    large); now the composed spend is within 2% of dp-accounting's PLD on the same events."""
    import numpy as np
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    rng = np.random.default_rng(7)
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for i in range(50):
        mechanism, sigma, q, steps = "gaussian", float(rng.uniform(0.6, 3.0)), float(rng.uniform(0.001, 0.05)), \
            int(rng.integers(5, 120))
        if i % 7 == 6:  # an unsampled release (q = 1), as PromptPATE's steps are
            sigma, q, steps = float(rng.uniform(20.0, 60.0)), 1.0, int(rng.integers(1, 20))
        step = dp_event.GaussianDpEvent(sigma)
        reference.compose(step if q == 1.0 else dp_event.PoissonSampledDpEvent(q, step), steps)
        purpose = ledger_module.PURPOSES[i % len(ledger_module.PURPOSES)]
        ledger.charge([Spend.sampled_steps(mechanism, sigma, q, steps, purpose, dataset_id="long-lived",
                                           content_hash="hash-a", run_id=f"run-{i}", delta=DELTA)],
                      replay_recorded=False)
    spend = ledger.spend("long-lived", delta=DELTA)
    expected = reference.get_epsilon(DELTA)
    assert len(spend.entries) == 50
    assert expected <= spend.epsilon <= 1.02 * expected, (spend.epsilon, expected)
    assert not any("merged" in w or "worst" in w for w in spend.warnings)


# ----------------------------------------------------------------- across processes

_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from dpcore.errors import BudgetExceededError
    from dpcore.privacy.ledger import Ledger, Spend
    ledger = Ledger({path!r})
    go = {go!r}
    while go and not os.path.exists(go):
        time.sleep(0.01)
    try:
        ledger.charge([Spend.sampled_steps("gaussian", {sigma}, {q}, {steps}, "pipeline", dataset_id="ds",
                                           content_hash="hash-a", run_id=sys.argv[1], delta={delta})],
                      replay_recorded=False)
    except BudgetExceededError as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
    if {crash}:
        os._exit(1)  # a crash right after the charge: nothing else runs, no cleanup
    sys.exit(0)
""")


def _child(path: Path, run_id: str, go: str = "", crash: bool = False) -> subprocess.Popen:
    code = _CHILD.format(repo=str(REPO), path=str(path), go=go, sigma=SIGMA, q=Q, steps=T, delta=DELTA, crash=crash)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", code, run_id], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_concurrent_charges_from_two_processes_never_exceed_the_budget(ledger, tmp_path):
    ledger.set_budget("ds", BUDGET_FOR_ONE, DELTA)  # fits exactly one of the two identical charges
    go = tmp_path / "go"
    children = [_child(ledger.path, f"run-{i}", go=str(go)) for i in range(2)]
    time.sleep(0.5)
    go.touch()  # release both at once: both compose on an empty ledger, then race for the lock
    results = [child.wait(timeout=120) for child in children]
    stderr = [child.stderr.read() for child in children]
    assert sorted(results) == [0, 3], stderr
    assert "budget epsilon=2" in stderr[results.index(3)]
    entries = ledger.entries("ds")
    assert len(entries) == 1 and entries[0].run_id == f"run-{results.index(0)}"
    assert ledger.spend("ds").epsilon <= BUDGET_FOR_ONE


def test_a_crash_after_charging_keeps_the_charge(ledger):
    child = _child(ledger.path, "crashed-run", crash=True)
    assert child.wait(timeout=120) == 1, child.stderr.read()
    assert ledger.has_entry("crashed-run")
    assert [e.run_id for e in ledger.entries("ds")] == ["crashed-run"]


# ----------------------------------------------------------------- CLI


def test_cli_set_budget_show_and_refusal_exit_code(tmp_path, capsys):
    from flows.cli import main

    path = str(tmp_path / "cli-ledger.db")
    assert main(["ledger", "show", "--ledger", path]) == 0
    assert "no entries" in capsys.readouterr().out

    assert main(["ledger", "set-budget", "--dataset", "agnews", "--epsilon", str(BUDGET_FOR_ONE),
                 "--delta", str(DELTA), "--ledger", path]) == 0
    assert "budget of dataset agnews set" in capsys.readouterr().out

    charge = ["ledger", "charge", "--dataset", "agnews", "--content-hash", "abc123", "--noise-multiplier",
              str(SIGMA), "--sampling-rate", str(Q), "--steps", str(T), "--delta", str(DELTA), "--ledger", path]
    assert main([*charge, "--run-id", "first"]) == 0
    capsys.readouterr()
    assert main([*charge, "--run-id", "second"]) == 3
    err = capsys.readouterr().err
    assert "budget epsilon=2" in err and "second refused" in err and "Current spend" in err

    assert main(["ledger", "show", "--dataset", "agnews", "--json", "--ledger", path]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dataset_id"] == "agnews" and shown["delta"] == DELTA
    assert shown["budget"]["epsilon"] == BUDGET_FOR_ONE and shown["budget"]["delta"] == DELTA
    assert [e["run_id"] for e in shown["entries"]] == ["first"]
    assert 0 < shown["epsilon"] <= BUDGET_FOR_ONE and shown["remaining"] == pytest.approx(2.0 - shown["epsilon"])

    assert main(["ledger", "show", "--ledger", path]) == 0
    text = capsys.readouterr().out
    assert "dataset agnews: epsilon" in text and "first" in text and "budget epsilon 2" in text

    # Infinity is written as "inf" in JSON; every dataset id is listed without --dataset.
    assert main(["ledger", "charge", "--dataset", "open", "--run-id", "np", "--content-hash", "h",
                 "--noise-multiplier", "0", "--sampling-rate", "0.1", "--steps", "5", "--delta", "1e-5",
                 "--ledger", path]) == 0
    capsys.readouterr()
    assert main(["ledger", "show", "--json", "--ledger", path]) == 0
    everything = json.loads(capsys.readouterr().out)
    by_id = {d["dataset_id"]: d for d in everything["datasets"]}
    assert set(by_id) == {"agnews", "open"} and by_id["open"]["epsilon"] == "inf" and by_id["open"]["budget"] is None

    # Bad values exit 2 with the parameter named.
    assert main(["ledger", "set-budget", "--dataset", "agnews", "--epsilon", "-1", "--delta", "1e-5",
                 "--ledger", path]) == 2
    assert "epsilon" in capsys.readouterr().err


def test_cli_raising_a_spent_budget_needs_raise_and_prints_both_budgets(tmp_path, cli):
    from dpcore.display import fmt_eps

    path = str(tmp_path / "cli-ledger.db")
    budget = ["ledger", "set-budget", "--dataset", "agnews", "--delta", str(DELTA), "--ledger", path]
    assert cli([*budget, "--epsilon", "8"])[0] == 0
    assert cli(["ledger", "charge", "--dataset", "agnews", "--run-id", "first", "--content-hash", "abc123",
                "--noise-multiplier", str(SIGMA), "--sampling-rate", str(Q), "--steps", str(T), "--delta", str(DELTA),
                "--ledger", path])[0] == 0
    for epsilon, needle in (("100", "must be explicit: pass --raise"), ("1e300", "a budget is at most 100")):
        code, out, err = cli([*budget, "--epsilon", epsilon])
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
        assert len(err) < 400  # never 300 digits
    assert fmt_eps(1e300) == "1e+300"
    code, out, _ = cli([*budget, "--epsilon", "100", "--raise"])
    assert code == 0
    assert ("budget of dataset agnews raised from epsilon 8 at delta 1e-05 to epsilon 100 at delta 1e-05 after 1 "
            "entries spent on it (kept in the ledger's budget history)") in out
    code, out, _ = cli(["ledger", "show", "--dataset", "agnews", "--ledger", path])
    assert "budget history:" in out and "raised from epsilon 8 at delta 1e-05 to epsilon 100" in out
    code, out, _ = cli(["ledger", "show", "--dataset", "agnews", "--ledger", path, "--json"])
    history = json.loads(out)["budget_history"]
    assert [(c["change"], c["previous_epsilon"], c["epsilon"], c["entries"]) for c in history] == [
        ("first", None, 8.0, 0), ("raised", 8.0, 100.0, 1)]
    code, out, _ = cli([*budget, "--epsilon", "50", "--json"])
    assert code == 0 and json.loads(out)["budget_change"]["change"] == "lowered"


# ----------------------------------------------------------------- fresh noise only under a fresh charge


def test_noise_may_be_drawn_only_for_the_spends_this_attempt_charged():
    """A retry that adds a spend (one more DP-SGD training) replays the first training's spend and charges
    the second: only the second may draw fresh noise. Keyed on the (method, epsilon) pair, the first one
    could redraw under its old charge."""
    from dpcore.privacy.ledger import Spend
    from tasks.charge import charge_spends, noise_charged

    def request(run_id: str) -> Spend:
        return Spend.sampled_steps("gaussian", 0.8, 0.01, 20, "dpsgd", dataset_id="redraw-ds", content_hash="hash-a",
                                   run_id=run_id, delta=DELTA)

    first = charge_spends("redraw-ds", [("dpsgd", 8.0, request("retry-run"))])
    assert noise_charged(first, "dpsgd", 8.0, 0) and noise_charged(first, "dpsgd", 8.0)
    # the retry asks for two trainings: the first is replayed from the ledger, the second charged
    again = charge_spends("redraw-ds", [("dpsgd", 8.0, request("retry-run")), ("dpsgd", 8.0, request("retry-run"))])
    assert again["charged"] == 1 and again["replayed"] == 1
    assert not noise_charged(again, "dpsgd", 8.0, 0) and noise_charged(again, "dpsgd", 8.0, 1)
    assert not noise_charged(again, "dpsgd", 8.0)  # a stage drawing for every spend of the pair: refused
    assert not noise_charged(again, "pate", 8.0)   # nothing of another method was charged
