"""Neighbour-stable partitions of private records: each record's part is a keyed hash of its id.

DP's guarantee is about neighbouring datasets that differ in one record. A split that permutes the
row *count* (a seeded permutation of positions) reshuffles every record when one is added, so the
neighbouring datasets' training splits differ in hundreds of records and the charged (epsilon,
delta) silently becomes group privacy over hundreds. Here a record goes to a part by
`hash_unit(id, key) < fraction`: a function of its own id, a public key and a fixed fraction, never
of how many other records there are. So D plus x splits into exactly D's parts plus x in one of them.

The key is public (the split's seed and its purpose): the split is a public rule, not a secret;
what makes it neighbour-stable is that it reads one record at a time. A fraction, not a count: a
count would make every record's part depend on |D|. A count in a task YAML is turned into a fraction
against the shipped source's own (public, fixed) row count only (`dpcore.data.datasets`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from dpcore.errors import ConfigError

_SCALE = float(2**64)


def split_key(seed: int, purpose: str) -> bytes:
    """The public key of one partition (`purpose`: test, public, ...) at one split seed."""
    return hashlib.sha256(f"dpicl-split/{purpose}/{int(seed)}".encode()).digest()[:16]


def hash_unit(record_id: str, key: bytes) -> float:
    """A uniform number in [0, 1) that depends on the record's id and the key only."""
    digest = hashlib.blake2b(str(record_id).encode("utf-8"), key=key, digest_size=8).digest()
    return int.from_bytes(digest, "little") / _SCALE


def check_fraction(fraction: float, name: str) -> float:
    fraction = float(fraction)
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"{name}: a fraction in (0, 1) of the records is needed, got {fraction:g}")
    return fraction


def hash_split(record_ids: Iterable[str], fraction: float, key: bytes, name: str = "split") -> np.ndarray:
    """A boolean mask: True where the record falls in the part (`hash_unit < fraction`)."""
    fraction = check_fraction(fraction, name)
    return np.fromiter((hash_unit(rid, key) < fraction for rid in record_ids), dtype=bool)
