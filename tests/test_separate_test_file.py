"""A user dataset's test split from its own file (`--test-path`, RunConfig.test_path).

With a separate test file every row of the data file is private (generation may sample it) and no
test rows are held out of it; the test file is read and validated by the same loader, with the same
errors (file, line, column; never a record's text). Without it, the task's seeded split holds test
rows out of the data file as before.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from pipeline_support import prefect_harness  # noqa: F401  (the shared harness fixture)
from tickets import ROWS

from dpcore.data.datasets import content_hash, load_dataset
from dpcore.errors import DataValidationError

TEST_ROWS = [
    {"ticket_id": "q1", "body": "charged for a plan I cancelled", "topic": "billing"},
    {"ticket_id": "q2", "body": "dashboard will not load", "topic": "outage"},
    {"ticket_id": "q3", "body": "duplicate invoice this month", "topic": "billing"},
]


@pytest.fixture()
def files(tmp_path):
    data = tmp_path / "tickets.csv"
    pd.DataFrame(ROWS).to_csv(data, index=False)
    test = tmp_path / "tickets_test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in TEST_ROWS))
    return data, test


def test_a_separate_test_file_is_the_test_split_and_every_data_row_is_private(tickets_spec, files):
    data, test = files
    split = load_dataset(tickets_spec, data)
    assert len(split.train) == 4 and len(split.test) == 2  # in-file split: 2 rows held out

    loaded = load_dataset(tickets_spec, data, test)
    assert sorted(loaded.train["id"]) == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert list(loaded.test["id"]) == ["q1", "q2", "q3"] and list(loaded.test.columns) == ["id", "text", "label"]
    assert loaded.test["label"].tolist() == ["billing", "outage", "billing"]
    assert loaded.content_hash == content_hash(loaded.train) != split.content_hash
    assert loaded.summary()["train_size"] == 6 and loaded.summary()["test_size"] == 3


def test_the_audits_holdout_is_a_keyed_split_of_the_private_file_that_one_record_more_does_not_move(
        tickets_spec, files, tmp_path):
    data, test = files
    rows = [{"ticket_id": f"r{i}", "body": f"ticket number {i}", "topic": ("billing", "outage")[i % 2]}
            for i in range(400)]
    pd.DataFrame(rows).to_csv(data, index=False)
    loaded = load_dataset(tickets_spec, data, test, audit_holdout=0.1)
    held, read = set(loaded.audit["id"]), set(loaded.train["id"])
    assert not held & read and len(held | read) == 400 and 20 <= len(held) <= 60  # about a tenth, by hash
    assert list(loaded.audit.columns) == ["id", "text", "label"] and loaded.summary()["audit_holdout"] == len(held)
    assert loaded.content_hash == content_hash(loaded.train)  # the records the methods read
    assert list(loaded.test["id"]) == ["q1", "q2", "q3"]  # the test file only evaluates
    more = tmp_path / "more.csv"
    pd.DataFrame([*rows, {"ticket_id": "new", "body": "one ticket more", "topic": "billing"}]).to_csv(more, index=False)
    neighbour = load_dataset(tickets_spec, more, test, audit_holdout=0.1)
    assert set(neighbour.audit["id"]) - {"new"} == held and set(neighbour.train["id"]) - {"new"} == read
    assert load_dataset(tickets_spec, data, test).audit.empty  # no holdout asked: every row is read
    pd.DataFrame(ROWS).to_csv(data, index=False)  # six rows: a holdout that may be empty is no error
    small = load_dataset(tickets_spec, data, test, audit_holdout=0.1)
    assert len(small.train) + len(small.audit) == 6 and len(small.train) >= 5
    with pytest.raises(DataValidationError, match="--audit-holdout=0.99 leaves no rows on one side"):
        load_dataset(tickets_spec, data, test, audit_holdout=0.99)
    assert load_dataset(tickets_spec, data).audit.empty  # no test file: the test split is held out already


@pytest.mark.parametrize("rows, match", [
    ([{"ticket_id": "q1", "body": "printer on fire", "subject": "billing"}], "missing column 'topic'"),
    ([{"ticket_id": "q1", "body": "printer on fire", "topic": "hardware"}], "line 1: column 'topic': not a label of the task"),
    ([{"ticket_id": "q1", "body": "  ", "topic": "billing"}], "line 1: column 'body': empty text"),
    ([{"ticket_id": "q1", "body": "a", "topic": "billing"}, {"ticket_id": "q1", "body": "b", "topic": "outage"}],
     "line 2: column 'ticket_id': duplicate id"),
])
def test_the_test_file_is_validated_like_the_data_file(tickets_spec, files, tmp_path, rows, match):
    data, _ = files
    test = tmp_path / "bad_test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataValidationError, match=match) as caught:
        load_dataset(tickets_spec, data, test)
    assert str(test) in str(caught.value) and "printer on fire" not in str(caught.value)


def test_a_missing_or_unsupported_test_file_is_a_clear_error(tickets_spec, files, tmp_path):
    data, _ = files
    with pytest.raises(DataValidationError, match="file not found"):
        load_dataset(tickets_spec, data, tmp_path / "nope.csv")
    (tmp_path / "test.txt").write_text("x")
    with pytest.raises(DataValidationError, match="unsupported file type"):
        load_dataset(tickets_spec, data, tmp_path / "test.txt")


def test_test_path_is_a_run_config_field_and_a_flag_of_every_command_that_reads_data():
    from dpcore.config import RunConfig
    from flows.cli import build_parser

    assert RunConfig(test_path="t.csv").flat()["test_path"] == "t.csv"
    parser = build_parser()
    for command in (["run"], ["generate", "--epsilon", "1"], ["evaluate", "--baseline", "zero-shot"],
                    ["audit", "--non-private"]):
        args = parser.parse_args([*command, "--test-path", "t.csv"])
        assert args.test_path == "t.csv", command


@pytest.mark.usefixtures("prefect_harness")
def test_pipeline_ingest_takes_the_test_split_from_the_test_file(tickets_spec, files, tmp_path):
    from prefect import flow

    from dpcore.data.artifacts import read_table
    from dpcore.home import is_private_path
    from tasks.common import Ingested
    from tasks.ingest import ingest

    data, test = files
    spec_path = tmp_path / "tickets.yaml"

    @flow(name="ingest-with-test-file")
    def run() -> Ingested:
        return ingest("tickets", "test-file-run", str(data), str(spec_path), str(test))

    ingested = run()
    records = read_table(ingested.records_path)
    assert is_private_path(ingested.records_path)
    assert sorted(records.loc[records["split"] == "train", "id"]) == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert list(records.loc[records["split"] == "test", "id"]) == ["q1", "q2", "q3"]
    assert ingested.num_private_records == 6 and ingested.num_test == 3
    assert not (records["split"] == "audit").any()


@pytest.mark.usefixtures("prefect_harness")
def test_with_a_test_file_the_audit_reads_held_out_rows_of_the_private_file_and_charges_nothing(tmp_path, files):
    """The run's plan with --test-path and its audit on: only the method's spend (no regenerated demo sets), the
    audit's non-member pool the rows held out of the private file, and those rows in the private records table
    as the audit's split, never the methods' (`AuditConfig.held_out`); a file too small to hold rows out plans
    its audit skipped, said before the run, instead of failing."""
    from prefect import flow
    from tickets import SPEC_YAML

    from dpcore.config import RunConfig
    from dpcore.data.artifacts import read_table
    from tasks.ingest import ingested_for, load_data, private_split
    from tasks.run_plans import build_run_plan

    data, test = files
    rows = [{"ticket_id": f"r{i}", "body": f"ticket number {i} about the bill" if i % 2 else f"outage {i} again",
             "topic": ("billing", "outage")[i % 2 == 0]} for i in range(600)]
    pd.DataFrame(rows).to_csv(data, index=False)
    spec = tmp_path / "tickets.yaml"
    spec.write_text(SPEC_YAML)
    common = dict(dataset="tickets", task_spec=str(spec), data_path=str(data), test_path=str(test),
                  model="tiny-random", methods=["tang"], epsilons=[4.0], delta=1e-5, max_tokens=5)
    plan = build_run_plan(RunConfig(**common))
    assert plan.audit is not None and plan.audit.plans == ()
    assert plan.audit.config.mode == "run-demos" and plan.audit.config.held_out == "holdout"
    assert [p.method for p in plan.privacy_plans()] == ["tang"]
    held = len(plan.data.audit)
    assert 30 <= held <= 90 and plan.num_private_records == 600 - held
    assert load_data(RunConfig(**common)).audit.empty  # a command that audits nothing (generate) holds none out
    regenerated = build_run_plan(RunConfig(**common, audit_mode="regenerate"))  # what the test file used to cost
    assert regenerated.num_private_records == 600 and [p.method for p in regenerated.privacy_plans()] == ["tang", "audit"]

    @flow(name="ingest-with-audit-holdout")
    def ingest_it():
        return ingested_for(plan, "holdout-run", None, "tang")

    ingested = ingest_it()
    records = read_table(ingested.records_path)
    assert (records["split"] == "audit").sum() == held and ingested.num_private_records == 600 - held
    assert set(private_split(ingested.records_path, "audit")["id"]) == set(plan.data.audit["id"])

    pd.DataFrame(rows[:20]).to_csv(data, index=False)  # twenty rows: a few held out at most
    small = build_run_plan(RunConfig(**common))
    assert small.audit.config is None and small.audit.note.startswith("audit skipped: ")
    assert [p.method for p in small.privacy_plans()] == ["tang"]
