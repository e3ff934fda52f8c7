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
