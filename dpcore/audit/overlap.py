"""Verbatim leakage: the longest run of tokens a demonstration shares with any private record.

Counts only, never text (an `OverlapReport` holds token counts and record counts). Used by the
membership audit's gate (`dpcore.audit.gate`): a synthetic demonstration that copies 8+ consecutive
tokens of a private record fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpcore.errors import ConfigError
from dpcore.flags import flag

# =========================================================================== verbatim overlap


@dataclass(frozen=True)
class OverlapReport:
    """Longest token run each demo shares with any private record; counts only, never text."""

    max_overlap_tokens: tuple[int, ...]  # per demo
    records_over_threshold: tuple[int, ...]  # per demo: records sharing >= threshold consecutive tokens
    overlapping_records: int  # distinct records sharing >= threshold tokens with any demo
    threshold: int
    tokenizer: str

    @property
    def max_overlap(self) -> int:
        return max(self.max_overlap_tokens, default=0)


_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_BASE = np.uint64(0x9E3779B97F4A7C15)


def _mix(tokens: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: token ids -> well-spread 64-bit values before polynomial hashing."""
    z = tokens.astype(np.uint64) + _BASE
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


def _flatten(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenated tokens, the owning sequence of each position, and each position's sequence end."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    tokens = (np.fromiter((t for s in sequences for t in s), dtype=np.int64, count=int(lengths.sum()))
              if lengths.sum() else np.zeros(0, dtype=np.int64))
    owner = np.repeat(np.arange(len(sequences)), lengths)
    ends = np.cumsum(lengths)
    return tokens, owner, ends[owner] if len(owner) else np.zeros(0, dtype=np.int64)


def verbatim_overlap_tokens(demo_tokens: Sequence[Sequence[int]], record_tokens: Sequence[Sequence[int]],
                            threshold: int = 8, tokenizer: str = "token ids") -> OverlapReport:
    """For each demo, the longest run of consecutive tokens it shares with any record.

    Level-wise n-gram hashing, vectorised (numpy): at length L, the 64-bit polynomial hash
    of every L-token window of the records is matched against the demos' L-windows; only
    windows whose L-gram matched are extended to L + 1 (a window can match at L + 1 only
    if its first L tokens matched), so the work shrinks fast once L passes the length of
    common phrases. At L = `threshold` the matching (demo, record) pairs are checked token
    by token (no hash collision can count a record) and counted. Cost: O(total record
    tokens x a few levels) memory and time; 100k records of ~50 tokens take seconds.
    """
    if threshold < 1:
        raise ConfigError(f"{flag('overlap_threshold')}: must be >= 1, got {threshold}")
    n_demos = len(demo_tokens)
    best = np.zeros(n_demos, dtype=np.int64)
    counts = np.zeros(n_demos, dtype=np.int64)
    matched_records: set[int] = set()
    if n_demos == 0 or not record_tokens:
        return OverlapReport(tuple(best.tolist()), tuple(counts.tolist()), 0, threshold, tokenizer)
    c_tok, c_owner, c_end = _flatten(record_tokens)
    d_tok, d_owner, d_end = _flatten(demo_tokens)
    c_mixed, d_mixed = _mix(c_tok), _mix(d_tok)
    # Windows of length L are identified by their start position; L = 1 first.
    c_pos = np.arange(len(c_tok))
    d_pos = np.arange(len(d_tok))
    c_hash, d_hash = c_mixed.copy(), d_mixed.copy()
    length = 1
    while len(d_pos) and len(c_pos):
        c_hit = np.isin(c_hash, d_hash)
        d_hit = np.isin(d_hash, c_hash[c_hit])
        if not d_hit.any():
            break
        best[np.unique(d_owner[d_pos[d_hit]])] = length
        if length == threshold:
            # Count (demo, record) pairs, one representative window per (hash, demo) and (hash, record),
            # each checked token by token, so a hash collision can never count a record.
            left = pd.DataFrame({"h": d_hash[d_hit], "demo": d_owner[d_pos[d_hit]], "dpos": d_pos[d_hit]})
            right = pd.DataFrame({"h": c_hash[c_hit], "record": c_owner[c_pos[c_hit]], "cpos": c_pos[c_hit]})
            pairs = (left.drop_duplicates(["h", "demo"])
                     .merge(right.drop_duplicates(["h", "record"]), on="h"))
            offsets = np.arange(length)
            same = (c_tok[pairs["cpos"].to_numpy()[:, None] + offsets]
                    == d_tok[pairs["dpos"].to_numpy()[:, None] + offsets]).all(axis=1)
            genuine = set(pairs.loc[same, "h"].tolist())
            pairs = pairs.loc[same]
            per_demo = pairs.groupby("demo")["record"].nunique()
            counts[per_demo.index.to_numpy()] = per_demo.to_numpy()
            matched_records.update(int(r) for r in pairs["record"].unique())
            unverified = np.setdiff1d(np.flatnonzero(best == threshold), per_demo.index.to_numpy())
            best[unverified] = threshold - 1
            genuine_hashes = np.fromiter(genuine, dtype=np.uint64, count=len(genuine))
            d_hit &= np.isin(d_hash, genuine_hashes)
            c_hit &= np.isin(c_hash, genuine_hashes)
        # Extend the matching windows by one token where the sequence has one.
        c_pos, c_hash = c_pos[c_hit], c_hash[c_hit]
        d_pos, d_hash = d_pos[d_hit], d_hash[d_hit]
        c_ok = c_pos + length < c_end[c_pos]
        d_ok = d_pos + length < d_end[d_pos]
        c_pos, c_hash = c_pos[c_ok], c_hash[c_ok]
        d_pos, d_hash = d_pos[d_ok], d_hash[d_ok]
        c_hash = c_hash * _BASE + c_mixed[c_pos + length]
        d_hash = d_hash * _BASE + d_mixed[d_pos + length]
        length += 1
    return OverlapReport(tuple(int(b) for b in best), tuple(int(c) for c in counts), len(matched_records),
                         threshold, tokenizer)


