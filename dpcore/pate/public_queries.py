"""PromptPATE's public queries: unlabelled inputs the teachers label (Duan et al. Section 4.2, 5.2).

Sources (`source`):
- `iid`: the task's public split, held out of a *shipped* source by the task YAML's
  `split.public_size` (`dpcore.data.datasets.load_dataset`); a user's records file has none: public data
  never comes from a private file;
- `ood`: another dataset's texts, the StaICC file named by the task YAML's `pate.ood_public`, labels
  dropped (SST-2: rotten_tomatoes, the paper's IMDB stand-in; AG News: financial_phrasebank; TREC:
  tweet_eval_emotion). When the run's records are the shipped task's own shipped source, texts that
  also occur in that shipped file are dropped (rotten_tomatoes and SST-2 share sentences): a fixed
  function of two public files, read from the files themselves, never from the run's records;
- `file`: a user's CSV/JSONL/Parquet file declared public; only its text column is read.

No public text is ever compared with the private records. Such a check is itself a query on the
private data ("is this text in it?"), answered for free to whoever can start a run; a file the user
declares public is public, and keeping it out of the private data is the user's declaration. The Q
queries are the first Q of a seeded shuffle of the deduplicated texts (seed 0: a public choice).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from dpcore.data.datasets import LoadedDataset, normalise_text, read_table, restricted_load, staicc_file
from dpcore.errors import ConfigError, DataValidationError
from dpcore.flags import flag

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


def ood_texts(data: LoadedDataset) -> tuple[list[str], str]:
    """The task's OOD public texts and their source name (`pate.ood_public` of the task YAML)."""
    name = data.spec.pate.ood_public
    if not name:
        raise ConfigError(f"{flag('pate_public', 'ood')}: task {data.spec.name!r} names no OOD public dataset "
                          f"(pate.ood_public in its task YAML); use {flag('pate_public', 'iid')} or a public file "
                          f"({flag('pate_public_path')})")
    texts = [" ".join(parts) if isinstance(parts, list | tuple) else str(parts)
             for parts, _ in restricted_load(staicc_file(name))]
    if data.shipped:  # the records are the shipped public file itself: a function of two public files
        source = {normalise_text(t) for frame in (data.train, data.test, data.public) for t in frame["text"]}
        texts = [t for t in texts if normalise_text(t) not in source]
    return _dedupe(texts), f"StaICC:{name}"


def file_texts(path: str | Path, column: str = "text") -> tuple[list[str], str]:
    """The text column of a user's public file; an empty file or an empty text is an error naming the row."""
    path = Path(path).resolve()
    frame = read_table(path)  # errors: missing, unreadable, empty
    if column not in frame.columns:
        found = ", ".join(c for c in frame.columns if c != "__line__") or "none"
        raise DataValidationError(f"{path}: missing column {column!r} (found: {found}); pass {flag('pate_public_column')}")
    unit = "row" if path.suffix.lower() == ".parquet" else "line"
    for i, text in enumerate(frame[column].tolist()):
        if not isinstance(text, str) or not text.strip():
            raise DataValidationError(f"{path}: {unit} {frame['__line__'].iloc[i]}: column {column!r}: empty text")
    return _dedupe(frame[column].tolist()), str(path)


def public_texts(data: LoadedDataset, source: str, path: str | None = None,
                 column: str = "text") -> tuple[list[str], str]:
    """The public texts of a source (deduplicated) and where they come from."""
    if source == "iid":
        if not data.shipped:
            raise ConfigError(f"{flag('pate_public', 'iid')}: public queries are never carved out of your own records "
                              f"file; pass {flag('pate_public_path')} FILE (texts you declare public) or "
                              f"{flag('pate_public', 'ood')}")
        if data.public.empty:
            raise ConfigError(f"{flag('pate_public', 'iid')}: task {data.spec.name!r} holds out no public split "
                              f"(split.public_size in its task YAML); use {flag('pate_public', 'ood')} or "
                              f"{flag('pate_public_path')} FILE")
        return _dedupe(data.public["text"].tolist()), f"{data.spec.name}:public split"
    if source == "ood":
        return ood_texts(data)
    if source == "file":
        if not path:
            raise ConfigError(f"{flag('pate_public', 'file')}: pass {flag('pate_public_path')} (a CSV/JSONL/Parquet "
                              "file with a text column)")
        return file_texts(path, column)
    raise ConfigError(f"{flag('pate_public')}: {source!r} is not one of {', '.join(PUBLIC_SOURCES)}")


def select_queries(texts: list[str], queries: int, where: str, seed: int = 0) -> pd.DataFrame:
    """The first Q texts of a seeded shuffle: columns query_index, text (public)."""
    if queries < 1:
        raise ConfigError(f"{flag('pate_queries')}: Q must be >= 1, got {queries}")
    if queries > len(texts):
        raise ConfigError(f"{flag('pate_queries')}: Q = {queries} but {where} has only {len(texts)} distinct "
                          "public texts; ask for fewer queries")
    order = np.random.default_rng(seed).permutation(len(texts))[:queries]
    return pd.DataFrame({"query_index": np.arange(queries), "text": [texts[i] for i in order]})
