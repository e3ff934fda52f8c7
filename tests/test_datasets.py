"""Loaders, the restricted unpickler, neighbour-stable splits and every validation error."""

from __future__ import annotations

import json
import pickle
import pickletools
from pathlib import Path

import pandas as pd
import pytest
from tickets import ROWS as GOOD_ROWS
from tickets import SPEC_YAML

from dpcore.data.datasets import (
    content_hash,
    load_dataset,
    read_table,
    record_split,
    restricted_load,
    staicc_file,
)
from dpcore.data.taskspec import load_task_spec, shipped_task_names
from dpcore.errors import ConfigError, DataValidationError
from dpcore.home import is_private_path


def write_csv(path, rows):
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- shipped tasks and StaICC


def test_shipped_specs_all_parse():
    names = shipped_task_names()
    for expected in ("agnews", "trec", "sst2", "dbpedia", "mit-g", "mit-d", "movies-sample-genre"):
        assert expected in names
    for name in names:
        spec = load_task_spec(name)
        prompt = spec.generation.build("X", ["record one"], "")
        assert prompt.startswith(spec.generation.instruction)
        assert prompt.endswith(spec.generation.text_prefix)


def test_unknown_task_names_the_choices():
    with pytest.raises(ConfigError, match="unknown task 'nope'.*agnews"):
        load_task_spec("nope")


@pytest.mark.parametrize(
    "name, train, test, labels",
    [("agnews", 119000, 7600, 4), ("trec", 4952, 500, 6), ("sst2", 65477, 872, 2)],
)
def test_staicc_loaders_and_split_sizes(name, train, test, labels):
    """A count in a shipped spec is a fraction of the shipped file's rows: the hash split's sizes are
    binomial around it (within 4 standard deviations)."""
    data = load_dataset(load_task_spec(name))
    total = len(data.train) + len(data.test) + len(data.public)
    for got, expected in ((len(data.test), test), (len(data.train), train)):
        p = expected / total
        assert abs(got - expected) <= 4 * (total * p * (1 - p)) ** 0.5 + 1, (name, got, expected)
    assert len(data.labels) == labels
    assert set(data.train.columns) == {"id", "text", "label"}
    assert set(data.train["label"]) == set(data.spec.label_names)
    assert not set(data.train["id"]) & set(data.test["id"])
    assert data.train["text"].str.len().min() > 0


def test_split_is_deterministic_and_seed_dependent(agnews):
    again = load_dataset(load_task_spec("agnews"))
    assert again.content_hash == agnews.content_hash
    assert list(again.test["id"][:50]) == list(agnews.test["id"][:50])
    frame = agnews.train.head(1000)
    a_train, a_test = record_split(frame, 0.1, 1, "test", "split.test_size")
    b_train, b_test = record_split(frame.sample(frac=1.0, random_state=5), 0.1, 1, "test",
                                   "split.test_size")  # row order irrelevant
    c_train, c_test = record_split(frame, 0.1, 2, "test", "split.test_size")
    assert list(a_test["id"]) == list(b_test["id"])
    assert list(a_test["id"]) != list(c_test["id"])
    assert 60 <= len(a_test) <= 140 and len(a_train) + len(a_test) == 1000


def test_content_hash_changes_with_any_record(agnews):
    frame = agnews.train.head(50).copy()
    base = content_hash(frame)
    frame.loc[frame.index[3], "text"] = frame["text"].iloc[3] + "!"
    assert content_hash(frame) != base


def test_a_shipped_source_is_loaded_once_per_process_and_each_caller_gets_its_own_frames(monkeypatch, tmp_path,
                                                                                         tickets_spec):
    """A shipped source is split and hashed once per process, keyed by its spec, its file and the home's content
    key: a caller changing its frames changes no later caller's, another task or another home loads afresh, and
    a user's file is read every time."""
    from dpcore.data import datasets

    loads = []
    real = datasets._load_dataset
    monkeypatch.setattr(datasets, "_load_dataset", lambda *a: loads.append(a[0].name) or real(*a))
    datasets._loaded_shipped.cache_clear()
    spec = load_task_spec("sst2")
    first = load_dataset(spec)
    first.train.loc[0, "text"] = "changed by its caller"
    second = load_dataset(spec)
    assert loads == ["sst2"] and second.train.loc[0, "text"] != "changed by its caller"
    assert second.content_hash == first.content_hash and len(second.public) == len(first.public) > 0
    assert load_dataset(load_task_spec("trec")).spec.name == "trec" and loads == ["sst2", "trec"]
    monkeypatch.setenv("DPICL_HOME", str(tmp_path / "another-home"))  # another content key
    assert load_dataset(spec).content_hash != first.content_hash and loads == ["sst2", "trec", "sst2"]
    user_file = write_csv(tmp_path / "rows.csv", GOOD_ROWS)
    for _ in range(2):
        load_dataset(tickets_spec, data_path=user_file)
    assert loads == ["sst2", "trec", "sst2", "tickets", "tickets"]


