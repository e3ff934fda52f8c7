"""What the ledger holds for a run is matched on what was spent, not on the run id (no pipeline, no model).

- `unrecorded` / `same_spend` / `matching_entries` (pure) and `Ledger.charge` replaying what is recorded
  (one transaction, replay free, anything new charged, dry run records nothing);
- the pipeline's planned spends: DP epsilons, and the non-private baselines only when opted
  into, as sigma = 0 (infinite) spends;
- `RunConfig`: the baselines default, the ledger identity of a user dataset, the task runner
  and `shots 0` refused before anything is charged; `audit_charge_hook` never fails open;
- `dpicl ledger show` says when entries were calibrated at another delta than the total's;
- the release gate's ledger condition matches the released calibration row.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pipeline_support import mini_agnews
from pydantic import ValidationError

from dpcore.config import RunConfig
from dpcore.errors import BudgetExceededError, ConfigError
from dpcore.privacy.ledger import Ledger, Spend, matching_entries, same_spend, unrecorded

DELTA = 1e-3


def _request(run_id="run-a", sigma=0.9, q=0.02, steps=4, delta=DELTA, purpose="pipeline", content_hash="h1",
             dataset_id="ds", mechanism="gaussian") -> Spend:
    return Spend.sampled_steps(mechanism, sigma, q, steps, purpose, dataset_id=dataset_id, content_hash=content_hash,
                               run_id=run_id, delta=delta)


@pytest.fixture()
def book(tmp_path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


# --------------------------------------------------------------------------- pure matching


def test_unrecorded_matches_every_parameter_of_the_spend(book):
    entry = book.charge([_request()], replay_recorded=False).charged[0]
    assert same_spend(_request(), entry)
    assert unrecorded([_request()], [entry]) == []
    for change in ({"sigma": 0.5}, {"q": 0.04}, {"steps": 8}, {"delta": 1e-4}, {"purpose": "audit"},
                   {"content_hash": "h2"}, {"run_id": "run-b"}, {"mechanism": "rnm"}):
        other = _request(**change)
        assert unrecorded([other], [entry]) == [other], change


def test_unrecorded_is_a_multiset_match(book):
    entry = book.charge([_request()], replay_recorded=False).charged[0]
    twice = [_request(), _request()]
    assert unrecorded(twice, [entry]) == [_request()]  # two draws need two entries
    assert unrecorded(twice, [entry, entry]) == []


def test_matching_entries_finds_the_calibration_row_of_the_run(book):
    entries = book.charge([_request(), _request(purpose="audit", sigma=0.3)], replay_recorded=False).charged
    found = matching_entries(entries, run_id="run-a", mechanism="gaussian", noise_multiplier=0.9, sampling_rate=0.02,
                             steps=4, delta=DELTA)
    assert [e.id for e in found] == [entries[0].id]
    assert not matching_entries(entries, run_id="run-a", mechanism="gaussian", noise_multiplier=0.3,
                                sampling_rate=0.02, steps=4, delta=DELTA)  # audit entries do not count
    assert not matching_entries(entries, run_id="run-b", mechanism="gaussian", noise_multiplier=0.9,
                                sampling_rate=0.02, steps=4, delta=DELTA)


# --------------------------------------------------------------------------- charging what is new


def test_a_charge_replays_what_is_recorded_free_and_charges_anything_new(book):
    first = book.charge([_request()])
    assert len(first.charged) == 1 and not first.recorded
    replay = book.charge([_request()])
    assert not replay.charged and [e.id for e in replay.recorded] == [first.charged[0].id]
    more = book.charge([_request(), _request(sigma=0.4)])
    assert len(more.charged) == 1 and more.charged[0].noise_multiplier == 0.4
    assert len(book.entries("ds")) == 2


def test_the_same_run_id_with_a_new_epsilon_is_refused_under_the_budget(book):
    """The reviewed scenario: budget 2; run A at a small spend is charged; a new run with a large spend is
    refused; reusing run A's id for the large spend is refused too (it used to be 'already charged')."""
    small, large = _request(sigma=3.0), _request(sigma=0.3)
    book.set_budget("ds", 2.0, DELTA)
    book.charge([small])
    with pytest.raises(BudgetExceededError):
        book.charge([_request(run_id="run-b", sigma=0.3)])
    with pytest.raises(BudgetExceededError, match="run run-a refused"):
        book.charge([large])
    assert book.charge([small]).charged == ()  # the genuine retry stays free
    assert len(book.entries("ds")) == 1


