"""Record ids come from an id column or the record's content, for every source (a file, a hub source, the
shipped StaICC files, a separate test file), never from a row position: one record inserted anywhere renames
no other record, so no other record moves between the private and test splits or between PromptPATE's
teachers (the neighbouring datasets the charged epsilon assumes)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from pipeline_support import write_hub_task
from tickets import ROWS

from dpcore.data import datasets
from dpcore.data.datasets import content_ids, load_dataset, record_split
from dpcore.data.taskspec import load_task_spec
from dpcore.errors import DataValidationError
from dpcore.pate.teachers import assign_teachers

LABELS = ("World", "Sports", "Business", "Technology")
WORDS = ("market", "league", "summit", "chip", "harvest", "orbit", "tariff", "striker", "merger", "vaccine")
TEACHERS, SHOTS = 100, 2


def _records(count: int, start: int = 0) -> pd.DataFrame:
    """Distinct made-up records (no id column)."""
    rows = range(start, start + count)
    return pd.DataFrame({
        "text": [f"report {i}: {WORDS[i % 10]} {WORDS[i // 10 % 10]} {WORDS[i // 100 % 10]} news" for i in rows],
        "label": [LABELS[(i * 7) % 4] for i in rows],
    })


def _insert(frame: pd.DataFrame, row: int, record: dict) -> pd.DataFrame:
    return pd.concat([frame.iloc[:row], pd.DataFrame([record]), frame.iloc[row:]], ignore_index=True)


def _teachers(train: pd.DataFrame) -> list[tuple[str, ...]]:
    """PromptPATE's teachers of a private split (a fixed key), as the texts of their demonstrations."""
    text_of = dict(zip(train["id"], train["text"], strict=True))
    teachers = assign_teachers(train["id"].tolist(), TEACHERS, SHOTS, np.random.default_rng(7))
    return [tuple(text_of[i] for i in demos) for demos in teachers.demos]


Splits = tuple[pd.DataFrame, pd.DataFrame]


def _assert_one_record_moves(before: Splits, after: Splits, new_text: str) -> None:
    """(train, test) of D and of D plus the record `new_text`: every other record (the texts are distinct)
    keeps its split and its teacher."""
    (b_train, b_test), (a_train, a_test) = before, after
    assert set(a_train["text"]) | set(a_test["text"]) == set(b_train["text"]) | set(b_test["text"]) | {new_text}
    moved = (set(b_train["text"]) & set(a_test["text"])) | (set(b_test["text"]) & set(a_train["text"]))
    assert not moved, f"{len(moved)} records moved between train and test"
    teachers_before, teachers_after = _teachers(b_train), _teachers(a_train)
    changed = [i for i in range(TEACHERS) if teachers_before[i] != teachers_after[i]]
    assert len(changed) <= 1, f"{len(changed)} teacher prompts changed"
    for i in changed:  # only the teacher the new record joined
        assert new_text in teachers_after[i]


# ---------------------------------------------------------------- a hub-type source, offline


def test_a_local_hub_task_spec_loads_offline(tmp_path):
    frame = _records(60)
    spec_path = write_hub_task(tmp_path, frame, test_frame=_records(10, start=60))
    spec = load_task_spec(spec_path)
    assert spec.source.type == "hub"
    data = load_dataset(spec)
    assert data.source.startswith("hub:") and not data.shipped and data.public.empty
    assert len(data.train) + len(data.test) == 70  # both splits, merged and split again by the spec
    assert set(data.train["label"]) == set(LABELS)
    ids = pd.concat([data.train, data.test])
    assert sorted(ids["id"]) == sorted(content_ids("hubtask", ids["text"].tolist(), ids["label"].tolist()))


def test_a_hub_path_relative_to_the_yaml_folder(tmp_path, monkeypatch):
    spec_path = write_hub_task(tmp_path / "project", _records(40))
    text = spec_path.read_text().replace(str(tmp_path / "project") + "/", "")
    spec_path.write_text(text)
    monkeypatch.chdir(tmp_path)  # the working directory is not the YAML's folder
    spec = load_task_spec("project/hubtask.yaml")
    assert spec.source.path == str(tmp_path / "project" / "hubtask-data")
    assert len(load_dataset(spec).train) > 0


