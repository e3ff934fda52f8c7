"""PromptPATE's public queries: unlabelled inputs the teachers label (Duan et al. Section 4.2, 5.2).

Sources (`source`):
- `iid`: the task's public split, held out of the private records and the test split by the task
  YAML's `split.public_size` (`dpcore.datasets.load_dataset`);
- `ood`: another dataset's texts, the StaICC file named by the task YAML's `pate.ood_public`, labels
  dropped (SST-2: rotten_tomatoes, the paper's IMDB stand-in; AG News: financial_phrasebank; TREC:
  tweet_eval_emotion). For a shipped task, texts that also occur anywhere in the task's own source
  file are dropped (rotten_tomatoes and SST-2 share sentences): a fixed function of two public files;
- `file`: a user's CSV/JSONL/Parquet file; only its text column is read.

Public queries never overlap the private split: `check_no_overlap` refuses a set that does (texts
compared lower-cased with single spaces). The Q queries are the first Q of a seeded shuffle of the
deduplicated texts (seed 0: a public choice, the same for every run).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.datasets import LoadedDataset, normalise_text, read_table, restricted_load, staicc_file
from dpcore.errors import ConfigError, DataValidationError

PUBLIC_SOURCES = ("iid", "ood", "file")
QUERY_COLUMNS = ["query_index", "text"]


def _dedupe(texts: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for text in texts:
        text = str(text).strip()
        key = normalise_text(text)
        if key and key not in seen:
            seen.add(key)
            out.append(text)
    return out


def ood_texts(data: LoadedDataset, shipped: bool) -> tuple[list[str], str]:
    """The task's OOD public texts and their source name (`pate.ood_public` of the task YAML)."""
    name = data.spec.pate.ood_public
    if not name:
        raise ConfigError(f"pate_public ood: task {data.spec.name!r} names no OOD public dataset (pate.ood_public "
                          "in its task YAML); use pate_public iid or a pate_public_path file")
    texts = [" ".join(parts) if isinstance(parts, list | tuple) else str(parts)
             for parts, _ in restricted_load(staicc_file(name))]
    if shipped:
        source = {normalise_text(t) for frame in (data.train, data.test, data.public) for t in frame["text"]}
        texts = [t for t in texts if normalise_text(t) not in source]
    return _dedupe(texts), f"StaICC:{name}"


def file_texts(path: str | Path, column: str = "text") -> tuple[list[str], str]:
    """The text column of a user's public file; an empty file or an empty text is an error naming the row."""
    path = Path(path).resolve()
    frame = read_table(path)  # errors: missing, unreadable, empty
    if column not in frame.columns:
        found = ", ".join(c for c in frame.columns if c != "__line__") or "none"
        raise DataValidationError(f"{path}: missing column {column!r} (found: {found}); pass pate_public_column")
    unit = "row" if path.suffix.lower() == ".parquet" else "line"
    for i, text in enumerate(frame[column].tolist()):
        if not isinstance(text, str) or not text.strip():
            raise DataValidationError(f"{path}: {unit} {frame['__line__'].iloc[i]}: column {column!r}: empty text")
    return _dedupe(frame[column].tolist()), str(path)


def public_texts(data: LoadedDataset, source: str, path: str | None = None, column: str = "text",
                 shipped: bool = True) -> tuple[list[str], str]:
    """The public texts of a source (deduplicated) and where they come from."""
    if source == "iid":
        if data.public.empty:
            raise ConfigError(f"pate_public iid: task {data.spec.name!r} holds out no public split (split.public_size "
                              "in its task YAML); use pate_public ood or a pate_public_path file")
        return _dedupe(data.public["text"].tolist()), f"{data.spec.name}:public split"
    if source == "ood":
        return ood_texts(data, shipped)
    if source == "file":
        if not path:
            raise ConfigError("pate_public file: pass pate_public_path (a CSV/JSONL/Parquet file with a text column)")
        return file_texts(path, column)
    raise ConfigError(f"pate_public: {source!r} is not one of {', '.join(PUBLIC_SOURCES)}")


def check_no_overlap(texts: Iterable[str], private_texts: Iterable[str], where: str) -> None:
    """Refuse public queries that also occur in the private records (the private and the test split:
    both come from the user's private data). The message holds a count only: no text, no row."""
    private = {normalise_text(t) for t in private_texts}
    overlap = sum(normalise_text(t) in private for t in texts)
    if overlap:
        raise DataValidationError(f"{where}: {overlap} public text(s) also occur in the private or test split; "
                                  "public queries must not hold private records (remove them from the public data)")


def select_queries(texts: list[str], queries: int, where: str, seed: int = 0) -> pd.DataFrame:
    """The first Q texts of a seeded shuffle: columns query_index, text (public)."""
    if queries < 1:
        raise ConfigError(f"pate_queries: Q must be >= 1, got {queries}")
    if queries > len(texts):
        raise ConfigError(f"pate_queries: Q = {queries} but {where} has only {len(texts)} distinct public texts; "
                          "use a smaller pate_queries")
    order = np.random.default_rng(seed).permutation(len(texts))[:queries]
    return pd.DataFrame({"query_index": np.arange(queries), "text": [texts[i] for i in order]})
