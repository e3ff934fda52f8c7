"""The ledger through the pipeline and the CLI on the tiny model.

- the reviewed scenario: budget epsilon 2; run A at epsilon 1 charged; a new run at epsilon 8
  refused; run A's id reused at epsilon 8 refused too (flow: BudgetExceededError; CLI: exit 3,
  before the flow starts);
- an unseeded retry whose cached noise draw is gone is refused, naming the stage;
- the run summary shows the ledger's composed spend after the run, audit included;
- `dpicl generate`: an unusable --out and a budget refusal come before the charge and the model; a
  re-export of records another id with a budget spends on is refused under a new id (exit 3, before
  the model, nothing charged) and charged with --new-budget-for-same-records.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from pipeline_support import (
    ended_task_runs,
    home,
    mini_agnews,
    prefect_harness,  # noqa: F401  (the shared harness fixture)
    share_tiny_model,
    tiny_config,
)

from dpcore.errors import BudgetExceededError, DpiclError
from dpcore.privacy.ledger import Ledger

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module", autouse=True)
def tiny(tiny_lm):
    share_tiny_model(tiny_lm)
    return tiny_lm


def _quick(**overrides):
    values = dict(audit=False, audit_reference=False, baselines=["zero-shot"], seeds=1, test_size=4)
    values.update(overrides)
    return tiny_config(**values)


def test_a_reused_run_id_is_charged_for_what_it_spends(capsys):
    from flows.cli import main
    from flows.pipeline import run_pipeline

    ledger, dataset_id = Ledger(), "item1-budget"
    delta = 1 / 400  # the budget's delta, which the runs are planned at
    ledger.set_budget(dataset_id, 2.0, delta)
    run_a = run_pipeline(_quick(epsilons=[1.0], dataset_id=dataset_id, delta=delta), run_id="item1-run-a")
    assert run_a["ledger"]["charged"] == 1
    spent = ledger.spend(dataset_id).epsilon
    assert 0.9 < spent <= 1.0 + 1e-6

    with pytest.raises(BudgetExceededError, match="item1-run-b refused"):
        run_pipeline(_quick(epsilons=[8.0], dataset_id=dataset_id, delta=delta), run_id="item1-run-b")
    with pytest.raises(BudgetExceededError, match="item1-run-a refused"):
        run_pipeline(_quick(epsilons=[8.0], dataset_id=dataset_id, delta=delta), run_id="item1-run-a")
    assert len(ledger.entries(dataset_id)) == 1

    # the same through the CLI: refused by the dry run before the flow (or any model) starts
    data_path, spec_path, _, _ = mini_agnews()
    argv = ["run", "--task-spec", spec_path, "--data-path", data_path, "--dataset-id", dataset_id,
            "--model", "tiny-random", "--epsilons", "8", "--num-subsets", "2", "--subset-size", "1", "--top-k", "20",
            "--max-tokens", "4", "--seeds", "1", "--test-size", "4", "--no-audit", "--baselines", "zero-shot",
            "--seed", "123", "--run-id", "item1-run-a"]
    import flows.pipeline

    started = []
    real = flows.pipeline.run_pipeline
    flows.pipeline.run_pipeline = lambda *a, **k: started.append(1) or real(*a, **k)
    try:
        assert main(argv) == 3
    finally:
        flows.pipeline.run_pipeline = real
    err = capsys.readouterr().err
    assert "item1-run-a refused" in err and not started
    assert len(ledger.entries(dataset_id)) == 1

    # the genuine retry of run A (same spends, cached draws) is free
    again = run_pipeline(_quick(epsilons=[1.0], dataset_id=dataset_id, delta=delta), run_id="item1-run-a")
    assert again["ledger"]["charged"] == 0 and again["ledger"]["replayed"] == 1
    assert len(ledger.entries(dataset_id)) == 1


def test_an_unseeded_retry_whose_noise_draw_is_gone_is_refused():
    from flows.pipeline import run_pipeline

    stages = home() / "cache" / "stages" / "generate"
    before = set(stages.iterdir()) if stages.exists() else set()
    config = _quick(seed=None, dataset_id="item2-gone")
    first = run_pipeline(config, run_id="item2-run")
    drawn = sorted(set(stages.iterdir()) - before)
    assert len(drawn) == 4  # one per label
    shutil.rmtree(drawn[0])  # the cached result is gone; the steps the run kept serve the same demos
    again = run_pipeline(config, run_id="item2-run")
    demos = [pd.read_parquet(f"{r['run_dir']}/demos.parquet") for r in (first, again)]
    assert list(demos[0]["text"]) == list(demos[1]["text"])
    shutil.rmtree(set(stages.iterdir()).difference(before).pop())
    for kept in (home() / "private" / "runs").rglob("item2-run/generation/*.json"):
        kept.unlink()  # and the steps it kept too: nothing may be drawn again under the old charge
    with pytest.raises(DpiclError, match=r"stage generate-tang-.*cached noise draw of this run is missing"):
        run_pipeline(config, run_id="item2-run")
    assert len(Ledger().entries("item2-gone")) == 1  # nothing drawn or charged silently


def test_a_stopped_run_resumes_under_its_id_from_its_last_finished_step():
    """A run stopped mid-generation (what Ctrl-C asks for) resumes under its id: no refusal, no second charge
    (the run's ledger entries are the same before and after), each stage continuing after the last step it
    finished and never past T_max, a stage that had not begun drawn once; the demos are the uninterrupted
    run's (seeded: bit for bit)."""
    from dpcore.errors import RunStopped
    from flows.pipeline import run_pipeline
    from tasks import common

    config = _quick(seed=7, max_tokens=8, dataset_id="item2-stop", task_runner="threads:1")
    stages = [home() / "cache" / "stages" / "generate", home() / "private" / "cache" / "stages" / "generate"]
    before = {p for folder in stages if folder.exists() for p in folder.iterdir()}
    whole = run_pipeline(config, run_id="item2-whole")
    for made in {p for folder in stages for p in folder.iterdir()} - before:
        shutil.rmtree(made)  # seeded stages are shared between runs: the stopped run draws its own

    steps: dict[str, list[int]] = {}
    stopping = [True]

    def sink(what, done, total, detail=""):
        if what.startswith("generate tang"):
            steps.setdefault(what, []).append(done)
            if done == 3 and stopping[0]:
                common.STOP_REQUESTED.set()  # a stage stops at its next step's report

    common.add_progress_sink(sink)
    try:
        with pytest.raises(RunStopped):
            run_pipeline(config, run_id="item2-stop")
    finally:
        common.STOP_REQUESTED.clear()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:  # the stopped flow run is Cancelled, neither Failed nor Crashed
        latest = next(r for r in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=20)
                      if r.parameters.get("run_id") == "item2-stop")  # the server's latest of this run
    assert latest.state.is_cancelled() and "stopped on request" in latest.state.message, latest.state
    # and so are the task runs the stop ended: none Failed or Crashed (what the UI shows in red)
    task_runs = ended_task_runs(latest.id, until=lambda runs: any(
        t.name.startswith("generate-tang") and t.state.is_cancelled() for t in runs))
    assert not [t for t in task_runs if t.state.is_failed() or t.state.is_crashed()], task_runs
    cancelled = [t for t in task_runs if t.state.is_cancelled()]
    assert any(t.name.startswith("generate-tang") for t in cancelled), task_runs
    assert all("stopped on request" in t.state.message for t in cancelled), cancelled
    charged = [e.to_dict() for e in Ledger().entries("item2-stop") if e.run_id == "item2-stop"]
    assert [e["purpose"] for e in charged] == ["pipeline"]
    stopped, stopping[0] = dict(steps), False
    assert stopped and all(max(done) < 8 for done in stopped.values())
    steps.clear()
    try:
        resumed = run_pipeline(config, run_id="item2-stop")
    finally:
        common.remove_progress_sink(sink)
    assert [e.to_dict() for e in Ledger().entries("item2-stop") if e.run_id == "item2-stop"] == charged  # once
    assert resumed["ledger"]["charged"] == 0
    for what, done in steps.items():  # each stage takes only the steps after its last finished one
        # a stopped stage finished the step whose report stopped it (kept before the report): it goes on after it
        assert done == list(range(done[0], max(done) + 1)) and max(done) <= 8, (what, done)
        assert what not in stopped or done[0] == max(stopped[what]) + 2, (what, done)
    assert any(done[0] == 1 for done in steps.values())  # one had not begun: drawn once now
    demos = [pd.read_parquet(f"{r['run_dir']}/demos.parquet") for r in (whole, resumed)]
    columns = ["label", "shot", "text", "tokens", "stop_reason"]
    assert demos[0][columns].equals(demos[1][columns])