def test_a_datasets_record_set_is_hashed_once_per_content_and_key(monkeypatch, tmp_path):
    """The record set (a keyed hash of every private record) is kept by the records' content hash and the home's
    key: another load of the same records reuses it, changed records or another home's key hash afresh, and
    records without a content hash are never kept."""
    from dataclasses import replace

    from dpcore.data import datasets
    from dpcore.privacy.record_sets import record_set

    hashed = []
    monkeypatch.setattr(datasets, "record_set", lambda records, key: hashed.append(key) or record_set(records, key))
    monkeypatch.setattr(datasets, "_RECORD_SETS", {})
    spec = load_task_spec("sst2")
    first = load_dataset(spec).record_set()
    assert load_dataset(spec).record_set() == first and len(hashed) == 1
    loaded = load_dataset(spec)
    fewer = loaded.train.iloc[1:]
    changed = replace(loaded, train=fewer, content_hash=content_hash(fewer)).record_set()
    assert first.records - 1 <= changed.records <= first.records and len(hashed) == 2
    unhashed = replace(loaded, content_hash="")
    assert unhashed.record_set() == unhashed.record_set() == first and len(hashed) == 4
    monkeypatch.setenv("DPICL_HOME", str(tmp_path / "another-home"))  # another content key
    assert load_dataset(spec).record_set() != first and len(hashed) == 5


def test_movies_sample_extraction_labels(movies_genre):
    assert movies_genre.spec.kind == "extraction"
    assert movies_genre.spec.made_up
    assert set(movies_genre.labels) == {"comedy", "horror", "drama", "action", "animated", "romance"}
    assert sum(movies_genre.label_counts().values()) == len(movies_genre.train) == 41


# ---------------------------------------------------------------- restricted unpickler


def test_restricted_unpickler_accepts_plain_rows(tmp_path):
    path = tmp_path / "ok.dataset"
    path.write_bytes(pickle.dumps([(["a text"], 0), (["b", "c"], 1)]))
    assert restricted_load(path) == [(["a text"], 0), (["b", "c"], 1)]


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_restricted_unpickler_refuses_code_running_opcodes(tmp_path, protocol):
    payload = pickle.dumps([(["x"], 0), _Evil()], protocol=protocol)
    ops = {op.name for op, _, _ in pickletools.genops(payload)}
    assert ops & {"GLOBAL", "STACK_GLOBAL"} and "REDUCE" in ops
    path = tmp_path / "evil.dataset"
    path.write_bytes(payload)
    with pytest.raises(DataValidationError, match="refused global"):
        restricted_load(path)


def test_restricted_unpickler_refuses_other_types(tmp_path):
    path = tmp_path / "dict.dataset"
    path.write_bytes(pickle.dumps([{"text": "x"}]))
    with pytest.raises(DataValidationError, match="refused value of type dict"):
        restricted_load(path)
    path.write_bytes(pickle.dumps([(["x"], 1.5)]))
    with pytest.raises(DataValidationError, match="float"):
        restricted_load(path)


def test_staicc_files_located_through_metadata():
    assert staicc_file("agnews.dataset").name == "agnews.dataset"
    with pytest.raises(DataValidationError, match="not found"):
        staicc_file("missing.dataset")


# ---------------------------------------------------------------- user files: CSV, JSONL, Parquet


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_user_file_loaders(tmp_path, tickets_spec, fmt):
    path = tmp_path / f"tickets.{fmt}"
    if fmt == "csv":
        write_csv(path, GOOD_ROWS)
    elif fmt == "jsonl":
        write_jsonl(path, GOOD_ROWS)
    else:
        pd.DataFrame(GOOD_ROWS).to_parquet(path)
    data = load_dataset(tickets_spec, data_path=path)
    assert len(data.train) == 4 and len(data.test) == 2
    assert set(data.train["label"]) | set(data.test["label"]) == {"billing", "outage"}
    assert set(data.train["id"]) | set(data.test["id"]) == {r["ticket_id"] for r in GOOD_ROWS}


def _bad(tmp_path, tickets_spec, rows, fmt="csv"):
    path = tmp_path / f"bad.{fmt}"
    (write_csv if fmt == "csv" else write_jsonl)(path, rows)
    with pytest.raises(DataValidationError) as info:
        load_dataset(tickets_spec, data_path=path)
    return str(info.value), path


def test_empty_text_names_file_row_column(tmp_path, tickets_spec):
    rows = [dict(r) for r in GOOD_ROWS]
    rows[2]["body"] = "   "
    message, path = _bad(tmp_path, tickets_spec, rows)
    assert str(path) in message and "line 4" in message and "'body'" in message and "empty text" in message


