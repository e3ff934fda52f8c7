"""`dpicl dp-icl` (DP-ICL, Wu et al. 2024, as a command) on the tiny model: the budget's queries said up front are
`queries_within`'s, the ledger is charged before any answer, a fixed seed reproduces the noisy-argmax answers, the
--json contract, no private text leaves the private store, and bad input is one line, exit 2, nothing charged."""

from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest

from dpcore.privacy.ledger import Ledger

SPEC = """
name: dpicl-reviews
kind: classification
source: {type: file, path: unused.jsonl, text_column: text, label_column: label, id_column: rid}
split: {test_size: 0.2, seed: 1}
labels: {negative: negative, positive: positive}
generation: {instruction: Write a review., label_prefix: "Sentiment: ", text_prefix: "Review:"}
icl: {instruction: Classify reviews., input_prefix: "Review:", output_prefix: "Sentiment:"}
"""
MARK = "zqxsecret"  # in every private record's text: must never leave the private store
# a budget of 3 queries: epsilon 1 at noise multiplier 0.8, M = 4, k = 2 on these records (delta 1/|D|)
SMALL = ["--epsilon", "1", "--noise-multiplier", "0.8", "--subsets", "4", "--shots", "2"]
JSON_KEYS = {"method", "run_id", "dataset", "dataset_id", "data_hash", "epsilon", "delta", "subsets", "shots",
             "noise_multiplier", "noise_std", "sampling_rate", "queries", "queries_per_draw", "queries_affordable",
             "records", "vote_mode", "aggregation", "max_keywords", "answers", "accuracy", "labelled", "correct",
             "ledger", "seeded_noise", "run_dir"}


def write_dataset(folder) -> list[str]:
    """The task YAML and 60 private records (30 per label); returns the data flags."""
    (folder / "spec.yaml").write_text(SPEC)
    with open(folder / "data.jsonl", "w") as handle:
        for i in range(60):
            label = "positive" if i % 2 else "negative"
            handle.write(json.dumps({"rid": f"r{i}", "label": label,
                                     "text": f"{MARK}{i} this film was {'great' if i % 2 else 'awful'}"}) + "\n")
    return ["--task-spec", str(folder / "spec.yaml"), "--data-path", str(folder / "data.jsonl"),
            "--model", "tiny-random"]


@pytest.fixture(scope="module")
def data_flags(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("dp-icl-data"))


@pytest.fixture(scope="module")
def loaded(data_flags):
    from dpcore.data.datasets import load_dataset
    from dpcore.data.taskspec import load_task_spec

    return load_dataset(load_task_spec(data_flags[1]), data_flags[3])


def entries(run_id: str | None = None) -> list:
    rows = Ledger().entries("dpicl-reviews") if "dpicl-reviews" in Ledger().dataset_ids() else []
    return [e for e in rows if run_id is None or e.run_id == run_id]


def test_the_budget_line_is_queries_within_and_the_plan_is_charged_before_any_answer(cli, data_flags, loaded,
                                                                                      monkeypatch, one_thread):
    from dpcore.dp_icl.privacy import queries_within
    from tasks import dp_icl

    records = len(loaded.train)
    expected = queries_within(1.0, 1 / records, 0.8, records, subsets=4, shots=2)
    assert 0 < expected < len(loaded.test)  # the budget, not the test split, limits the run
    seen = []
    real = dp_icl.answer_queries

    def answering(*args, **kwargs):  # the ledger already holds the run's charge when the first vote is cast
        seen.append(len(entries()))
        return real(*args, **kwargs)

    monkeypatch.setattr(dp_icl, "answer_queries", answering)
    before = len(entries())
    code, out, err = cli(["dp-icl", *data_flags, *SMALL, "--seed", "3", "--json"])
    assert code == 0, err
    summary = json.loads(out)
    assert re.search(rf"affords {expected} queries; {expected} planned", err), err
    assert summary["queries_affordable"] == expected and summary["queries"] == expected
    assert seen == [before + 1]
    mine = entries(summary["run_id"])
    assert len(mine) == 1 and mine[0].purpose == "dp-icl"
    assert mine[0].steps == expected and mine[0].noise_multiplier == pytest.approx(0.8)
    assert mine[0].sampling_rate == pytest.approx(8 / records)
    assert mine[0].epsilon_upper <= 1.0