def test_an_audit_whose_draw_is_gone_is_charged_again_when_it_redraws():
    from flows.pipeline import run_pipeline

    stages = home() / "cache" / "stages" / "audit"
    before = set(stages.iterdir()) if stages.exists() else set()
    config = _quick(seed=None, dataset_id="item2-audit", audit=True, audit_mode="regenerate")  # a charged audit
    run_pipeline(config, run_id="item2-audit-run")
    audits = [e for e in Ledger().entries("item2-audit") if e.purpose == "audit"]
    assert len(audits) == 1
    for folder in set(stages.iterdir()) - before:
        shutil.rmtree(folder)
    again = run_pipeline(config, run_id="item2-audit-run")
    assert again["ledger"]["charged"] == 0  # the generation replays its cached draw
    purposes = [e.purpose for e in Ledger().entries("item2-audit")]
    assert purposes.count("audit") == 2 and purposes.count("pipeline") == 1  # the audit's fresh draw is charged


def test_the_run_summary_shows_the_ledger_after_the_audit(capsys):
    from flows.cli.run import format_results
    from flows.pipeline import run_pipeline
    from tasks.charge import planned_cost
    from tasks.run_plans import build_run_plan

    # a seed of its own: a seeded audit cached by another test would be reused, drawing (and charging) nothing
    config = _quick(epsilons=[2.0], dataset_id="item8-summary", audit=True, seed=8008, audit_mode="regenerate")
    cost = planned_cost(build_run_plan(config).spends("item8-run"))  # what `dpicl run` prints as its plan
    assert set(cost["methods"]) == {"tang", "audit"}
    summary = run_pipeline(config, run_id="item8-run")
    # the audit's DP demo set is in the one charge made before anything ran, and nothing is charged after it
    assert summary["ledger"]["charged"] == 2
    assert sorted(e["purpose"] for e in summary["ledger"]["entries"]) == ["audit", "pipeline"]
    after = summary["ledger_after"]
    assert after["entries_this_run"] == 2 and after["purposes_this_run"] == ["audit", "pipeline"]
    assert after["epsilon"] == pytest.approx(Ledger().spend("item8-summary").epsilon)
    assert after["epsilon"] > 2.0  # the audit's own DP generation composes on top of the run's epsilon
    # the plan's epsilon is the ledger's total after the run, audit included
    assert after["epsilon"] == pytest.approx(cost["epsilon"], rel=1e-9)
    table = format_results(summary)
    assert "ledger: dataset item8-summary spent epsilon" in table and "(2 entries this run: audit, pipeline" in table


