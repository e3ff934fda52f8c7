"""The ledger stores events: an older ledger converts in place, and a new event shape needs no schema change.

- a schema-2 ledger as dpicl wrote it before (tests/data/ledger_schema2.sql, dumped from a ledger that
  `dpcore.privacy.ledger` at schema 2 wrote) opens as schema 3 with the same composed spend, the same
  `dpicl ledger show` rows and `--json` entries, and its id sequence going on;
- a row that cannot become an event leaves the old file as it was, and the message names the row
  and column, not the value;
- a composed PromptPATE-like round with a Laplace release is stored as it is and composes back
  within 2% of dp-accounting's own PLD accountant.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from pathlib import Path

import pytest
from dp_accounting.dp_event import ComposedDpEvent, LaplaceDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent

from dpcore.errors import ConfigError
from dpcore.privacy import composition
from dpcore.privacy.events import tang_event
from dpcore.privacy.ledger import SCHEMA_VERSION, Ledger, Spend
from flows.cli.common import jsonable

DATA = Path(__file__).parent / "data"


def _old_ledger(path: Path, *edits: str) -> Path:
    with sqlite3.connect(path) as conn:
        conn.executescript((DATA / "ledger_schema2.sql").read_text())
        for edit in edits:
            conn.execute(edit)
    return path


def _to_nine_digits(value):
    """A --json value with every float to 9 significant digits: the accountants' last digits vary by CPU."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {key: _to_nine_digits(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_nine_digits(item) for item in value]
    return value


def _columns(path: Path, table: str) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def test_a_schema_2_ledger_opens_as_events_with_the_same_spend_and_rows(tmp_path, cli):
    path = _old_ledger(tmp_path / "ledger.db")
    before = json.loads((DATA / "ledger_schema2_show.json").read_text())["datasets"]
    book = Ledger(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert "event" in _columns(path, "entries") and not {"mechanism", "steps"} & _columns(path, "entries")
    for old in before:
        spend = book.spend(old["dataset_id"], delta=old["delta"])
        if old["epsilon"] == "inf":
            assert math.isinf(spend.epsilon)
        else:
            assert spend.epsilon == pytest.approx(old["epsilon"], abs=1e-9, rel=0)
        rows = [{k: v for k, v in entry.to_dict().items() if k != "event"} for entry in spend.entries]
        assert jsonable(rows) == old["entries"]
    # the people's view and the --json contract are unchanged
    code, out, _ = cli(["ledger", "show", "--ledger", str(path)])
    assert code == 0 and out == (DATA / "ledger_schema2_show.txt").read_text()
    code, out, _ = cli(["ledger", "show", "--ledger", str(path), "--json"])
    shown = json.loads(out)["datasets"]
    # the old ledger's budget begins its history (a key the old contract did not have)
    assert [[(c["change"], c["epsilon"], c["previous_epsilon"]) for c in new.pop("budget_history")]
            for new in shown] == [[] if old["budget"] is None else [("first", old["budget"]["epsilon"], None)]
                                  for old in before]
    for new, old in zip(shown, before, strict=True):
        assert all(entry.pop("event")["class_name"] == "SelfComposedDpEvent" for entry in new["entries"])
        assert _to_nine_digits(new) == _to_nine_digits(old)
    # ids go on after the old rows; the records table came along
    assert book.charge([Spend.sampled_steps("gaussian", 2.0, 0.01, 10, "generate", dataset_id="tickets",
                                            content_hash="3f" * 32, run_id="run-h", delta=1e-5)],
                       replay_recorded=False).charged[0].id == 10
    assert Ledger(path).spend("tickets").epsilon > before[1]["epsilon"]


def test_a_non_private_row_keeps_what_ran(tmp_path):
    book = Ledger(_old_ledger(tmp_path / "ledger.db"))
    entry = next(e for e in book.entries("notes") if e.run_id == "run-f")
    assert (entry.mechanism, entry.noise_multiplier, entry.sampling_rate, entry.steps) == ("rnm", 0.0, 0.05, 10)
    assert entry.non_private and math.isinf(entry.epsilon_upper)


@pytest.mark.parametrize("edit, column", [
    ("UPDATE entries SET mechanism = 'laplace-v0' WHERE id = 4", "mechanism"),
    ("UPDATE entries SET noise_multiplier = 'a lot' WHERE id = 4", "noise_multiplier"),
])
def test_a_row_that_cannot_convert_leaves_the_old_ledger_intact(tmp_path, edit, column):
    path = _old_ledger(tmp_path / "ledger.db", edit)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(ConfigError) as caught:
        Ledger(path)
    message = str(caught.value)
    assert f"row id 4, column {column}" in message and "unchanged" in message
    assert "laplace-v0" not in message and "a lot" not in message
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_a_ledger_from_a_newer_dpicl_is_refused(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger(path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="newer dpicl"):
        Ledger(path)


def test_a_new_event_shape_is_stored_and_composed_without_a_schema_change(tmp_path):
    from dp_accounting.pld import pld_privacy_accountant

    delta = 1e-5
    # A PromptPATE round: threshold and votes (Gaussian, q = 1), and a Laplace release of a count, Poisson-sampled.
    round_ = ComposedDpEvent([tang_event("gaussian", 40.0, 1.0, 50), tang_event("gaussian", 28.0, 1.0, 50),
                              SelfComposedDpEvent(PoissonSampledDpEvent(0.05, LaplaceDpEvent(2.0)), 20)])
    book = Ledger(tmp_path / "ledger.db")
    request = Spend(round_, "pate", dataset_id="ds", content_hash="h", run_id="pate-1", delta=delta)
    entry = book.charge([request], replay_recorded=False).charged[0]
    stored = book.entries("ds")
    assert stored == [entry] and stored[0].event == round_ and stored[0].mechanism == "composed"
    spend = book.spend("ds")
    assert spend.epsilon == composition.compose([round_], delta).epsilon
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    reference.compose(round_)
    expected = reference.get_epsilon(delta)
    assert abs(spend.epsilon - expected) <= 0.02 * expected
    # the retry of the same round replays it; another round is a new spend
    same = Spend(round_, "pate", dataset_id="ds", content_hash="h", run_id="pate-1", delta=delta)
    assert book.charge([same]).charged == ()
    other = Spend(ComposedDpEvent([LaplaceDpEvent(3.0)]), "pate", dataset_id="ds", content_hash="h", run_id="pate-1",
                  delta=delta)
    assert len(book.charge([other]).charged) == 1
