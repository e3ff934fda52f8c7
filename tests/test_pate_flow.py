"""`dpicl pate` and the PromptPATE flow end to end on the tiny model: the --json contract, the ledger
charged before any teacher query (refused over budget with exit 3, nothing written), private tables
only in the private store, and bad input refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pipeline_support import home, mini_agnews, prefect_harness, share_tiny_model  # noqa: F401

from dpcore.errors import DpiclError
from flows.cli import main

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _args(*extra: str, dataset_id: str | None = None, public: str | None = "ood") -> list[str]:
    data_path, spec_path, _, _ = mini_agnews()
    args = ["pate", "--dataset", "agnews-mini", "--data-path", data_path, "--task-spec", spec_path,
            "--model", "tiny-random", "--epsilon", "inf", "--teachers", "6", "--queries", "12", "--sigma1", "1",
            "--sigma2", "2", "--repeats", "2", "--test-size", "8", "--student-candidates", "3", "--seed", "5"]
    if dataset_id:
        args += ["--dataset-id", dataset_id]
    if public:
        args += ["--public", public]
    return args + list(extra)


def _written() -> set[Path]:
    root = home()
    return {p for sub in ("runs", "private/runs") for p in (root / sub).rglob("*")} if root.exists() else set()


def test_pate_cli_json_contract_and_private_tables(tiny_lm, capsys):
    share_tiny_model(tiny_lm)
    code = main(_args("--baselines", "zero-shot,ensemble,upper-bound", "--json", dataset_id="pate-json"))
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    summary = json.loads(out)
    # the plan said before the run, from public parameters only
    assert "PromptPATE plan (cpu preset): E=6 teachers x 1 shot(s), T=5, sigma1=1, sigma2=2; 12 queries x 2 " \
           "repeat(s) (at most 12 asked)" in captured.err
    assert summary["preset"] == "cpu"
    for key in ("epsilon", "delta", "queries", "answered", "accuracy", "student_prompt",
                "teachers", "shots", "threshold", "sigma1", "sigma2", "vote_mode", "repeats", "public", "baselines"):
        assert key in summary
    # the data-dependent epsilon is a non-DP statistic of the votes: private store only, nowhere public
    assert "data_dependent" not in out and "data-dependent" not in out
    assert summary["teachers"] == 6 and summary["threshold"] == 5 and summary["queries"] == 12
    assert set(summary["accuracy"]) >= {"mean", "std"} and len(summary["answered"]) == 2
    assert summary["epsilon"] > summary["epsilon_per_repeat"] > 0 and summary["seeded_noise"] is True
    assert set(summary["baselines"]) == {"zero-shot", "ensemble", "upper-bound"}
    # the plan was charged (threshold test and GNMax over both repeats, and the non-private baselines)
    entries = summary["ledger"]["entries"]
    assert sorted((e["purpose"], e["steps"]) for e in entries) == [("baseline", 1), ("pate", 24), ("pate", 24)]
    public, private = Path(summary["run_dir"]), Path(summary["private_run_dir"])
    assert {"pate_queries.parquet", "pate_noisy_labels.parquet", "pate_students.parquet",
            "pate_results.parquet"} <= {p.name for p in public.iterdir()}
    assert {"teacher_assignments.parquet", "vote_histograms.parquet", "pate_data_dependent.json",
            "records.parquet"} <= {p.name for p in private.iterdir()}
    assert not {"teacher_assignments.parquet", "vote_histograms.parquet"} & {p.name for p in public.iterdir()}
    results = pd.read_parquet(public / "pate_results.parquet")
    assert results["method"].tolist() == ["pate", "zero-shot", "ensemble", "upper-bound"]
    assert not [c for c in results.columns if "dependent" in c]
    assert json.loads((private / "pate_data_dependent.json").read_text())["epsilon_data_dependent"] > 0
    # the students' test predictions are labelled as PromptPATE's, not as DP few-shot generation's demos
    assert set(pd.read_parquet(private / "pate_predictions.parquet")["method"]) == {"pate", "zero-shot"}
    # the student prompt is made of public queries with their noisy labels
    queries = set(pd.read_parquet(public / "pate_queries.parquet")["text"])
    assert {d["text"] for d in summary["student_prompt"]} <= queries


def test_pate_over_budget_is_refused_with_exit_3_and_nothing_written(tiny_lm, capsys):
    from dpcore.privacy.ledger import Ledger

    share_tiny_model(tiny_lm)
    Ledger().set_budget("pate-budget", 1.0, 1e-3)
    before = _written()
    assert main(_args(dataset_id="pate-budget")) == 3
    assert "budget" in capsys.readouterr().err.lower()
    assert _written() == before
    assert not Ledger().spend("pate-budget").entries


@pytest.mark.parametrize("extra, match", [
    (["--teachers", "500"], "--pate-teachers (pate_teachers) x --pate-shots (pate_shots)"),
    (["--queries", "100000"], "pate_queries"),
    (["--threshold", "7"], "pate_threshold"),
    (["--sigma2", "0"], "pate_sigma2"),
    (["--sigma1", "-1"], "pate_sigma1"),
    (["--public", "iid"], "never carved out of your own records file"),
    (["--public-path", "x.csv"], "give one of them"),
])
def test_bad_input_is_refused_before_anything_is_written(extra, match, capsys):
    before = _written()
    assert main(_args(*extra, public=None if "--public" in extra else "ood")) == 2
    assert match in capsys.readouterr().err
    assert _written() == before


@pytest.mark.parametrize("epsilon, match", [
    ("0.5", "--pate-queries (pate_queries): the plan labels at most 0 public queries per repeat within epsilon 0.5"),
    ("0", "PromptPATE needs an epsilon > 0"),
])
def test_an_epsilon_too_small_for_a_student_is_refused_and_charges_nothing(epsilon, match, capsys):
    from dpcore.privacy.ledger import Ledger

    before = _written()
    assert main(_args("--epsilon", epsilon, dataset_id="pate-too-small")) == 2
    err = capsys.readouterr().err
    assert match in err and len([line for line in err.splitlines() if "pate_queries" in line or "epsilon" in line]) == 1
    assert _written() == before
    assert not Ledger().entries("pate-too-small")


def test_bad_public_files_are_refused(tmp_path, capsys):
    """An empty public file is refused before anything is written. A public file holding a private text is
    NOT refused: comparing it with the private records would answer "is this text private?" for free."""
    empty = tmp_path / "empty.csv"
    empty.write_text("text\n")
    before = _written()
    assert main(_args(public=str(empty))) == 2
    assert "no records" in capsys.readouterr().err
    assert _written() == before


def test_a_run_stopped_during_the_flock_resumes_under_its_id_with_no_refusal_and_no_second_charge(tiny_lm):
    """Stopped while the flock scores the public queries (the teachers drawn, the noisy labelling not begun): the
    same run id resumes it, the labelling drawn once (the flow marked it when it charged it), nothing refused or
    charged again. With neither its cached draw nor its mark (a forged retry), the labelling is refused."""
    import shutil

    from pipeline_support import tiny_config

    from dpcore.errors import RunStopped
    from dpcore.privacy.ledger import Ledger
    from flows.pate import pate_flow
    from tasks import common

    share_tiny_model(tiny_lm)
    config = tiny_config(methods=["pate"], epsilons=[4.0], dataset_id="pate-stop", seed=None, test_size=4,
                         audit=False, audit_reference=False, baselines=["zero-shot"], pate_baselines=[],
                         pate_teachers=6, pate_queries=10, pate_sigma1=5.0, pate_sigma2=5.0, pate_repeats=1,
                         pate_public="ood", pate_student_candidates=3)

    def sink(what, done, total, detail=""):
        if what.startswith("PromptPATE flock public"):
            common.STOP_REQUESTED.set()  # the flock stops at its next report

    common.add_progress_sink(sink)
    try:
        with pytest.raises(RunStopped):
            pate_flow(config=config, run_id="pate-stop")
    finally:
        common.STOP_REQUESTED.clear()
        common.remove_progress_sink(sink)
    charged = [e.to_dict() for e in Ledger().entries("pate-stop") if e.run_id == "pate-stop"]
    assert charged and {e["purpose"] for e in charged} == {"pate"}
    marks = next((home() / "private" / "runs").rglob("pate-stop")) / "pate"
    assert sorted(p.name for p in marks.iterdir()) == ["pate-aggregate.pending"]  # the teachers drew theirs

    resumed = pate_flow(config=config, run_id="pate-stop")
    assert resumed["ledger"]["charged"] == 0 and resumed["answered"] and resumed["student_prompt"] is not None
    assert [e.to_dict() for e in Ledger().entries("pate-stop") if e.run_id == "pate-stop"] == charged
    assert not list(marks.iterdir())  # drawn: its cached result serves a retry from now on

    for root in (home() / "cache" / "stages", home() / "private" / "cache" / "stages"):
        shutil.rmtree(root / "pate-aggregate", ignore_errors=True)  # the draw is gone, and there is no mark
    with pytest.raises(DpiclError, match="stage pate-aggregate .*cached noise draw of this run is missing"):
        pate_flow(config=config, run_id="pate-stop")
    assert [e.to_dict() for e in Ledger().entries("pate-stop") if e.run_id == "pate-stop"] == charged