def test_the_json_contract_and_answers_are_the_noisy_argmax_labels_of_a_fixed_seed(cli, data_flags, loaded,
                                                                                    tiny_lm, one_thread):
    from dpcore.dp_icl import answer, subsets
    from dpcore.dp_icl.privacy import dp_icl_plan
    from dpcore.fewshot.mechanisms import noise_generator
    from tasks.dp_icl import test_queries

    argv = ["dp-icl", *data_flags, "--epsilon", "2", "--queries", "3", "--subsets", "4", "--shots", "2",
            "--seed", "11", "--json"]
    code, out, err = cli(argv)
    assert code == 0, err
    first = json.loads(out)
    assert set(first) == JSON_KEYS
    assert (first["method"], first["epsilon"], first["queries"], first["subsets"], first["shots"]) == \
        ("dp-icl", 2.0, 3, 4, 2)
    assert first["delta"] == pytest.approx(1 / len(loaded.train)) and first["seeded_noise"] is True
    assert first["noise_std"] == pytest.approx(first["noise_multiplier"] * 2 ** 0.5)
    assert (first["aggregation"], first["max_keywords"]) == ("rnm", None)
    assert [a["test_item"] for a in first["answers"]] == [0, 1, 2]
    labels = [a["label"] for a in first["answers"]]
    assert set(labels) <= {"negative", "positive"}
    texts, gold = test_queries(loaded)
    texts, gold = texts[:3], gold[:3]
    assert first["correct"] == sum(a == g for a, g in zip(labels, gold, strict=True)) and first["labelled"] == 3
    assert first["accuracy"] == pytest.approx(first["correct"] / 3)
    # the same seed answers the same; the answers are RNM-Gaussian on the plan's noise (recomputed here)
    code, out, _ = cli(argv)
    assert code == 0 and [a["label"] for a in json.loads(out)["answers"]] == labels
    plan = dp_icl_plan(2.0, first["delta"], 3, len(loaded.train), subsets=4, shots=2)
    assert plan.parameters["noise_multiplier"] == pytest.approx(first["noise_multiplier"])
    rng, _ = noise_generator(11)
    key = subsets.run_key(rng)
    records = list(zip(loaded.train["text"], loaded.train["label"], loaded.train["id"].astype(str), strict=True))
    direct = answer.answer_queries(tiny_lm, loaded.spec, records, texts, plan, key, rng)
    assert list(direct.labels) == labels
    # the run's key is in its private folder only
    from dpcore.home import private_dir

    keys = list(private_dir().rglob(f"*{first['run_id']}/dp_icl_key.bin"))
    assert len(keys) == 1 and keys[0].read_bytes() == key


def test_no_private_text_leaves_the_private_store(cli, data_flags, dpicl_home, tmp_path, one_thread):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "a great film", "label": "positive", "ref": 7}\n{"text": "awful"}\n')
    code, out, err = cli(["dp-icl", *data_flags, "--noise-multiplier", "1", "--queries", "2", "--subsets", "4",
                          "--shots", "2", "--queries-file", str(queries)])
    assert code == 0, err
    assert MARK not in out and MARK not in err
    assert re.search(r"line 1: (positive|negative)\nline 2: (positive|negative)\n", out), out
    assert "2 queries planned cost epsilon" in err
    code, out2, err2 = cli(["dp-icl", *data_flags, *SMALL, "--queries", "1", "--json"])  # test items as queries
    assert code == 0 and MARK not in out2 + err2
    public = [p for p in dpicl_home.rglob("*") if p.is_file() and "private" not in p.relative_to(dpicl_home).parts
              and p.suffix in ("", ".json", ".log", ".txt", ".jsonl", ".parquet", ".db")]
    leaked = [str(p) for p in public if MARK.encode() in p.read_bytes()]
    assert leaked == []
    written = json.loads((dpicl_home.joinpath(json.loads(out2)["run_dir"]) / "dp_icl.json").read_text())
    assert written["answers"] == json.loads(out2)["answers"]


@pytest.mark.parametrize("flags, names", [
    (["--epsilon", "1", "--queries", "0"], "argument --queries"),
    (["--epsilon", "-1"], "argument --epsilon"),
    (["--epsilon", "0"], "argument --epsilon"),
    (["--noise-multiplier", "0"], "argument --noise-multiplier"),
    (["--epsilon", "1", "--vote-mode", "loud"], "argument --vote-mode"),
    (["--epsilon", "1", "--preset", "tpu"], "argument --preset"),
    ([], "give --epsilon or --noise-multiplier"),
    (["--epsilon", "1", "--queries", "999"], "--queries 999: only"),
    (["--epsilon", "1", "--subsets", "40", "--shots", "4"], "exceeds the"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_charged(cli, data_flags, flags, names, capsys):
    from flows.cli import main

    before = len(entries())
    try:
        code = main(["dp-icl", *data_flags, *flags])
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and captured.out == "", captured.err
    assert len(lines) == 1 and "Traceback" not in captured.err and names in lines[0], lines
    assert lines[0].startswith("dpicl dp-icl")
    assert len(entries()) == before


def test_over_the_ledgers_budget_is_refused_before_any_charge(cli, data_flags, one_thread):
    cli(["dp-icl", *data_flags, *SMALL, "--queries", "1"])  # some spend on these records
    book = Ledger()
    spent = book.spend("dpicl-reviews").epsilon
    book.set_budget("dpicl-reviews", spent + 0.01, book.spend("dpicl-reviews").delta)
    before = len(entries())
    code, out, err = cli(["dp-icl", *data_flags, *SMALL])
    assert code == 3 and out == "" and "budget" in err, err
    assert len(entries()) == before
    with sqlite3.connect(book.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM entries WHERE dataset_id = 'dpicl-reviews'").fetchone()[0] == before
    assert np.isfinite(spent)
