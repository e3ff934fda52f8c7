"""A budget belongs to the records: the same records under a new dataset id are refused.

- the sketch: exact for small sets, an unbiased-enough estimate for large ones, blind to ids and
  to text spacing/case, keyed (another home's key gives unrelated hashes);
- the ledger: the same content hash, or a re-export sharing most records, under a new id while
  another id with a budget spends on them is refused before anything is recorded; the flag
  charges it; the new id then owns the records; new records and ids without a budget pass;
- an older ledger gains the table and keeps its composed spend.
The CLI's refusal: `tests/test_ledger_pipeline.py`.
"""

from __future__ import annotations

import math
import random
import sqlite3

import pytest

from dpcore.errors import BudgetExceededError, SameRecordsError
from dpcore.privacy import record_sets
from dpcore.privacy.ledger import Ledger
from dpcore.privacy.record_sets import RecordSet, record_set, shared_share

KEY = b"k" * 32
DELTA = 1e-5


def _records(start: int, stop: int) -> list[tuple[str, str]]:
    return [(str(i % 4), f"record number {i} about something") for i in range(start, stop)]


def test_a_small_set_is_its_own_sketch_and_the_share_is_exact():
    a = record_set(_records(0, 100), KEY)
    b = record_set(_records(40, 140), KEY)
    assert a.records == 100 and len(a.sketch) == 100
    assert shared_share(a, b) == pytest.approx(60 / 100)
    assert shared_share(a, a) == 1.0
    assert shared_share(a, record_set(_records(100, 200), KEY)) == 0.0


@pytest.mark.parametrize(("size_a", "start_b", "size_b", "share"), [
    (5000, 0, 5200, 1.0),       # a refresh: every old record and 200 new ones
    (5000, 2500, 5000, 0.5),    # half the records
    (3000, 0, 30000, 1.0),      # a subset of a far larger set
    (8000, 6000, 8000, 0.25),
])
def test_large_sets_estimate_the_shared_share(size_a, start_b, size_b, share):
    a = record_set(_records(0, size_a), KEY)
    b = record_set(_records(start_b, start_b + size_b), KEY)
    assert len(a.sketch) == record_sets.SKETCH_SIZE
    # bottom-256 estimate: a few points of standard error
    assert shared_share(a, b) == pytest.approx(share, abs=0.1)
    assert shared_share(b, a) == pytest.approx(shared_share(a, b))


def test_the_sketch_ignores_ids_order_case_and_spacing_but_not_labels():
    records = _records(0, 50)
    shuffled = random.Random(0).sample(records, len(records))
    respaced = [(label, "  " + text.upper().replace(" ", "   ")) for label, text in shuffled]
    assert record_set(respaced, KEY) == record_set(records, KEY)
    relabelled = [(str(int(label) + 1), text) for label, text in records]
    assert shared_share(record_set(relabelled, KEY), record_set(records, KEY)) == 0.0


def test_the_sketch_is_keyed():
    assert not set(record_set(_records(0, 50), KEY).sketch) & set(record_set(_records(0, 50), b"o" * 32).sketch)


def test_a_sketch_round_trips_through_text():
    a = record_set(_records(0, 500), KEY)
    assert RecordSet.from_text(a.records, a.to_text()) == a


# --------------------------------------------------------------------------- the ledger


def _charge(ledger: Ledger, dataset_id: str, content_hash: str, run_id: str = "run", **kwargs):
    request = _request(dataset_id, content_hash, run_id)
    return ledger.charge([request], replay_recorded=False, **kwargs).charged


def _request(dataset_id, content_hash, run_id="run"):
    from dpcore.privacy.ledger import Spend

    return Spend.sampled_steps("gaussian", 1.0, 0.01, 10, "pipeline", dataset_id=dataset_id, content_hash=content_hash,
                               run_id=run_id, delta=DELTA)


@pytest.fixture()
def ledger(tmp_path) -> Ledger:
    book = Ledger(tmp_path / "ledger.db")
    book.remember_records("hash-old", record_set(_records(0, 2000), KEY))
    book.remember_records("hash-refresh", record_set(_records(0, 2100), KEY))  # a re-export, 100 rows added
    book.remember_records("hash-other", record_set(_records(5000, 7000), KEY))
    book.set_budget("tickets", 10.0, DELTA)
    _charge(book, "tickets", "hash-old")
    return book