def test_a_dry_run_refuses_like_the_charge_and_records_nothing(book):
    book.set_budget("ds", 2.0, DELTA)
    outcome = book.charge([_request(sigma=3.0)], replay_recorded=False, dry_run=True)
    assert outcome.dry_run and len(outcome.new_requests) == 1 and book.entries("ds") == []
    with pytest.raises(BudgetExceededError):
        book.charge([_request(sigma=0.3)], replay_recorded=False, dry_run=True)
    with pytest.raises(BudgetExceededError):
        # sigma = 0: infinite
        book.charge([_request(sigma=0.0, purpose="baseline")], replay_recorded=False, dry_run=True)
    assert book.entries("ds") == []


# --------------------------------------------------------------------------- the pipeline's planned spends


COUNTS = {"a": 100, "b": 100}
SMALL = {"max_tokens": 2, "num_subsets": 2, "subset_size": 1}


def _plan(config):
    """The run's plan as the pipeline's calibration stage makes it (`tasks.calibrate.plan_arguments`)."""
    from dpcore.fewshot.plan import fewshot_plan
    from tasks.calibrate import plan_arguments

    return fewshot_plan(**plan_arguments(config.model_copy(update=SMALL), COUNTS, DELTA))


def _spends(config, run_id="run-a"):
    from tasks.charge import plan_spends

    return plan_spends(config.ledger_id, "h1", run_id, _plan(config).privacy_plans())


def test_default_baselines_read_no_private_record_and_are_not_charged():
    from tasks.charge import non_private_warning

    config = RunConfig(epsilons=[0, 2])
    assert config.baselines == ["zero-shot"]  # instruction-only (epsilon 0 here) reads none either: opt-in
    sigma = _plan(config).calibration(2.0).noise_multiplier
    assert [(m, e, r.noise_multiplier, r.purpose) for m, e, r in _spends(config)] == [("tang", 2.0, sigma, "pipeline")]
    assert non_private_warning(config) is None


def test_the_non_private_reference_audit_is_opt_in_and_an_infinite_spend():
    from tasks.audit import audit_call
    from tasks.charge import non_private_warning
    from tasks.common import Ingested, RunPaths

    config = RunConfig(epsilons=[2], audit=True)
    assert not config.audit.reference
    assert [m for m, _, _ in _spends(config)] == ["tang"]
    ingested = Ingested(dataset="agnews", task_spec="agnews", kind="classification", data_hash="h1", source="s",
                        labels=("World", "Sports"), num_private_records=2, num_test=1, records_path="r",
                        paths=RunPaths("agnews", "h1", "run-a", Path("public"), Path("private")))
    assert audit_call(config, ingested, _plan(config), [], config.generation_config(), "", config.audit_config())[
        "non_private_reference"] is False
    opted = RunConfig(epsilons=[2], audit=True, audit_reference=True, dataset_id="ref-ds")
    spends = {m: r for m, _, r in _spends(opted)}
    assert set(spends) == {"tang", "audit-reference"}
    assert spends["audit-reference"].noise_multiplier == 0 and spends["audit-reference"].purpose == "baseline"
    assert "audit-reference" in non_private_warning(opted)
    assert audit_call(opted, ingested, _plan(opted), [], opted.generation_config(), "", opted.audit_config())["non_private_reference"]
    without_audit = RunConfig(epsilons=[2], audit=False, audit_reference=True)
    assert [m for m, _, _ in _spends(without_audit, "r")] == ["tang"]