def test_a_hub_source_takes_its_id_column_and_refuses_a_duplicate_across_splits(tmp_path):
    frame = _records(40).assign(id=[f"r{i}" for i in range(40)])
    data = load_dataset(load_task_spec(write_hub_task(tmp_path / "ok", frame)))
    assert set(data.train["id"]) | set(data.test["id"]) == set(frame["id"])
    again = _records(5, start=40).assign(id=["s0", "s1", "r7", "s3", "s4"])  # r7 is in the train split too
    spec = load_task_spec(write_hub_task(tmp_path / "dup", frame, test_frame=again))
    with pytest.raises(DataValidationError) as info:
        load_dataset(spec)
    message = str(info.value)
    assert "[test]: row 3: column 'id': duplicate id" in message and "[train]: row 8" in message
    assert "r7" not in message  # an id may be private: never printed
    frame.loc[4, "id"] = None
    with pytest.raises(DataValidationError, match=r"\[train\]: row 5: column 'id': missing id"):
        load_dataset(load_task_spec(write_hub_task(tmp_path / "missing", frame)))


def test_one_record_inserted_into_a_hub_source_moves_no_other_record(tmp_path):
    frame = _records(3000)
    new = {"text": "a record only the neighbouring dataset holds: zygomorphic quetzal", "label": "World"}
    before = load_dataset(load_task_spec(write_hub_task(tmp_path / "D", frame)))
    after = load_dataset(load_task_spec(write_hub_task(tmp_path / "D1", _insert(frame, 10, new))))
    _assert_one_record_moves((before.train, before.test), (after.train, after.test), new["text"])


def test_one_record_inserted_into_a_hub_source_with_ids_moves_no_other_record(tmp_path):
    frame = _records(600).assign(id=[f"u{i:05d}" for i in range(600)])
    new = {"text": "a record only the neighbouring dataset holds", "label": "Sports", "id": "u-new"}
    before = load_dataset(load_task_spec(write_hub_task(tmp_path / "D", frame)))
    after = load_dataset(load_task_spec(write_hub_task(tmp_path / "D1", _insert(frame, 10, new))))
    _assert_one_record_moves((before.train, before.test), (after.train, after.test), new["text"])


# ---------------------------------------------------------------- the shipped StaICC files


def test_shipped_ids_are_content_ids_not_row_positions(agnews):
    ids = pd.concat([agnews.train, agnews.test, agnews.public])
    assert all(re.fullmatch(r"agnews-[0-9a-f]{16}(-\d+)?", i) for i in ids["id"])  # not agnews-<row>
    sample = agnews.train.head(200)
    # identical rows are numbered among themselves: the first of them has the plain content id
    plain = content_ids("agnews", sample["text"].tolist(), sample["label"].tolist())
    assert all(i == p or i.startswith(p + "-") for i, p in zip(sample["id"], plain, strict=True))


def test_one_record_inserted_into_a_staicc_file_renames_and_moves_no_other_record(monkeypatch):
    spec = load_task_spec("trec")
    before, _ = datasets._load_staicc(spec)
    rows = datasets._staicc_rows

    new = "a question only the neighbour holds?"

    def inserted(*args):
        texts, labels = rows(*args)
        return texts[:10] + (new,) + texts[10:], labels[:10] + ("ABBR",) + labels[10:]

    monkeypatch.setattr(datasets, "_staicc_rows", inserted)
    after, _ = datasets._load_staicc(spec)
    assert len(after) == len(before) + 1
    records = lambda frame: set(zip(frame["id"], frame["text"], frame["label"], strict=True))  # noqa: E731
    assert records(before) < records(after)  # nobody renamed
    # TREC's texts repeat: each distinct (text, label) once, so a record is named by its text
    before, after = before.drop_duplicates(["text"], keep=False), after.drop_duplicates(["text"], keep=False)
    # a fixed fraction (a shipped file's count is a fraction of its own public row count)
    _assert_one_record_moves(record_split(before, 0.1, 0, "test", "split.test_size"),
                             record_split(after, 0.1, 0, "test", "split.test_size"), new)


# ---------------------------------------------------------------- a separate test file


def test_a_test_file_without_id_column_gets_content_ids(tickets_spec, tmp_path):
    data = tmp_path / "tickets.csv"
    pd.DataFrame(ROWS).to_csv(data, index=False)
    spec = tickets_spec.model_copy(update={"source": tickets_spec.source.model_copy(update={"id_column": None})})
    rows = [{"body": f"test ticket {i} about the {w}", "topic": ("billing", "outage")[i % 2]}
            for i, w in enumerate(WORDS)]
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_dataset(spec, data, test).test
    assert list(loaded["id"]) == content_ids("tickets-test", loaded["text"].tolist(), loaded["label"].tolist())
    assert not set(loaded["id"]) & set(load_dataset(spec, data, test).train["id"])
    rows.insert(0, {"body": "one more test ticket", "topic": "billing"})
    test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = load_dataset(spec, data, test).test
    assert set(loaded["id"]) < set(again["id"]) and len(again) == len(loaded) + 1
