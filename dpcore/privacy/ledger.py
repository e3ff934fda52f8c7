"""The privacy budget ledger: every spend of a dataset's privacy, composed.

One SQLite file (`$DPICL_HOME/ledger.db` unless a path is given) with four tables:

    budgets(dataset_id, epsilon, delta, set_at)       one budget per dataset id
    budget_changes(id, dataset_id, epsilon, delta,    every budget set, raised or lowered, in order
            previous_epsilon, previous_delta, change,
            entries, set_at)
    entries(id, dataset_id, content_hash, run_id, event, delta, epsilon_upper,
            purpose, status, created_at)              one spend each (`dpcore.privacy.spend.Spend`)
    record_sets(content_hash, records, sketch)        what each content hash's records are

An entry's `event` is its privacy event as JSON (`dpcore.privacy.events.event_to_json`: dp-accounting's
event classes and ours), so any event the accountants compose is stored as it is, without a schema
change: a generation's Poisson-sampled steps, a composed PromptPATE round, a Laplace release. The
mechanism, sigma, q and T that `dpicl ledger show` prints are read back from the event
(`Spend.mechanism` ...; None for an event of another shape). Schema 4; a ledger of schema 1 or 2
(flat mechanism, noise_multiplier, sampling_rate, steps columns) is converted when opened, in one
transaction: each row becomes the event those columns describe (`sampled_steps_event`), ids,
times and statuses kept; a row that cannot be converted leaves the file as it was. A ledger of
schema 3 and earlier gains `budget_changes`, its budgets as their first rows.

Identity. `dataset_id` is a stable name the user chooses (default: the dataset name,
`RunConfig.ledger_id`). It names a population of people, not a file: a data refresh that
keeps the same people keeps the same id, so composition continues across refreshes. The
content hash of the private records is recorded per entry, and each hash's record set as a
keyed sketch (`dpcore.privacy.record_sets`, written by `remember_records` when data is loaded). A
budget belongs to the records: a charge under a new id on records that another id with a budget
already spends on (the same content hash, or sketches sharing at least half of the smaller set) is refused
(`SameRecordsError`) unless the caller says a separate budget is meant (`same_records_ok`).
The check compares two record sets that both sit in this home's private store, so its answer
tells the caller nothing they could not read there; it is said only to the caller.

Entries. One entry per generation that touched private data (Tang et al. Algorithm 1,
run for T = `steps` token steps with noise multiplier sigma at Poisson sampling rate
q = MN/|D_y|). A run over several labels is ONE entry with the largest q over its labels:
each record belongs to exactly one label, so the labels compose in parallel and the run's
privacy loss is the worst label's (Theorem 4.2 applied per label). A run that generates
for several epsilons, or an audit that generates several demo sets, charges one entry per
generation. Instruction-only generation reads no private record and is never charged.
Non-private baselines a user opted into (sigma = 0 demos; real records as demos) are
entries with purpose "baseline" and sigma = 0: infinite spends.

Total spend. Each entry is a privacy event (`Spend.event`; a generation's is
`dpcore.privacy.events.sampled_steps_event`: T Poisson-sampled steps of the Gaussian or report-noisy-max
mechanism at sigma, q; sigma = 0 is non-private, an infinite spend), and all entries of a
dataset id are composed by `dpcore.privacy.composition.compose` (Theorem A.3; Gopi et al. 2021), never
by adding epsilons: prv-accountant's heterogeneous upper bound cross-checked by dp-accounting's
pessimistic PLD, the larger reported, with that module's one tolerance and its speed guards
(each only makes the bound larger and adds a note). This module is the store and the budget
rule; it holds no numerics. The spend is evaluated at the budget's delta (or a delta the
caller gives; with neither, the smallest entry delta).

Charging. A spend reaches the ledger one way: `Ledger.charge(requests, *, replay_recorded=True,
dry_run=False, same_records_ok=False)`, a batch of `Spend`s of one dataset id charged all-or-nothing,
which returns a `ChargeOutcome` (the entries it inserted, the entries that already held the rest, the
requests it charged or, in a dry run, would charge). Its flags:

    replay_recorded   True: a request the ledger already holds for the same run id is a replay (a retry
                      of that run, serving its recorded noise draws) and is charged nothing again; only
                      the others are charged. False: every request is charged anew, held or not (a
                      command that draws fresh noise each time, a demo set of an audit, a manual record).
    dry_run           check the budget and the records exactly as the charge would (the same refusals),
                      record nothing (the refusal before any model loads).
    same_records_ok   charge even when another dataset id with a budget already spends on these records
                      (`--new-budget-for-same-records`; otherwise `SameRecordsError`).

What a run has spent. Entries are matched on what was spent, never on the run id alone:
`unrecorded(requests, entries)` keeps the requested spends that no entry of the same
(dataset id, run id, content hash, event, delta, purpose) already holds (events compared field
by field; a multiset match: two identical spends need two entries). With `replay_recorded` the
charge takes exactly those, in one transaction: a retry that replays the recorded noise draws
is free, anything new under the same run id (another epsilon, another delta, other data)
is charged and checked against the budget like any other spend. The release gate asks
for an entry that matches the released demos' calibration row (`matching_entries`).

Budget. `charge` runs in one `BEGIN IMMEDIATE` transaction: it composes the dataset's
entries together with the new charge and either refuses (`BudgetExceededError`, CLI exit
3, nothing recorded) or inserts the entry and commits, before the caller touches any
private record. So a crash after the charge keeps it, and two concurrent runs serialise on
the write lock: the second one sees the first one's entry and cannot squeeze under the
budget too. The composition (seconds) is computed before the lock and only recomputed
inside it when the dataset's entries or budget changed meanwhile. A dataset with no
budget records every charge and refuses none (including sigma = 0, which shows as an
infinite spend); once a budget is set, a charge that makes the spend exceed it (any
sigma = 0 charge, in particular) is refused.

Budget changes. A budget is a finite epsilon in (0, MAX_EPSILON] (`dpcore.privacy.composition`: the
largest epsilon a run is planned for) at a delta in (0, 1). Lowering a budget, or setting one where
nothing was spent, is ordinary; raising one (a larger epsilon or a larger delta) that entries already
spend on is refused (`ConfigError`) unless the caller says so (`allow_raise`). Every change, whichever
kind, is one row of `budget_changes` with the budget before and after, in the same transaction as the
budget itself (`Ledger.budget_history`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dpcore.display import fmt_delta, fmt_eps
from dpcore.errors import BudgetExceededError, ConfigError, SameRecordsError
from dpcore.names import PURPOSES
from dpcore.privacy import composition, record_sets
from dpcore.privacy.composition import Composition, rnm_step_epsilon
from dpcore.privacy.spend import Spend

STATUS_CHARGED = "charged"

LEDGER_FILENAME = "ledger.db"
# 2: record_sets (an older ledger gains the table when opened); 3: entries hold events (converted when opened);
# 4: budget_changes (an older ledger gains the table, its budgets as first rows)
SCHEMA_VERSION = 4
# A writer may hold the lock while it composes (seconds, rarely tens of seconds): wait for it.
LOCK_TIMEOUT_S = 600.0

_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$")

_ENTRIES = """
CREATE TABLE IF NOT EXISTS {table} (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset_id    TEXT    NOT NULL,
    content_hash  TEXT    NOT NULL,
    run_id        TEXT    NOT NULL,
    event         TEXT    NOT NULL,
    delta         REAL    NOT NULL,
    epsilon_upper REAL    NOT NULL,
    purpose       TEXT    NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'charged',
    created_at    TEXT    NOT NULL
)"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    dataset_id TEXT PRIMARY KEY,
    epsilon    REAL NOT NULL,
    delta      REAL NOT NULL,
    set_at     TEXT NOT NULL
);
""" + _ENTRIES.format(table="entries") + """;
CREATE INDEX IF NOT EXISTS entries_by_dataset ON entries (dataset_id);
CREATE INDEX IF NOT EXISTS entries_by_run ON entries (run_id);
CREATE TABLE IF NOT EXISTS record_sets (
    content_hash TEXT PRIMARY KEY,
    records      INTEGER NOT NULL,
    sketch       TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS budget_changes (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset_id       TEXT    NOT NULL,
    epsilon          REAL    NOT NULL,
    delta            REAL    NOT NULL,
    previous_epsilon REAL,
    previous_delta   REAL,
    change           TEXT    NOT NULL,
    entries          INTEGER NOT NULL,
    set_at           TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS budget_changes_by_dataset ON budget_changes (dataset_id);
"""

_ENTRY_COLUMNS = ("id", "dataset_id", "content_hash", "run_id", "event", "delta", "epsilon_upper", "purpose",
                  "status", "created_at")
# The flat columns of schemas 1 and 2, which describe a generation's event (`sampled_steps_event`).
_FLAT_COLUMNS = ("mechanism", "noise_multiplier", "sampling_rate", "steps")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Budget:
    dataset_id: str
    epsilon: float
    delta: float
    set_at: str

    def to_dict(self) -> dict:
        return asdict(self)


# What a budget change did (`BudgetChange.change`): the first budget of a dataset id, a larger epsilon or
# delta (looser), a smaller one in both (tighter), or the same budget again.
BUDGET_CHANGES = ("first", "raised", "lowered", "unchanged")


@dataclass(frozen=True)
class BudgetChange:
    """One row of a dataset's budget history: the budget after (`epsilon` at `delta`), the one before (None:
    there was none), what kind of change it was (`BUDGET_CHANGES`) and how many entries the dataset had then."""

    dataset_id: str
    epsilon: float
    delta: float
    previous_epsilon: float | None
    previous_delta: float | None
    change: str
    entries: int
    set_at: str

    @property
    def budget(self) -> Budget:
        return Budget(self.dataset_id, self.epsilon, self.delta, self.set_at)

    @property
    def raised_spent_budget(self) -> bool:
        """A raise of a budget that entries already spent on (what `allow_raise` must say)."""
        return self.change == "raised" and self.entries > 0

    def describe(self) -> str:
        """The change for a person: `raised from epsilon 8 at delta 1e-06 to epsilon 10 at delta 1e-06`."""
        after = f"epsilon {fmt_eps(self.epsilon)} at delta {fmt_delta(self.delta)}"
        if self.previous_epsilon is None:
            return f"set to {after}"
        before = f"epsilon {fmt_eps(self.previous_epsilon)} at delta {fmt_delta(self.previous_delta)}"
        if self.change == "unchanged":
            return f"kept at {after}"
        return f"{self.change} from {before} to {after}"

    def to_dict(self) -> dict:
        return asdict(self)


def budget_change(dataset_id: str, epsilon: float, delta: float, previous: Budget | None, entries: int,
                  set_at: str) -> BudgetChange:
    """The change from `previous` to (epsilon, delta): looser in either number is a raise."""
    if previous is None:
        change = "first"
    elif epsilon > previous.epsilon or delta > previous.delta:
        change = "raised"
    elif (epsilon, delta) == (previous.epsilon, previous.delta):
        change = "unchanged"
    else:
        change = "lowered"
    return BudgetChange(dataset_id, epsilon, delta, None if previous is None else previous.epsilon,
                        None if previous is None else previous.delta, change, int(entries), set_at)


@dataclass(frozen=True)
class DatasetSpend:
    """A dataset's total composed spend (`epsilon` at `delta`) and the entries it composes."""

    epsilon: float
    delta: float
    entries: tuple[Spend, ...]
    budget: Budget | None
    dataset_id: str = ""
    epsilon_prv: float | None = None
    epsilon_pld: float | None = None
    crosscheck_agreed: bool = True
    warnings: tuple[str, ...] = ()
    budget_history: tuple[BudgetChange, ...] = ()  # every change of the budget, oldest first

    @property
    def remaining(self) -> float | None:
        """Budget epsilon left (at the budget's delta); None without a budget."""
        if self.budget is None:
            return None
        return max(0.0, self.budget.epsilon - self.epsilon)

    def to_dict(self) -> dict:
        return {
            "dataset_id": self.dataset_id,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "budget": self.budget.to_dict() if self.budget else None,
            "remaining": self.remaining,
            "epsilon_prv": self.epsilon_prv,
            "epsilon_pld": self.epsilon_pld,
            "crosscheck_agreed": self.crosscheck_agreed,
            "warnings": list(self.warnings),
            "budget_history": [change.to_dict() for change in self.budget_history],
            "entries": [entry.to_dict() for entry in self.entries],
        }


# --------------------------------------------------------------------------- composition


def compose_epsilon(spends: Iterable[Spend], delta: float) -> Composition:
    """Composed epsilon at `delta` of spends (entries or requests): `dpcore.privacy.composition.compose` of their
    events."""
    if not 0 < delta < 1:
        raise ConfigError(f"delta: must be in (0, 1), got {delta}")
    return composition.compose([spend.event for spend in spends], float(delta))


# --------------------------------------------------------------------------- validation


def _check_dataset_id(dataset_id) -> str:
    if not isinstance(dataset_id, str) or not _DATASET_ID.match(dataset_id):
        raise ConfigError(f"dataset id {dataset_id!r} is not valid (1-200 characters: letters, "
                          "digits and _.:/@+-, starting with a letter or digit)")
    return dataset_id


def _check_budget(epsilon, delta) -> tuple[float, float]:
    try:
        epsilon, delta = float(epsilon), float(delta)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"budget: epsilon and delta must be numbers, got {epsilon!r}, {delta!r}") from exc
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon: a budget must be a finite epsilon > 0, got {fmt_eps(epsilon)}")
    if epsilon > composition.MAX_EPSILON:
        raise ConfigError(f"epsilon: a budget is at most {composition.MAX_EPSILON:g}, the largest epsilon a run is "
                          f"planned for (larger is a vacuous guarantee), got {epsilon:.4g}")
    if not 0 < delta < 1:
        raise ConfigError(f"delta: a budget's delta must be in (0, 1), got {delta}")
    return epsilon, delta