def test_opted_in_non_private_baselines_are_infinite_spends_with_a_warning(book, monkeypatch):
    from tasks import charge

    config = RunConfig(epsilons=[2], dataset_id="baselines-ds",
                       baselines=["zero-shot", "sigma-zero", "random-real"])
    kinds = {m: r for m, _, r in _spends(config)}
    assert set(kinds) == {"tang", "sigma-zero", "random-real"}
    assert kinds["sigma-zero"].noise_multiplier == 0 and kinds["sigma-zero"].purpose == "baseline"
    assert kinds["random-real"].noise_multiplier == 0 and kinds["random-real"].purpose == "baseline"
    warning = charge.non_private_warning(config)
    assert "sigma-zero, random-real" in warning and "infinite spend" in warning and "baselines-ds" in warning

    # random-real alone (real records as demos) is refused under any budget, before anything runs
    monkeypatch.setattr(charge.ledger, "Ledger", lambda: book)
    book.set_budget("baselines-ds", 100.0, DELTA)
    only_real = RunConfig(epsilons=[2], dataset_id="baselines-ds", baselines=["random-real"])
    with pytest.raises(BudgetExceededError, match="infinite"):
        charge.charge_plans(only_real.ledger_id, "h1", "run-a", _plan(only_real).privacy_plans())
    assert book.entries("baselines-ds") == []


def test_audit_hook_never_fails_open():
    from dpcore.privacy.plan import PrivacyPlan
    from tasks.charge import audit_charge_hook

    plan = PrivacyPlan("tang", 2.0, DELTA, (Spend.sampled_steps("gaussian", 1.0, 0.1, 4, "audit"),))
    for dataset_id, run_id in ((None, "r"), ("ds", None)):
        with pytest.raises(ConfigError, match="audit"):
            audit_charge_hook(dataset_id, "h1", run_id, plan)


def test_every_audit_demo_set_is_charged_anew(book, monkeypatch):
    """A retried audit draws fresh noise for each demo set: each is charged, never replayed."""
    from dpcore.privacy.plan import PrivacyPlan
    from tasks import charge

    monkeypatch.setattr(charge.ledger, "Ledger", lambda: book)
    spend = Spend.sampled_steps("gaussian", 1.0, 0.1, 4, "audit")
    hook = charge.audit_charge_hook("ds", "h1", "r", PrivacyPlan("tang", 2.0, DELTA, (spend, spend)))
    for demo_set in (0, 1, 0, 1):
        hook(demo_set)
    assert len(book.entries("ds")) == 4


def test_the_pipeline_has_no_fail_open_ledger_path():
    import inspect

    import flows.cli.audit
    import flows.cli.generate
    import flows.pipeline
    import tasks.charge

    for module in (tasks.charge, flows.pipeline, flows.cli.generate, flows.cli.audit):
        source = inspect.getsource(module)
        assert "_ledger_module" not in source and "ledger is not available" not in source
        assert "ledger unavailable" not in source, module.__name__


# --------------------------------------------------------------------------- configuration checked first


def test_a_user_dataset_is_charged_under_its_task_spec_name():
    data_path, spec_path, _, _ = mini_agnews()
    config = RunConfig(task_spec=spec_path, data_path=data_path)
    assert config.dataset == "agnews-mini" and config.ledger_id == "agnews-mini"
    assert RunConfig(task_spec=spec_path, data_path=data_path, dataset_id="tickets").ledger_id == "tickets"
    # an explicit --dataset is the user's choice
    assert RunConfig(task_spec=spec_path, data_path=data_path, dataset="mine").ledger_id == "mine"


def test_cli_ledger_identity_comes_from_the_task_spec():
    from flows.cli import build_parser
    from flows.cli.generate import _config as generate_config
    from flows.cli.run import _config as run_config

    data_path, spec_path, _, _ = mini_agnews()
    parser = build_parser()
    run = run_config(parser.parse_args(["run", "--task-spec", spec_path, "--data-path", data_path]))
    gen = generate_config(parser.parse_args(["generate", "--epsilon", "1", "--task-spec", spec_path,
                                             "--data-path", data_path]))
    assert run.ledger_id == gen.ledger_id == "agnews-mini"