def test_a_record_longer_than_any_prompt_holds_is_refused_naming_its_line_not_its_text(tmp_path, tickets_spec):
    from dpcore.data.datasets import MAX_RECORD_CHARS

    rows = [dict(r) for r in GOOD_ROWS]
    rows[1]["body"] = "secretword " * (MAX_RECORD_CHARS // 10)  # about 1.1 MB: a pasted document, not a record
    message, path = _bad(tmp_path, tickets_spec, rows)
    assert str(path) in message and "line 3" in message and "'body'" in message
    assert f"{MAX_RECORD_CHARS:,} characters" in message and "secretword" not in message and "\n" not in message
    rows[1]["body"] = "x" * MAX_RECORD_CHARS  # at the cap: a record like any other
    path.unlink()
    (tmp_path / "ok.csv").write_text("")
    write_csv(tmp_path / "ok.csv", rows)
    assert len(load_dataset(tickets_spec, data_path=tmp_path / "ok.csv").train) == 4


def test_missing_label(tmp_path, tickets_spec):
    rows = [dict(r) for r in GOOD_ROWS]
    rows[1]["topic"] = ""
    message, _ = _bad(tmp_path, tickets_spec, rows)
    assert "line 3" in message and "'topic'" in message and "missing label" in message


def test_unknown_label_and_no_private_text_in_message(tmp_path, tickets_spec):
    rows = [dict(r) for r in GOOD_ROWS]
    rows[4]["topic"] = "sales"
    message, _ = _bad(tmp_path, tickets_spec, rows, fmt="jsonl")
    assert "line 5" in message and "not a label of the task" in message and "sales" not in message
    assert all(r["body"] not in message for r in GOOD_ROWS)


def test_label_with_no_records(tmp_path, tickets_spec):
    rows = [dict(r, topic="billing") for r in GOOD_ROWS]
    message, _ = _bad(tmp_path, tickets_spec, rows)
    assert "outage" in message and "no records" in message


def test_duplicate_ids(tmp_path, tickets_spec):
    rows = [dict(r) for r in GOOD_ROWS]
    rows[5]["ticket_id"] = "t2"
    message, _ = _bad(tmp_path, tickets_spec, rows)
    assert "duplicate id" in message and "t2" not in message and "line 7" in message and "line 3" in message


def test_missing_column(tmp_path, tickets_spec):
    rows = [{k: v for k, v in r.items() if k != "topic"} for r in GOOD_ROWS]
    message, _ = _bad(tmp_path, tickets_spec, rows)
    assert "missing column 'topic'" in message and "found: ticket_id, body" in message


def test_non_utf8_csv_and_jsonl(tmp_path, tickets_spec):
    csv_path = tmp_path / "latin.csv"
    csv_path.write_bytes("ticket_id,body,topic\nt1,caf\xe9 bill,billing\n".encode("latin-1"))
    with pytest.raises(DataValidationError, match="not valid UTF-8"):
        load_dataset(tickets_spec, data_path=csv_path)
    jsonl_path = tmp_path / "latin.jsonl"
    jsonl_path.write_bytes(b'{"ticket_id": "t1", "body": "ok", "topic": "billing"}\n{"body": "caf\xe9"}\n')
    with pytest.raises(DataValidationError, match="line 2: not valid UTF-8"):
        load_dataset(tickets_spec, data_path=jsonl_path)


def test_unreadable_files(tmp_path, tickets_spec):
    with pytest.raises(DataValidationError, match="file not found"):
        load_dataset(tickets_spec, data_path=tmp_path / "nope.csv")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not a parquet file")
    with pytest.raises(DataValidationError, match="unreadable"):
        load_dataset(tickets_spec, data_path=broken)
    bad_json = tmp_path / "broken.jsonl"
    bad_json.write_text('{"ticket_id": "t1"\n')
    with pytest.raises(DataValidationError, match="line 1: not valid JSON"):
        read_table(bad_json)
    spreadsheet = tmp_path / "x.xlsx"
    spreadsheet.write_text("")
    with pytest.raises(DataValidationError, match="unsupported file type"):
        read_table(spreadsheet)


def test_bad_task_spec_names_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(SPEC_YAML.replace("kind: classification", "kind: regression"))
    with pytest.raises(ConfigError, match="bad.yaml: kind"):
        load_task_spec(path)


def test_validation_writes_nothing(tmp_path, tickets_spec, dpicl_home):
    before = sorted(p for p in dpicl_home.rglob("*") if p.is_file())
    rows = [dict(r) for r in GOOD_ROWS]
    rows[0]["body"] = ""
    _bad(tmp_path, tickets_spec, rows)
    assert sorted(p for p in dpicl_home.rglob("*") if p.is_file()) == before


# ---------------------------------------------------------------- hub loader (offline: a fake hub)


def test_hub_loader_with_class_labels(monkeypatch):
    import datasets as hf

    parts = {
        "train": hf.Dataset.from_dict(
            {"content": [f"doc {i}" for i in range(30)], "label": [i % 14 for i in range(30)]}
        ),
        "test": hf.Dataset.from_dict({"content": ["t1", "t2"], "label": [0, 1]}),
    }
    caches = []

    def fake_hub(path, name=None, split=None, cache_dir=None):
        caches.append(cache_dir)
        return parts[split]

    monkeypatch.setattr(hf, "load_dataset", fake_hub)
    spec = load_task_spec("dbpedia")
    spec = spec.model_copy(update={"split": spec.split.model_copy(update={"test_size": 0.1})})
    data = load_dataset(spec)
    assert len(data.train) + len(data.test) == 32
    assert set(data.train["label"]) <= set(spec.label_names)
    # not the shipped spec any more, so possibly a user's records: `datasets` caches them in the private store
    assert caches and all(is_private_path(Path(cache)) for cache in caches)


def test_hub_loader_bio_slots(monkeypatch):
    import datasets as hf

    features = hf.Features(
        {"tokens": hf.Sequence(hf.Value("string")),
         "tags": hf.Sequence(hf.ClassLabel(names=["O", "B-Genre", "I-Genre", "B-Director"]))}
    )
    rows = {"tokens": [["a", "science", "fiction", "film"], ["by", "nolan"], ["a", "comedy"]] * 4,
            "tags": [[0, 1, 2, 0], [0, 3], [0, 1]] * 4}
    part = hf.Dataset.from_dict(rows, features=features)
    monkeypatch.setattr(hf, "load_dataset", lambda path, name=None, split=None, cache_dir=None: part)
    spec = load_task_spec("mit-g")
    spec = spec.model_copy(update={"split": spec.split.model_copy(update={"test_size": 0.2})})
    data = load_dataset(spec)
    answers = set(data.train["label"]) | set(data.test["label"])
    assert answers == {"science fiction", "comedy"}  # the director-only rows are dropped
    assert len(data.train) + len(data.test) == 16


def test_hub_unreachable_gives_clear_error():
    with pytest.raises(DataValidationError, match="hub:fancyzhx/dbpedia_14.*--data-path"):
        load_dataset(load_task_spec("dbpedia"))


# ---------------------------------------------------------------- a newcomer's own files


def test_user_yaml_paths_resolve_against_the_yaml_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "tickets.yaml").write_text(SPEC_YAML.replace("unused.csv", "tickets.csv"))
    write_csv(folder / "tickets.csv", GOOD_ROWS)
    monkeypatch.chdir(tmp_path)  # the working directory is NOT the YAML's folder
    spec = load_task_spec("project/tickets.yaml")
    loaded = load_dataset(spec)
    assert len(loaded.train) + len(loaded.test) == len(GOOD_ROWS)
    (folder / "tickets.csv").unlink()
    with pytest.raises(DataValidationError) as err:
        load_dataset(load_task_spec("project/tickets.yaml"))
    message = str(err.value)
    assert str(folder / "tickets.csv") in message and "YAML's own folder" in message