def test_the_same_records_under_a_new_id_are_refused_and_nothing_is_recorded(ledger):
    for content_hash in ("hash-old", "hash-refresh"):
        with pytest.raises(SameRecordsError, match="dataset id 'tickets'.*--new-budget-for-same-records"):
            _charge(ledger, "tickets-v2", content_hash)
        with pytest.raises(SameRecordsError):
            ledger.charge([_request("tickets-v2", content_hash)], replay_recorded=False, dry_run=True)
        with pytest.raises(SameRecordsError):
            ledger.charge([_request("tickets-v2", content_hash)], dry_run=True)
    assert ledger.entries("tickets-v2") == []
    assert SameRecordsError.exit_code == 3


def test_the_refusal_names_no_count_and_no_record(ledger):
    with pytest.raises(SameRecordsError) as refused:
        _charge(ledger, "tickets-v2", "hash-refresh")
    message = str(refused.value)
    assert "record number" not in message and not any(ch.isdigit() for ch in message.replace("v2", ""))


def test_new_records_or_a_refresh_under_the_owning_id_pass(ledger):
    _charge(ledger, "other", "hash-other")
    _charge(ledger, "tickets", "hash-refresh", run_id="refresh")
    assert len(ledger.entries("tickets")) == 2


def test_the_flag_charges_and_the_new_id_then_owns_its_records(ledger):
    _charge(ledger, "tickets-v2", "hash-refresh", same_records_ok=True)
    _charge(ledger, "tickets-v2", "hash-refresh", run_id="next")  # its own records now: no flag needed
    assert len(ledger.entries("tickets-v2")) == 2
    # Both ids spend on the records; each budget composes only its own entries, as the flag said.
    assert ledger.spend("tickets").epsilon < ledger.spend("tickets-v2").epsilon


def test_an_id_without_a_budget_guards_nothing(tmp_path):
    book = Ledger(tmp_path / "ledger.db")
    book.remember_records("hash-old", record_set(_records(0, 2000), KEY))
    _charge(book, "scratch", "hash-old")
    _charge(book, "scratch-2", "hash-old")
    assert len(book.entries()) == 2


def test_the_budget_check_still_comes_with_the_records_check(ledger):
    ledger.set_budget("tickets", 0.1, DELTA)
    with pytest.raises(BudgetExceededError):
        _charge(ledger, "tickets", "hash-refresh", run_id="over")


def test_an_older_ledger_gains_the_records_table_and_keeps_its_spend(tmp_path):
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:  # the schema of a ledger written before record sets
        conn.executescript("""
            CREATE TABLE budgets (dataset_id TEXT PRIMARY KEY, epsilon REAL NOT NULL, delta REAL NOT NULL,
                                  set_at TEXT NOT NULL);
            CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset_id TEXT NOT NULL,
                content_hash TEXT NOT NULL, run_id TEXT NOT NULL, mechanism TEXT NOT NULL,
                noise_multiplier REAL NOT NULL, sampling_rate REAL NOT NULL, steps INTEGER NOT NULL,
                delta REAL NOT NULL, epsilon_upper REAL NOT NULL, purpose TEXT NOT NULL,
                status TEXT NOT NULL DEFAULT 'charged', created_at TEXT NOT NULL);
            INSERT INTO budgets VALUES ('tickets', 10.0, 1e-5, '2026-01-01T00:00:00+00:00');
            INSERT INTO entries (dataset_id, content_hash, run_id, mechanism, noise_multiplier, sampling_rate,
                steps, delta, epsilon_upper, purpose, created_at)
                VALUES ('tickets', 'hash-old', 'r1', 'gaussian', 1.0, 0.01, 10, 1e-5, 1.0, 'pipeline',
                        '2026-01-01T00:00:00+00:00');
            PRAGMA user_version = 1;
        """)
    book = Ledger(path)
    spend = book.spend("tickets").epsilon
    assert math.isfinite(spend) and spend > 0
    book.remember_records("hash-old", record_set(_records(0, 10), KEY))
    with pytest.raises(SameRecordsError):
        _charge(book, "tickets-v2", "hash-old")
    assert Ledger(path).spend("tickets").epsilon == spend