def whitespace_tokenize(texts: Sequence[str]) -> list[list[int]]:
    """Tokenizer-agnostic fallback: whitespace-separated words, ids from one shared vocabulary."""
    vocabulary: dict[str, int] = {}
    return [[vocabulary.setdefault(word, len(vocabulary)) for word in str(text).split()] for text in texts]


def model_tokenize(lm) -> Callable[[Sequence[str]], list[list[int]]]:
    """The language model's own tokens (no special tokens), batched through the fast tokenizer."""

    def tokenize(texts: Sequence[str]) -> list[list[int]]:
        out: list[list[int]] = []
        texts = [str(t) for t in texts]
        for start in range(0, len(texts), 4096):
            out.extend(lm.tokenizer(texts[start:start + 4096], add_special_tokens=False)["input_ids"])
        return out

    return tokenize


def verbatim_overlap(demos: Sequence[str], records: Sequence[str], threshold: int = 8,
                     tokenize: Callable[[Sequence[str]], list[list[int]]] | None = None,
                     tokenizer_name: str | None = None) -> OverlapReport:
    """`verbatim_overlap_tokens` on texts. `tokenize` maps a list of texts to token-id lists
    (prefer `model_tokenize(lm)`: the model's tokens); default: whitespace words.

    Texts are tokenized one by one, so a run may differ by a token at its ends from the
    same words inside a longer text (subword merges at the boundary).
    """
    name = tokenizer_name or ("whitespace" if tokenize is None else "model")
    tokenize = tokenize or whitespace_tokenize
    ids = tokenize(list(demos) + list(records))  # one call: one shared vocabulary for the whitespace tokenizer
    return verbatim_overlap_tokens(ids[: len(demos)], ids[len(demos):], threshold, tokenizer=name)
