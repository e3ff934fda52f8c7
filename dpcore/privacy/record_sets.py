"""Whose records these are: a privacy budget belongs to the records, not to the name they run under.

A record set is summarised by a bottom-k sketch (Broder, "On the resemblance and containment of
documents", 1997): the k smallest keyed 64-bit hashes of its records' (label, normalised text).
Two sketches estimate how much two record sets share, so the ledger can tell that a file run
under a new dataset id holds (largely) the records another id already spends privacy on, even
after a re-export renumbered the ids or added a few rows. With at most k records the sketch is
the whole set, and two whole sets are compared exactly.

The hashes are keyed with the home's secret (`dpcore.home.content_key`): without it a sketch
says nothing about any record's content. Sketches stay in the ledger; nothing prints them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

SKETCH_SIZE = 256
# Above this share of the smaller set, two record sets are "the same records" for budgeting.
SAME_RECORDS_SHARE = 0.5


@dataclass(frozen=True)
class RecordSet:
    """A record set's size and bottom-k sketch (sorted keyed hashes)."""

    records: int
    sketch: tuple[int, ...]

    def to_text(self) -> str:
        return " ".join(f"{value:016x}" for value in self.sketch)

    @classmethod
    def from_text(cls, records: int, text: str) -> RecordSet:
        return cls(int(records), tuple(int(value, 16) for value in text.split()))


def record_hash(label: str, text: str, key: bytes) -> int:
    """A record's keyed 64-bit hash over its label and normalised text (ids are not content)."""
    digest = hashlib.blake2b(key=key, digest_size=8)
    for part in (str(label), " ".join(str(text).lower().split())):
        encoded = part.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return int.from_bytes(digest.digest(), "big")


def record_set(records: Iterable[tuple[str, str]], key: bytes, size: int = SKETCH_SIZE) -> RecordSet:
    """The `RecordSet` of (label, text) records; duplicates count once."""
    hashes = sorted({record_hash(label, text, key) for label, text in records})
    return RecordSet(len(hashes), tuple(hashes[:size]))


def shared_share(a: RecordSet, b: RecordSet) -> float:
    """Estimated |A ∩ B| / min(|A|, |B|): the share of the smaller set that the other also holds.

    The union's bottom-k (k = the smaller sketch) is a uniform sample of A ∪ B; the fraction of it
    in both sketches estimates the Jaccard index J, and |A ∩ B| = J (|A| + |B|) / (1 + J)."""
    if not a.records or not b.records:
        return 0.0
    set_a, set_b = set(a.sketch), set(b.sketch)
    if len(set_a) == a.records and len(set_b) == b.records:  # both whole sets: exact
        return len(set_a & set_b) / min(a.records, b.records)
    k = min(len(a.sketch), len(b.sketch))
    union = sorted(set_a | set_b)[:k]
    # a sample value is known to lie in A (in B) only if it is below A's (B's) largest sketch value,
    # which every union bottom-k value is when both sketches are full or whole sets
    jaccard = sum(1 for value in union if value in set_a and value in set_b) / len(union)
    shared = jaccard * (a.records + b.records) / (1 + jaccard)
    return min(1.0, shared / min(a.records, b.records))


def same_records(a: RecordSet, b: RecordSet) -> bool:
    """Whether two record sets are, for budgeting, the same records (`SAME_RECORDS_SHARE`)."""
    return shared_share(a, b) >= SAME_RECORDS_SHARE
