"""PromptPATE's data-dependent accounting (`--accounting data-dependent`, Papernot et al. 2018): the release
charged before any teacher votes, the labelling at its released cost before any label is published, refused
without publishing over the epsilon asked, and a settled run released through the gate on its ledger entries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pipeline_support import home, mini_agnews, prefect_harness, share_tiny_model  # noqa: F401

from dpcore.config import AuditConfig
from dpcore.errors import BudgetExceededError, ConfigError
from dpcore.pate import released_cost as rc
from dpcore.pate import smooth_sensitivity as gnss
from dpcore.privacy.composition import compose
from dpcore.privacy.events import RenyiDpEvent

DELTA = 1e-5


def test_the_default_order_is_the_largest_where_the_analysis_applies():
    release = rc.release_parameters(20.0, 4)
    assert all(gnss.check_conditions(20.0, 4, release.order))
    assert not all(gnss.check_conditions(20.0, 4, release.order + 1))
    assert release.beta == pytest.approx(rc.BETA_FRACTION / release.order) and release.sigma_ss == 10.0
    assert release.cost == gnss.gnss_rdp(release.beta, 10.0, release.order)


@pytest.mark.parametrize("kwargs, needle", [
    ({"order": 40.0}, "--pate-gnss-order"),            # condition C6 fails at sigma2 20
    ({"order": 10.0, "beta": 0.05}, "--pate-gnss-beta"),  # beta must stay below 1 / (2 order)
    ({"sigma_ss": 0.0}, "--pate-gnss-sigma"),
])
def test_release_parameters_outside_the_analysis_are_refused(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        rc.release_parameters(20.0, 2, **kwargs)


def _plan(target: float = 8.0):
    return rc.data_dependent_plan(epsilon_target=target, delta=DELTA, queries=100, threshold_sigma=5.0,
                                  vote_sigma=20.0, teachers=200, threshold=180.0,
                                  release=rc.release_parameters(20.0, 2))


def test_the_plan_charges_the_release_alone_and_settles_the_labelling_against_the_target():
    plan = _plan()
    (spend,) = plan.spends
    assert spend.event == RenyiDpEvent(plan.parameters["gnss_order"], rc.release_parameters(20.0, 2).cost)
    assert plan.epsilon == 8.0 and plan.parameters["epsilon_release"] == compose([spend.event], DELTA).epsilon
    settled = rc.settled_plan(plan, 0.5)
    assert [s.event for s in settled.spends] == [spend.event, RenyiDpEvent(plan.parameters["gnss_order"], 0.5)]
    # what the run spent: both Renyi guarantees added at the order, converted once (Canonne et al. 2020)
    order = plan.parameters["gnss_order"]
    expected = spend.event.epsilon + 0.5 + math.log1p(-1 / order) - math.log(DELTA * order) / (order - 1)
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
    release = rc.release_parameters(20.0, 2)
    got = rc.released_labelling_rdp(histograms, answered, teachers=30, threshold=25.0, sigma1=5.0, sigma2=20.0,
                                    delta=DELTA, release=release, rng=np.random.default_rng(4))
    direct = gnss.release_data_dependent_epsilon(
        np.concatenate([histograms] * 2), np.concatenate(answered), teachers=30, threshold=25.0, sigma1=5.0,
        sigma2=20.0, delta=DELTA, order=release.order, beta=release.beta, sigma_ss=release.sigma_ss,
        rng=np.random.default_rng(4))
    assert got == direct.rdp_released


# --------------------------------------------------------------------------- through dpicl pate and the gate

TINY_AUDIT = AuditConfig(trials=15, members=2, non_members=6, reference_prompts=2, auc_tolerance=0.49)


def _args(dataset_id: str, epsilon: str) -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    return ["pate", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--model", "tiny-random", "--epsilon", epsilon, "--teachers", "30", "--queries", "12", "--threshold", "3",
            "--sigma1", "5", "--sigma2", "20", "--repeats", "1", "--test-size", "8", "--student-candidates", "3",
            "--public", "ood", "--accounting", "data-dependent", "--dataset-id", dataset_id, "--json"]


def _public_files(run_id: str) -> set[str]:
    return {p.name for p in (home() / "runs").rglob(f"{run_id}/*")}


def test_a_settled_run_is_charged_twice_and_released_on_its_entries(tiny_lm, capsys):
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
    assert [(e.run_id, e.purpose, e.event) for e in entries] == [
        (out["run_id"], "pate", RenyiDpEvent(order, rc.release_parameters(20.0, 4).cost)),
        (out["run_id"], "pate", RenyiDpEvent(order, out["released_rdp"]))]
    assert out["epsilon"] == pytest.approx(compose([e.event for e in entries], out["delta"]).epsilon)
    assert out["epsilon_data_independent"] > 0 and "pate_noisy_labels.parquet" in _public_files(out["run_id"])
    result = release(run_id=out["run_id"], method="pate", audit_config=TINY_AUDIT, seed=11)
    manifest = json.loads((Path(result["release_dir"]) / "release.json").read_text())
    assert manifest["epsilon"] == pytest.approx(out["epsilon"])
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
    (entry,) = Ledger().entries("pate-dd-over")  # the release, charged before any teacher voted
    assert isinstance(entry.event, RenyiDpEvent)
    assert _public_files(entry.run_id) == {"pate_queries.parquet"}