def test_cli_run_warns_before_non_private_baselines(capsys, monkeypatch):
    import flows.pipeline
    from flows.cli import main

    monkeypatch.setattr(flows.pipeline, "run_pipeline", lambda *a, **k: (_ for _ in ()).throw(SystemExit(7)))
    data_path, spec_path, _, _ = mini_agnews()
    with pytest.raises(SystemExit):
        main(["run", "--task-spec", spec_path, "--data-path", data_path, "--model", "tiny-random",
              "--methods", "tang", "--epsilons", "1", "--baselines", "zero-shot,sigma-zero"])
    err = capsys.readouterr().err
    assert "WARNING: non-private baseline(s) sigma-zero" in err and "'agnews-mini'" in err
    with pytest.raises(SystemExit):
        main(["demo", "--model", "tiny-random"])
    err = capsys.readouterr().err
    assert "demo: AG News is a public benchmark" in err and "random-real and audit-reference" in err


# --------------------------------------------------------------------------- dpicl generate


def _generate(argv, capsys):
    from flows.cli import main

    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_checks_out_and_budget_before_the_charge_and_the_model(tiny_model_dir, tmp_path, capsys,
                                                                        monkeypatch):
    from dpcore.lm.model import LanguageModel

    data_path, spec_path, _, _ = mini_agnews()
    base = ["--task-spec", spec_path, "--data-path", data_path, "--model", str(tiny_model_dir), "--max-tokens", "2",
            "--num-subsets", "2", "--seed", "1", "--dataset-id", "generate-checks"]
    ledger = Ledger()
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    used = tmp_path / "used"
    used.mkdir()
    (used / "unrelated.txt").write_text("someone else's file")
    for out in (a_file, a_file / "below", used):  # a non-empty folder: its manifest would hash others' files
        code, _, err = _generate([*base, "--epsilon", "4", "--out", str(out)], capsys)
        assert code == 2 and "--out" in err
    assert "not empty" in err
    code, _, err = _generate([*base, "--epsilon", "4", "--max-tokens", "5000", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "max_tokens" in err
    assert ledger.entries("generate-checks") == []

    ledger.set_budget("generate-checks", 0.5, 1 / 400)
    loads = []
    monkeypatch.setattr(LanguageModel, "load", classmethod(lambda cls, *a, **k: loads.append(a) or 1 / 0))
    code, _, err = _generate([*base, "--epsilon", "4", "--out", str(tmp_path / "p")], capsys)
    assert code == 3 and "refused" in err and loads == []
    assert ledger.entries("generate-checks") == []


def test_generate_charges_a_user_dataset_under_its_spec_name(tiny_model_dir, tmp_path, capsys):
    data_path, spec_path, _, _ = mini_agnews()
    before = len(Ledger().entries("agnews-mini"))
    code, stdout, _ = _generate(["--task-spec", spec_path, "--data-path", data_path, "--model", str(tiny_model_dir),
                                 "--max-tokens", "2", "--num-subsets", "2", "--seed", "1", "--epsilon", "4",
                                 "--out", str(tmp_path / "g"), "--json"], capsys)
    assert code == 0
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["ledger_entry"]["dataset_id"] == "agnews-mini" and report["dataset"] == "agnews-mini"
    assert len(Ledger().entries("agnews-mini")) == before + 1


def test_evaluate_random_real_is_charged_as_an_infinite_spend_before_the_model(capsys, monkeypatch, tmp_path):
    from dpcore.lm.model import LanguageModel
    from flows.cli import main

    data_path, spec_path, _, _ = mini_agnews()
    ledger = Ledger()
    ledger.set_budget("agnews-mini-rr", 100.0, 1e-3)
    loads = []
    monkeypatch.setattr(LanguageModel, "load", classmethod(lambda cls, *a, **k: loads.append(a) or 1 / 0))
    spec = tmp_path / "agnews-mini-rr.yaml"
    spec.write_text(open(spec_path).read().replace("name: agnews-mini", "name: agnews-mini-rr"))
    code = main(["evaluate", "--task-spec", str(spec), "--data-path", data_path, "--baseline", "random-real",
                 "--model", "tiny-random", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 3 and "random-real" in err and "infinite" in err and loads == []
    assert ledger.entries("agnews-mini-rr") == []


def test_audit_cli_budget_refusal_comes_before_the_model(capsys, monkeypatch, tmp_path):
    from dpcore.lm.model import LanguageModel
    from flows.cli import main

    data_path, spec_path, _, _ = mini_agnews()
    ledger = Ledger()
    ledger.set_budget("audit-cli-budget", 0.5, 1e-3)
    loads = []
    monkeypatch.setattr(LanguageModel, "load", classmethod(lambda cls, *a, **k: loads.append(a) or 1 / 0))
    code = main(["audit", "--task-spec", spec_path, "--data-path", data_path, "--epsilon", "4", "--model",
                 "tiny-random", "--audit-members", "10", "--audit-demo-sets", "2", "--max-tokens", "4",
                 "--num-subsets", "2", "--subset-size", "1", "--top-k", "10", "--dataset-id", "audit-cli-budget",
                 "--out", str(tmp_path / "a")])
    assert code == 3 and "refused" in capsys.readouterr().err and loads == []
    assert ledger.entries("audit-cli-budget") == []


def test_the_non_private_audit_cli_is_refused_under_a_budget_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from dpcore.lm.model import LanguageModel
    from flows.cli import main

    data_path, spec_path, _, _ = mini_agnews()
    ledger = Ledger()
    ledger.set_budget("audit-np-budget", 100.0, 1e-3)
    loads = []
    monkeypatch.setattr(LanguageModel, "load", classmethod(lambda cls, *a, **k: loads.append(a) or 1 / 0))
    code = main(["audit", "--task-spec", spec_path, "--data-path", data_path, "--non-private", "--model",
                 "tiny-random", "--audit-members", "10", "--dataset-id", "audit-np-budget", "--out", str(tmp_path / "n")])
    err = capsys.readouterr().err
    assert code == 3 and "infinite spend" in err and "refused" in err and loads == []
    assert ledger.entries("audit-np-budget") == []


def test_generate_on_a_re_export_under_a_new_id_is_refused_before_the_model(tiny_model_dir, tmp_path, capsys,
                                                                             monkeypatch):
    from dpcore.lm.model import LanguageModel
    from flows.cli import main

    data_path, spec_path, _, _ = mini_agnews()
    base = ["--task-spec", spec_path, "--model", str(tiny_model_dir), "--max-tokens", "2", "--num-subsets", "2",
            "--seed", "1", "--epsilon", "4"]
    book = Ledger()
    book.set_budget("records-owner", 50.0, 1 / 400)
    assert main(["generate", *base, "--data-path", data_path, "--dataset-id", "records-owner",
                 "--out", str(tmp_path / "a")]) == 0
    # The same records re-exported: renumbered ids, rows in another order, five new rows.
    frame = pd.read_csv(data_path).sample(frac=1.0, random_state=3).reset_index(drop=True)
    frame["id"] = [f"x{i}" for i in range(len(frame))]
    extra = frame.head(5).assign(id=[f"new{i}" for i in range(5)], text=[f"a new story {i}" for i in range(5)])
    export = tmp_path / "re-export.csv"
    pd.concat([frame, extra]).to_csv(export, index=False)
    capsys.readouterr()

    loads = []
    real_load = LanguageModel.load
    monkeypatch.setattr(LanguageModel, "load", classmethod(lambda cls, *a, **k: loads.append(a) or 1 / 0))
    code = main(["generate", *base, "--data-path", str(export), "--dataset-id", "records-renamed",
                 "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 3 and "records-owner" in err and "--new-budget-for-same-records" in err and loads == []
    assert book.entries("records-renamed") == []
    assert "a new story" not in err and "x1" not in err

    monkeypatch.setattr(LanguageModel, "load", real_load)
    assert main(["generate", *base, "--data-path", str(export), "--dataset-id", "records-renamed",
                 "--new-budget-for-same-records", "--out", str(tmp_path / "c")]) == 0
    assert len(book.entries("records-renamed")) == 1
