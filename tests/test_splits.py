"""Neighbour-stable partitions: D plus one record splits into exactly D's parts plus that record.

And the public side of the data: a user's file never yields public rows, and nothing compares a public
text with the private records (such a check would answer "is this text private?" for free).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from dpcore.data.datasets import load_dataset, record_split
from dpcore.data.splits import hash_split, hash_unit, split_key
from dpcore.data.taskspec import TASKS_DIR, load_task_spec
from dpcore.errors import ConfigError


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    labels = ["World", "Sports", "Business", "Technology"]
    return pd.DataFrame({"id": [f"r{i}" for i in range(n)], "text": [f"text number {i}" for i in range(n)],
                         "label": [labels[i] for i in rng.integers(0, 4, size=n)]})


def _parts(train: pd.DataFrame, test: pd.DataFrame) -> tuple[set, set]:
    return set(train["id"]), set(test["id"])


def test_hash_unit_is_uniform_and_depends_on_the_id_and_key_only():
    key = split_key(0, "test")
    values = np.array([hash_unit(f"id-{i}", key) for i in range(20000)])
    assert 0.0 <= values.min() and values.max() < 1.0
    assert abs(values.mean() - 0.5) < 0.01 and abs((values < 0.1).mean() - 0.1) < 0.01
    assert hash_unit("id-7", key) == values[7]
    assert hash_unit("id-7", split_key(1, "test")) != values[7]
    assert hash_unit("id-7", split_key(0, "public")) != values[7]


@pytest.mark.parametrize("n", [50, 3000])
def test_adding_one_record_moves_no_other_record(n):
    """The review's measurement: a permutation of the row count moved 487 of 3,000 records when one was
    appended. A keyed hash of the id moves none, wherever the new record sorts."""
    frame = _frame(n)
    train, test = record_split(frame, 0.2, 0, "test", "split.test_size")
    for new_id in ("r-new", "a-first", "zzz-last"):
        extra = pd.DataFrame({"id": [new_id], "text": ["one more record"], "label": ["World"]})
        train2, test2 = record_split(pd.concat([frame, extra], ignore_index=True), 0.2, 0, "test",
                                     "split.test_size")
        tr, te = _parts(train, test)
        tr2, te2 = _parts(train2, test2)
        assert (tr2 - tr) | (te2 - te) == {new_id}
        assert tr <= tr2 and te <= te2


def test_removing_or_changing_one_record_moves_no_other_record():
    frame = _frame(500)
    train, test = record_split(frame, 0.2, 0, "test", "split.test_size")
    dropped = frame.drop(index=17)
    train2, test2 = record_split(dropped, 0.2, 0, "test", "split.test_size")
    assert set(train2["id"]) | set(test2["id"]) == set(frame["id"]) - {"r17"}
    assert set(train2["id"]) == set(train["id"]) - {"r17"} and set(test2["id"]) == set(test["id"]) - {"r17"}
    changed = frame.copy()
    changed.loc[17, "text"] = "a different text"
    train3, test3 = record_split(changed, 0.2, 0, "test", "split.test_size")
    assert _parts(train3, test3) == _parts(train, test)


def test_a_users_file_without_ids_gets_ids_that_do_not_shift(tmp_path):
    """Rows without an id column are named by their content, so inserting a row renames no other row
    (ids by position would shift every later record and move it to another part)."""
    spec_path = _user_spec(tmp_path, id_column=None)
    frame = _frame(300)[["text", "label"]]
    frame.to_csv(tmp_path / "a.csv", index=False)
    bigger = pd.concat([frame.iloc[:10], pd.DataFrame({"text": ["inserted"], "label": ["World"]}), frame.iloc[10:]])
    bigger.to_csv(tmp_path / "b.csv", index=False)
    a = load_dataset(load_task_spec(str(spec_path)), tmp_path / "a.csv")
    b = load_dataset(load_task_spec(str(spec_path)), tmp_path / "b.csv")
    added = (set(b.train["id"]) | set(b.test["id"])) - (set(a.train["id"]) | set(a.test["id"]))
    assert len(added) == 1
    assert set(a.train["id"]) <= set(b.train["id"]) and set(a.test["id"]) <= set(b.test["id"])


def _user_spec(tmp_path, id_column: str | None = "id", **split) -> str:
    spec = yaml.safe_load((TASKS_DIR / "agnews.yaml").read_text())
    spec.update(name="mine", source={"type": "file", "path": "unused.csv", "text_column": "text",
                                     "label_column": "label", **({"id_column": id_column} if id_column else {})},
                split={"test_size": 0.2, "seed": 0, **split})
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_a_count_for_a_users_file_is_refused_with_the_reason(tmp_path):
    _frame(100).to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(ConfigError, match="split.test_size=20: give a fraction"):
        load_dataset(load_task_spec(_user_spec(tmp_path, test_size=20)), tmp_path / "d.csv")


def test_a_users_file_under_a_shipped_spec_has_no_public_split(tmp_path):
    """The review's reproduction: `--dataset sst2 --data-path private.csv` made 1,000 of the user's rows the
    'public' split, and PromptPATE's IID queries. Now a shipped spec's public split applies to its own
    shipped source only, and PromptPATE's IID source is refused for a user's file."""
    from dpcore.pate import public_queries

    rows = pd.DataFrame({"id": [f"u{i}" for i in range(3000)], "text": [f"private sentence {i}" for i in range(3000)],
                         "label": ["Positive" if i % 2 else "Negative" for i in range(3000)]})
    rows.to_csv(tmp_path / "private.csv", index=False)
    data = load_dataset(load_task_spec("sst2"), tmp_path / "private.csv")
    assert data.public.empty and not data.shipped
    assert len(data.train) + len(data.test) == 3000
    assert 0.15 < len(data.test) / 3000 < 0.25  # the default fraction for a user's file
    with pytest.raises(ConfigError, match="never carved out of your own records file.*--pate-public-path"):
        public_queries.public_texts(data, "iid")


def test_the_shipped_source_keeps_its_public_split():
    data = load_dataset(load_task_spec("trec"))
    assert data.shipped and 350 < len(data.public) < 650
    assert not set(data.public["id"]) & (set(data.train["id"]) | set(data.test["id"]))


def test_a_public_file_is_never_compared_with_the_private_records(tmp_path, agnews):
    """The review's oracle: a public file holding one private text was refused with an overlap count, so
    anyone who can start a run could ask 'is this text private?' for free. Now the declared public file
    is read as it is, whatever it holds: the answer is the same for a member and a non-member."""
    from dpcore.config import RunConfig
    from tasks.pate import check_inputs

    member = agnews.train["text"].iloc[0]
    outsider = "a sentence that is in no dataset at all"
    answers = []
    for text in (member, outsider):
        path = tmp_path / f"public-{len(answers)}.csv"
        pd.DataFrame({"text": [text] + [f"public text {i}" for i in range(30)]}).to_csv(path, index=False)
        config = RunConfig(dataset="agnews", pate_public_path=str(path), pate_queries=31, pate_teachers=4)
        queries, where, _ = check_inputs(config, agnews, 1e-5)
        answers.append(len(queries))
    assert answers == [31, 31]


def test_ood_texts_of_a_users_yaml_are_not_filtered_against_its_records(tmp_path):
    """A user YAML naming `pate.ood_public` used to be treated as shipped, its OOD texts silently filtered
    against the user's private texts (visible in the public queries). Only the shipped source itself is
    compared with its OOD file (a function of two public files)."""
    from dpcore.data.datasets import restricted_load, staicc_file
    from dpcore.pate import public_queries

    ood = [" ".join(p) if isinstance(p, list | tuple) else str(p)
           for p, _ in restricted_load(staicc_file(load_task_spec("sst2").pate.ood_public))]
    spec = yaml.safe_load((TASKS_DIR / "sst2.yaml").read_text())
    spec.update(name="my-reviews", source={"type": "file", "path": str(tmp_path / "r.csv"), "text_column": "text",
                                           "label_column": "label", "id_column": "id"},
                split={"test_size": 0.2, "seed": 0})
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(spec))
    private = pd.DataFrame({"id": [f"p{i}" for i in range(40)], "text": ood[:40],
                            "label": ["Positive", "Negative"] * 20})
    private.to_csv(tmp_path / "r.csv", index=False)
    data = load_dataset(load_task_spec(str(tmp_path / "my.yaml")))
    assert not data.shipped
    texts, _ = public_queries.public_texts(data, "ood")
    kept = {t.lower() for t in texts}
    assert all(t.strip().lower() in kept for t in ood[:40])  # nothing dropped because it is private


def test_hash_split_refuses_a_fraction_outside_the_unit_interval():
    with pytest.raises(ConfigError, match="split.test_size: a fraction in"):
        hash_split(["a"], 1.5, split_key(0, "test"), "split.test_size")