def _check_request(request: Spend) -> Spend:
    """A spend fit to charge: bound to a dataset id, records and a run at a delta in (0, 1), for one of
    PURPOSES, its event one the accountants compose (ConfigError naming the field otherwise)."""
    if not isinstance(request, Spend):
        raise ConfigError(f"a charge is a dpcore.privacy.spend.Spend, got {type(request).__name__}")
    _check_dataset_id(request.dataset_id)
    for name in ("content_hash", "run_id"):
        value = getattr(request, name)
        if not isinstance(value, str) or not value.strip() or len(value) > 200:
            raise ConfigError(f"{name}: must be a non-empty string of at most 200 characters, got {value!r}")
    if request.purpose not in PURPOSES:
        raise ConfigError(f"purpose: must be one of {', '.join(PURPOSES)}, got {request.purpose!r}")
    try:
        delta = float(request.delta)
    except (TypeError, ValueError):
        raise ConfigError(f"delta: must be a number in (0, 1), got {request.delta!r}") from None
    if not 0 < delta < 1:
        raise ConfigError(f"delta: must be in (0, 1), got {request.delta}")
    # ConfigError for an event the accountants cannot compose
    composition.step_groups([request.event])
    return dataclasses.replace(request, delta=delta)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else fmt_eps(value)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- what is already recorded