@pytest.mark.parametrize("spec", ["ray", "dask:x", "threads:0", "http://host"])
def test_an_unknown_task_runner_is_refused_by_the_config(spec):
    with pytest.raises(ValidationError, match="task_runner"):
        RunConfig(task_runner=spec)


@pytest.mark.parametrize("spec", ["threads", "threads:3", "dask", "dask:2", "tcp://10.0.0.1:8786", "host:8786"])
def test_known_task_runners_pass(spec):
    assert RunConfig(task_runner=spec).task_runner == spec


def test_shots_zero_with_dp_epsilons_is_refused():
    with pytest.raises(ValidationError, match="shots 0"):
        RunConfig(shots=0)
    with pytest.raises(ValidationError, match="shots 0"):
        RunConfig(shots=0, epsilons=[math.inf])
    assert RunConfig(shots=0, epsilons=[0]).shots == 0  # instruction-only reads nothing private


def test_max_tokens_beyond_the_context_is_refused_before_the_charge(tmp_path):
    import json

    from dpcore.errors import ModelNotFoundError
    from dpcore.lm.models import context_length
    from tasks.charge import preflight

    assert preflight(RunConfig(model="tiny-random", max_tokens=40))["context_length"] == 2048
    with pytest.raises(ConfigError, match="max_tokens"):
        preflight(RunConfig(model="tiny-random", max_tokens=2048))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    assert context_length(str(folder)) == 64
    with pytest.raises(ConfigError, match="max_tokens"):
        preflight(RunConfig(model=str(folder), max_tokens=64))
    with pytest.raises(ModelNotFoundError):
        preflight(RunConfig(model=str(tmp_path / "no-such-model")))
    assert context_length("smollm2-135m") == 8192


# --------------------------------------------------------------------------- ledger display and release gate


def test_ledger_show_says_when_entry_deltas_differ_from_the_total(tmp_path, capsys):
    from flows.cli import main

    path = tmp_path / "ledger.db"
    book = Ledger(path)
    book.charge([_request(delta=1e-3), _request(delta=1e-5, run_id="run-b")], replay_recorded=False)
    assert main(["ledger", "show", "--dataset", "ds", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "composed at delta 1e-05" in out and "calibrated at delta 0.001" in out
    book.set_budget("other", 5.0, DELTA)
    book.charge([_request(dataset_id="other")], replay_recorded=False)
    assert main(["ledger", "show", "--dataset", "other", "--ledger", str(path)]) == 0
    assert "note: the total is composed" not in capsys.readouterr().out
    # a typo in the dataset id is an error naming the ids the ledger holds, not a zero spend
    assert main(["ledger", "show", "--dataset", "typo", "--ledger", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--dataset typo: unknown dataset id" in err and "ds" in err and "other" in err


def test_release_gate_matches_the_calibration_row_not_the_run_id(book):
    from dpcore.fewshot.release import TANG_PURPOSES
    from dpcore.release import gate

    entries = book.charge([_request(run_id="r1", sigma=0.9)], replay_recorded=False).charged
    row = {"mechanism": "gaussian", "noise_multiplier": 0.9, "sampling_rate": 0.02, "steps": 4, "delta": DELTA}

    def ledger_covers(entries, run_id, row):
        spend = {k: row[k] for k in ("mechanism", "noise_multiplier", "sampling_rate", "steps")}
        artifact = gate.Artifact(method="tang", run_id=run_id, path=Path("."), name="demos", epsilon=2.0,
                                 delta=row["delta"], spends=(spend,), seeded_noise=False, info={},
                                 ledger_purposes=TANG_PURPOSES)
        return bool(gate.covering_entries(entries, artifact))
    assert ledger_covers(entries, "r1", row)
    assert not ledger_covers(entries, "r1", {**row, "noise_multiplier": 0.2})  # another epsilon of the run
    assert not ledger_covers(entries, "r1", {**row, "delta": 1e-6})
    assert not ledger_covers(entries, "r2", row)
    assert not ledger_covers(entries, "r1", {**row, "noise_multiplier": None})