def test_shipped_specs_still_resolve_against_data():
    loaded = load_dataset(load_task_spec("movies-sample-genre"))
    assert len(loaded.train) == 41


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nlabels: {a: A, b: B\nkind: classification\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: not valid YAML"):
        load_task_spec(path)


def test_non_utf8_csv_names_the_line_and_the_file_offset(tmp_path, tickets_spec):
    header = "ticket_id,body,topic\n"
    good = "".join(f"t{i},fine text number {i},billing\n" for i in range(2000))
    raw = (header + good).encode() + "t9999,caf\xe9,billing\n".encode("latin-1")
    path = tmp_path / "late.csv"
    path.write_bytes(raw)
    with pytest.raises(DataValidationError) as err:
        load_dataset(tickets_spec, data_path=path)
    offset = raw.index(b"\xe9")
    assert f"line {2002}: not valid UTF-8 (byte offset {offset} of the file)" in str(err.value)


def test_header_only_csv_is_named_and_called_empty(tmp_path, tickets_spec):
    path = tmp_path / "empty.csv"
    path.write_text("ticket_id,body,topic\n")
    with pytest.raises(DataValidationError, match=r"empty.csv: the file has no records"):
        load_dataset(tickets_spec, data_path=path)
    blank = tmp_path / "blank.csv"
    blank.write_text("")
    with pytest.raises(DataValidationError, match=r"blank.csv: the file is empty"):
        load_dataset(tickets_spec, data_path=blank)