# Floats round-trip exactly through the stored JSON and SQLite REAL; the tolerance only absorbs a
# recomputation of the same calibration (float noise), never a different sigma, q or delta.
_MATCH_REL_TOL = 1e-9


def _close(a: float, b: float) -> bool:
    a, b = float(a), float(b)
    return a == b or math.isclose(a, b, rel_tol=_MATCH_REL_TOL, abs_tol=0.0)


def _same_value(a, b) -> bool:
    """Two events' stored forms (`dpcore.privacy.events.event_to_dict`) field by field: classes, counts and
    names exactly, real parameters to the matching tolerance."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool)
                and not isinstance(b, bool) and _close(a, b))
    return type(a) is type(b) and a == b


def same_event(a, b) -> bool:
    """Whether two events are the same spend (`_same_value` on their stored forms)."""
    from dpcore.privacy.events import event_to_dict

    return _same_value(event_to_dict(a), event_to_dict(b))


def same_spend(request: Spend, entry: Spend) -> bool:
    """Whether `entry` records exactly the spend `request` describes (same data, run, purpose, delta and
    event)."""
    return (request.dataset_id == entry.dataset_id and request.run_id == entry.run_id
            and request.content_hash == entry.content_hash and request.purpose == entry.purpose
            and _close(request.delta, entry.delta) and same_event(request.event, entry.event))


def unrecorded(requests: Sequence[Spend], entries: Iterable[Spend]) -> list[Spend]:
    """The requested spends that `entries` do not already hold, in request order.

    A multiset match: each entry accounts for at most one request, so asking twice for the
    same spend under one run id (two independent draws) needs two entries. Matching is on the
    spend itself (`same_spend`: its event, delta and purpose, on the same data), never on the run
    id alone: the same run id with another epsilon, delta, mechanism or dataset content is a new spend.
    """
    return _split_recorded(requests, entries)[0]


def _split_recorded(requests: Sequence[Spend], entries: Iterable[Spend]) -> tuple[list[Spend], list[Spend]]:
    """(requests no entry holds, the entries that hold the others)."""
    pool = list(entries)
    new, recorded = [], []
    for request in requests:
        index = next((i for i, entry in enumerate(pool) if same_spend(request, entry)), None)
        if index is None:
            new.append(request)
        else:
            recorded.append(pool.pop(index))
    return new, recorded


def matching_entries(entries: Iterable[Spend], *, run_id: str, mechanism: str, noise_multiplier: float,
                     sampling_rate: float, steps: int, delta: float,
                     purposes: Sequence[str] = ("pipeline", "generate")) -> list[Spend]:
    """Entries of `run_id` that record a spend with these calibration parameters (the release gate: the
    released demos' (mechanism, sigma, q, T, delta) must be charged to that run): their events are the
    event those parameters describe (`dpcore.privacy.events.sampled_steps_event`)."""
    from dpcore.privacy.events import sampled_steps_event

    return entries_holding(entries, run_id=run_id, event=sampled_steps_event(mechanism, noise_multiplier,
                                                                             sampling_rate, steps),
                           delta=delta, purposes=purposes)


def entries_holding(entries: Iterable[Spend], *, run_id: str, event, delta: float,
                    purposes: Sequence[str] = ("pipeline", "generate")) -> list[Spend]:
    """Entries of `run_id`, of one of `purposes`, that record `event` at `delta` (any event shape: a Renyi
    guarantee has no calibration parameters to match)."""
    return [e for e in entries
            if e.run_id == run_id and e.purpose in purposes and _close(e.delta, delta) and same_event(e.event, event)]


@dataclass(frozen=True)
class ChargeOutcome:
    """What `Ledger.charge` did: the entries it inserted (none in a dry run), the entries that already
    held the rest of the requested spends (a replay; none without `replay_recorded`), and the requests
    it charged (in a dry run: would charge)."""

    charged: tuple[Spend, ...]
    recorded: tuple[Spend, ...]
    new_requests: tuple[Spend, ...]
    dry_run: bool = False


# --------------------------------------------------------------------------- the ledger


class Ledger:
    """The privacy budget ledger in one SQLite file (default `$DPICL_HOME/ledger.db`).

    Safe across processes: every write is one transaction; `charge` serialises on the
    database write lock. A `Ledger` holds only its path (no open connection), so it can be
    passed to subprocesses.
    """

    def __init__(self, path: str | Path | None = None):
        if path is None:
            from dpcore.home import dpicl_home

            path = dpicl_home() / LEDGER_FILENAME
        self.path = Path(path).expanduser().resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            if _schema_version(conn, self.path) < SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:  # another process may have brought it up to date while this one waited for the lock
                    if _schema_version(conn, self.path) < SCHEMA_VERSION:
                        _upgrade(conn, self.path)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # -- connections

    def _connect(self) -> _Connection:
        return _Connection(self.path)

    # -- budgets

    def set_budget(self, dataset_id: str, epsilon: float, delta: float, allow_raise: bool = False) -> BudgetChange:
        """Set, lower or raise a dataset's budget, the change kept in its history (`budget_history`), in one
        transaction. A budget below the current spend refuses every later charge. Raising a budget (a larger
        epsilon or delta) that entries already spend on is refused (`ConfigError`, nothing changed) unless
        `allow_raise`."""
        _check_dataset_id(dataset_id)
        epsilon, delta = _check_budget(epsilon, delta)
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            previous = _read_budget(conn, dataset_id)
            entries = _entry_count(conn, dataset_id)
            change = budget_change(dataset_id, epsilon, delta, previous, entries, _now())
            if change.raised_spent_budget and not allow_raise:
                conn.execute("ROLLBACK")
                raise ConfigError(f"dataset {dataset_id}: its budget epsilon {fmt_eps(previous.epsilon)} at delta "
                                  f"{fmt_delta(previous.delta)} has been spent on ({entries} entries); raising it to "
                                  f"epsilon {fmt_eps(epsilon)} at delta {fmt_delta(delta)} must be explicit: pass "
                                  "--raise (the change is kept in the ledger's budget history); nothing changed")
            conn.execute(
                "INSERT INTO budgets (dataset_id, epsilon, delta, set_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(dataset_id) DO UPDATE SET epsilon=excluded.epsilon, delta=excluded.delta, "
                "set_at=excluded.set_at",
                (dataset_id, epsilon, delta, change.set_at),
            )
            _insert_change(conn, change)
            conn.execute("COMMIT")
        return change

    def get_budget(self, dataset_id: str) -> Budget | None:
        with self._connect() as conn:
            return _read_budget(conn, dataset_id)

    def budget_history(self, dataset_id: str) -> list[BudgetChange]:
        """Every change of the dataset's budget, oldest first."""
        with self._connect() as conn:
            return _read_budget_history(conn, dataset_id)

    # -- reads

    def entries(self, dataset_id: str | None = None) -> list[Spend]:
        """All entries (of one dataset id, if given), oldest first."""
        with self._connect() as conn:
            return _read_entries(conn, dataset_id)

    def entries_for_run(self, run_id: str) -> list[Spend]:
        with self._connect() as conn:
            rows = conn.execute(f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM entries WHERE run_id = ? ORDER BY id",
                                (run_id,)).fetchall()
        return [_entry(row) for row in rows]

    def has_entry(self, run_id: str) -> bool:
        """Whether any spend is recorded under this run id (informational: the release gate matches
        the released calibration to an entry, `matching_entries`)."""
        with self._connect() as conn:
            return conn.execute("SELECT 1 FROM entries WHERE run_id = ? LIMIT 1", (run_id,)).fetchone() is not None

    def dataset_ids(self) -> list[str]:
        """Every dataset id with a budget or an entry."""
        with self._connect() as conn:
            rows = conn.execute("SELECT dataset_id FROM entries UNION SELECT dataset_id FROM budgets "
                                "ORDER BY dataset_id").fetchall()
        return [row[0] for row in rows]

    def spend(self, dataset_id: str, delta: float | None = None) -> DatasetSpend:
        """The composed spend of all entries of `dataset_id` at `delta` (default: the budget's delta,
        else the smallest entry delta)."""
        with self._connect() as conn:
            entries = _read_entries(conn, dataset_id)
            budget = _read_budget(conn, dataset_id)
            history = _read_budget_history(conn, dataset_id)
        return dataclasses.replace(_spend(dataset_id, entries, budget, delta), budget_history=tuple(history))

    def projected_spend(self, requests: Sequence[Spend], delta: float | None = None) -> DatasetSpend:
        """The spend the dataset would have after these charges (nothing is recorded; no check)."""
        requests = [_check_request(r) for r in requests]
        dataset_id = _single_dataset(requests)
        with self._connect() as conn:
            entries = _read_entries(conn, dataset_id)
            budget = _read_budget(conn, dataset_id)
        return _spend(dataset_id, entries, budget, delta, extra=requests)

    # -- records

    def remember_records(self, content_hash: str, records: record_sets.RecordSet) -> None:
        """Keep the sketch of the records behind `content_hash` (once; the hash fixes the records)."""
        with self._connect() as conn:
            conn.execute("INSERT OR IGNORE INTO record_sets (content_hash, records, sketch) VALUES (?, ?, ?)",
                         (content_hash, records.records, records.to_text()))

    # -- charging

    def charge(self, requests: Sequence[Spend], *, replay_recorded: bool = True, dry_run: bool = False,
               same_records_ok: bool = False) -> ChargeOutcome:
        """Charge a batch of spends of one dataset id, all or nothing, or refuse it; call BEFORE touching
        any private record. The one way a spend reaches the ledger.

        `replay_recorded` (default): a request the ledger already holds for the same run id (`unrecorded`:
        matched on its event, delta, purpose and content hash, never on the run id alone) is a replay of
        that run and is charged nothing again; the others are charged. False: every request is charged
        anew, held or not (two identical requests are two charges). Refused as a whole, nothing recorded,
        when the composition with the dataset's entries would exceed its budget (`BudgetExceededError`), or
        when another dataset id with a budget already spends on these records (`SameRecordsError`) unless
        `same_records_ok`. `dry_run`: the same checks and refusals, nothing recorded (`charged` is empty,
        `new_requests` what would be charged). With no budget set, every charge is recorded.
        """
        requests = [_check_request(r) for r in requests]
        if not requests:
            return ChargeOutcome((), (), (), dry_run)
        dataset_id = _single_dataset(requests)

        def split(entries: list[Spend]) -> tuple[list[Spend], list[Spend]]:
            if not replay_recorded:
                return list(requests), []
            return _split_recorded(requests, entries)

        # Compose outside the write lock first (seconds); inside it, recompute only if the
        # entries or the budget changed meanwhile.
        with self._connect() as conn:
            snapshot_entries = _read_entries(conn, dataset_id)
            snapshot_budget = _read_budget(conn, dataset_id)
        snapshot_new, _ = split(snapshot_entries)
        precomputed = None
        if snapshot_budget is not None and snapshot_new:
            precomputed = compose_epsilon([*snapshot_entries, *snapshot_new], snapshot_budget.delta)
        alone = {id(r): compose_epsilon([r], r.delta).epsilon for r in snapshot_new}

        from dpcore.privacy.events import event_to_json

        created_at = _now()
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                entries = _read_entries(conn, dataset_id)
                budget = _read_budget(conn, dataset_id)
                new, recorded = split(entries)
                if new and not same_records_ok:
                    for content_hash in sorted({r.content_hash for r in new}):
                        owner = _records_owner(conn, dataset_id, content_hash)
                        if owner is not None:
                            conn.execute("ROLLBACK")
                            raise SameRecordsError(_same_records_refusal(dataset_id, owner))
                if budget is not None and new:
                    if precomputed is not None and entries == snapshot_entries and budget == snapshot_budget:
                        after = precomputed
                    else:
                        after = compose_epsilon([*entries, *new], budget.delta)
                    if after.epsilon > budget.epsilon:
                        conn.execute("ROLLBACK")
                        raise BudgetExceededError(_refusal(dataset_id, entries, new, budget, after))
                if dry_run:
                    conn.execute("ROLLBACK")
                    return ChargeOutcome((), tuple(recorded), tuple(new), True)
                inserted = []
                for request in new:
                    epsilon_upper = alone.get(id(request))
                    if epsilon_upper is None:
                        epsilon_upper = compose_epsilon([request], request.delta).epsilon
                    cursor = conn.execute(
                        "INSERT INTO entries (dataset_id, content_hash, run_id, event, delta, epsilon_upper, purpose, "
                        "status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (request.dataset_id, request.content_hash, request.run_id, event_to_json(request.event),
                         request.delta, epsilon_upper, request.purpose, STATUS_CHARGED, created_at),
                    )
                    inserted.append(dataclasses.replace(request, id=cursor.lastrowid, epsilon_upper=epsilon_upper,
                                                        status=STATUS_CHARGED, created_at=created_at))
                conn.execute("COMMIT")
            except (BudgetExceededError, SameRecordsError):
                raise
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return ChargeOutcome(tuple(inserted), tuple(recorded), tuple(new), False)


def _schema_version(conn: sqlite3.Connection, path: Path) -> int:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise ConfigError(f"ledger {path}: written by a newer dpicl (schema {version}; this one reads up to "
                          f"{SCHEMA_VERSION}); nothing read or changed")
    return version


def _upgrade(conn: sqlite3.Connection, path: Path) -> None:
    """Bring a ledger to SCHEMA_VERSION inside the caller's transaction: create what is missing and
    convert flat entries (schemas 1, 2) to events."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
    if "mechanism" in columns:
        _convert_flat_entries(conn, path)
    had_history = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'budget_changes'"
                               ).fetchone() is not None
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    if not had_history:  # the budgets of an older ledger begin their history
        for dataset_id, epsilon, delta, set_at in conn.execute(
                "SELECT dataset_id, epsilon, delta, set_at FROM budgets ORDER BY set_at, dataset_id").fetchall():
            _insert_change(conn, BudgetChange(dataset_id, float(epsilon), float(delta), None, None, "first",
                                              _entry_count(conn, dataset_id), set_at))
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _convert_flat_entries(conn: sqlite3.Connection, path: Path) -> None:
    """Schemas 1 and 2 stored a generation's (mechanism, sigma, q, T): each row becomes the event they
    describe (`dpcore.privacy.events.sampled_steps_event`), with its id, delta, epsilon_upper, purpose, status and
    time; the id sequence goes on where it was."""
    from dpcore.privacy.events import event_to_json, sampled_steps_event

    conn.execute(_ENTRIES.format(table="entries_events"))
    kept = ("id", "dataset_id", "content_hash", "run_id", "delta", "epsilon_upper", "purpose", "status",
            "created_at")
    rows = conn.execute(f"SELECT {', '.join(kept + _FLAT_COLUMNS)} FROM entries ORDER BY id").fetchall()
    converted = []
    for row in rows:
        flat = dict(zip(_FLAT_COLUMNS, row[len(kept):], strict=True))
        # SQLite keeps any value in any column: a cell of the wrong type is named before it is read.
        column = next((c for c, kinds in (("mechanism", str), ("noise_multiplier", int | float),
                                          ("sampling_rate", int | float), ("steps", int))
                       if not isinstance(flat[c], kinds)), None)
        if column is None:
            try:
                event = sampled_steps_event(**flat)
            except ConfigError as exc:  # its message starts with the field's name
                column = next((c for c in _FLAT_COLUMNS if str(exc).startswith(c)), "/".join(_FLAT_COLUMNS))
        if column is not None:
            raise ConfigError(f"ledger {path}: entries row id {row[0]}, column {column}: not a spend this dpicl can "
                              "convert to an event; the ledger is unchanged")
        converted.append((*row[:4], event_to_json(event), *row[4:len(kept)]))
    conn.executemany(f"INSERT INTO entries_events ({', '.join(kept[:4])}, event, {', '.join(kept[4:])}) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", converted)
    sequence = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'").fetchone()
    conn.execute("DROP TABLE entries")  # its indexes and its sequence row go with it
    conn.execute("ALTER TABLE entries_events RENAME TO entries")
    if sequence is not None:
        conn.execute("DELETE FROM sqlite_sequence WHERE name IN ('entries', 'entries_events')")
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('entries', MAX(?, (SELECT COALESCE(MAX(id), 0) "
                     "FROM entries)))", (sequence[0],))


class _Connection:
    """A short-lived autocommit connection (transactions are explicit: BEGIN IMMEDIATE ... COMMIT)."""

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(str(path), timeout=LOCK_TIMEOUT_S, isolation_level=None)
        self.conn.execute("PRAGMA synchronous = FULL")

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, *exc) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")
        self.conn.close()


def _entry(row) -> Spend:
    values = dict(zip(_ENTRY_COLUMNS, row, strict=True))
    from dpcore.privacy.events import event_from_json

    values["event"] = event_from_json(values["event"])
    for key in ("delta", "epsilon_upper"):
        values[key] = float(values[key])
    return Spend(**values)


def _read_entries(conn: sqlite3.Connection, dataset_id: str | None) -> list[Spend]:
    query = f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM entries"
    if dataset_id is None:
        rows = conn.execute(query + " ORDER BY id").fetchall()
    else:
        rows = conn.execute(query + " WHERE dataset_id = ? ORDER BY id", (dataset_id,)).fetchall()
    return [_entry(row) for row in rows]


def _read_budget(conn: sqlite3.Connection, dataset_id: str) -> Budget | None:
    row = conn.execute("SELECT dataset_id, epsilon, delta, set_at FROM budgets WHERE dataset_id = ?",
                       (dataset_id,)).fetchone()
    return None if row is None else Budget(row[0], float(row[1]), float(row[2]), row[3])


_CHANGE_COLUMNS = ("dataset_id", "epsilon", "delta", "previous_epsilon", "previous_delta", "change", "entries",
                   "set_at")


def _insert_change(conn: sqlite3.Connection, change: BudgetChange) -> None:
    conn.execute(f"INSERT INTO budget_changes ({', '.join(_CHANGE_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 tuple(getattr(change, column) for column in _CHANGE_COLUMNS))


def _read_budget_history(conn: sqlite3.Connection, dataset_id: str) -> list[BudgetChange]:
    rows = conn.execute(f"SELECT {', '.join(_CHANGE_COLUMNS)} FROM budget_changes WHERE dataset_id = ? ORDER BY id",
                        (dataset_id,)).fetchall()
    return [BudgetChange(row[0], float(row[1]), float(row[2]), None if row[3] is None else float(row[3]),
                         None if row[4] is None else float(row[4]), row[5], int(row[6]), row[7]) for row in rows]


def _entry_count(conn: sqlite3.Connection, dataset_id: str) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM entries WHERE dataset_id = ?", (dataset_id,)).fetchone()[0])


def _records_owner(conn: sqlite3.Connection, dataset_id: str, content_hash: str) -> str | None:
    """Another dataset id with a budget that already spends on (largely) the records of `content_hash`,
    when `dataset_id` itself has spent on none of them; else None. An id without a budget guards nothing
    a new id could dodge (every spend stays recorded under it)."""
    spent = conn.execute("SELECT DISTINCT e.dataset_id, e.content_hash FROM entries e "
                         "LEFT JOIN budgets b ON b.dataset_id = e.dataset_id "
                         "WHERE b.dataset_id IS NOT NULL OR e.dataset_id = ?", (dataset_id,)).fetchall()
    sketches = {row[0]: record_sets.RecordSet.from_text(row[1], row[2])
                for row in conn.execute("SELECT content_hash, records, sketch FROM record_sets")}

    def same(other_hash: str) -> bool:
        if other_hash == content_hash:
            return True
        a, b = sketches.get(content_hash), sketches.get(other_hash)
        return a is not None and b is not None and record_sets.same_records(a, b)

    if any(same(h) for d, h in spent if d == dataset_id):
        return None  # this id already spends on these records: its budget is theirs
    return next((d for d, h in sorted(spent) if d != dataset_id and same(h)), None)


def _same_records_refusal(dataset_id: str, owner: str) -> str:
    return (f"dataset id '{dataset_id}': these records are largely those that dataset id '{owner}' already "
            f"spends privacy on, and a budget belongs to the records, not to a name; nothing charged. Run under "
            f"--dataset-id {owner} to keep one budget, or pass --new-budget-for-same-records to start a separate "
            f"budget for them knowingly (their privacy loss then adds up across both ids)")


def _single_dataset(requests: Sequence[Spend]) -> str:
    ids = {r.dataset_id for r in requests}
    if len(ids) != 1:
        raise ConfigError(f"one charge batch must name one dataset id, got {sorted(ids)}")
    return ids.pop()


def _spend(dataset_id: str, entries: list[Spend], budget: Budget | None, delta: float | None,
           extra: Sequence[Spend] = ()) -> DatasetSpend:
    parts = [*entries, *extra]
    if delta is None:
        if budget is not None:
            delta = budget.delta
        elif parts:
            delta = min(p.delta for p in parts)
    if delta is None:  # nothing recorded and no budget: nothing spent
        return DatasetSpend(0.0, 0.0, tuple(entries), budget, dataset_id)
    composition = compose_epsilon(parts, delta)
    return DatasetSpend(composition.epsilon, composition.delta, tuple(entries), budget, dataset_id,
                        composition.epsilon_prv, composition.epsilon_pld, composition.crosscheck_agreed,
                        composition.warnings)


def _refusal(dataset_id: str, entries: list[Spend], requests: Sequence[Spend], budget: Budget,
             after: Composition) -> str:
    # Computed after the transaction is rolled back (the lock is free again).
    current = compose_epsilon(entries, budget.delta).epsilon if entries else 0.0
    cost = compose_epsilon(requests, budget.delta).epsilon
    runs = ", ".join(sorted({r.run_id for r in requests}))
    params = "; ".join(r.describe() for r in requests)
    why = " (noise_multiplier = 0 means no privacy: an infinite spend)" if math.isinf(cost) else ""
    return (
        f"privacy budget of dataset '{dataset_id}' would be exceeded; run {runs} refused and nothing charged. "
        f"Current spend epsilon={_fmt(current)} ({len(entries)} entries), this run's cost "
        f"epsilon={_fmt(cost)} ({params}){why}, total after this run epsilon={_fmt(after.epsilon)} > "
        f"budget epsilon={_fmt(budget.epsilon)} at delta={fmt_delta(budget.delta)} (set {budget.set_at}; "
        f"see `dpicl ledger show --dataset {dataset_id}`)."
    )


__all__ = [
    "BUDGET_CHANGES", "Budget", "BudgetChange", "ChargeOutcome", "Composition", "DatasetSpend", "Ledger", "PURPOSES", "SCHEMA_VERSION", "Spend",
    "compose_epsilon", "entries_holding", "matching_entries", "rnm_step_epsilon", "same_event", "same_spend", "unrecorded",
]
