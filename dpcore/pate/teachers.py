"""PromptPATE's teachers: E disjoint k-shot prompts built from the private records (Duan et al. Section 4.2).

"Instead of training teacher models on disjoint partitions of the private data, we use the private
data to create disjoint prompts" (Section 4.2); "we select one-shot examples randomly without
replacement" (Section 5.2). Each record is in at most one teacher, so adding or removing one
record changes at most one teacher's prompt, hence one teacher's vote: the vote histogram's
sensitivity (L1 2, L2 sqrt(2) for a changed vote; 1 for an added or removed one) that the
Confident-GNMax accounting assumes.

How: a secret 128-bit key (drawn from the run's noise generator) hashes every record id to a
bucket in [0, E) and a priority; teacher i takes the k records of bucket i with the smallest
priority. A record's bucket and priority depend on its own id and the key only, so removing a
record changes bucket i's prompt alone, whatever the other records are (a random permutation cut
into consecutive chunks would shift every later teacher). Not label-balanced, as in the paper:
with k = 1 a teacher holds one label anyway, and balancing would make each label's record count
a constraint (a teacher's labels are whatever its bucket draws). A bucket with fewer than k
records gives a teacher with fewer demonstrations (only possible when E*k is close to the record
count; which teachers are short depends on the private ids, so it is recorded in the private
assignment table only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpcore.errors import ConfigError
from dpcore.flags import flag

ASSIGNMENT_COLUMNS = ["teacher", "position", "id"]


@dataclass(frozen=True)
class Teachers:
    """Which private record ids make up each teacher's prompt, in prompt order (PRIVATE)."""

    demos: tuple[tuple[str, ...], ...]

    @property
    def count(self) -> int:
        return len(self.demos)

    def table(self) -> pd.DataFrame:
        """The private assignment table: one row per (teacher, position, record id)."""
        rows = [(t, p, rid) for t, ids in enumerate(self.demos) for p, rid in enumerate(ids)]
        return pd.DataFrame(rows, columns=ASSIGNMENT_COLUMNS)

    @classmethod
    def from_table(cls, table: pd.DataFrame, teachers: int) -> Teachers:
        demos: list[list[str]] = [[] for _ in range(teachers)]
        for row in table.sort_values(["teacher", "position"]).itertuples(index=False):
            demos[int(row.teacher)].append(str(row.id))
        return cls(tuple(tuple(d) for d in demos))


def check_flock_size(teachers: int, shots: int, records: int) -> None:
    """E*k records are needed for E disjoint k-shot teachers (a public check: |D_priv| is public)."""
    if teachers < 1:
        raise ConfigError(f"{flag('pate_teachers')}: E must be >= 1, got {teachers}")
    if shots < 1:
        raise ConfigError(f"{flag('pate_shots')}: k must be >= 1, got {shots}")
    if teachers * shots > records:
        raise ConfigError(f"{flag('pate_teachers')} x {flag('pate_shots')}: {teachers} teachers x {shots} shots = {teachers * shots} "
                          f"records, but the private split has only {records}; use fewer teachers or shots")


def bucket_and_priority(key: bytes, record_id: str, teachers: int) -> tuple[int, int]:
    digest = hashlib.blake2b(str(record_id).encode("utf-8"), key=key, digest_size=16).digest()
    return int.from_bytes(digest[:8], "little") % teachers, int.from_bytes(digest[8:], "little")


def assign_teachers(record_ids: list[str], teachers: int, shots: int, rng: np.random.Generator) -> Teachers:
    """E disjoint teachers of (up to) k record ids each; randomness from `rng` (the run's noise generator).

    Deterministic in (record ids as a set, E, k, the key drawn from rng); independent of the order of
    `record_ids`. Raises ConfigError when E*k exceeds the records.
    """
    check_flock_size(teachers, shots, len(record_ids))
    key = rng.bytes(16)
    buckets: list[list[tuple[int, str]]] = [[] for _ in range(teachers)]
    for rid in record_ids:
        bucket, priority = bucket_and_priority(key, rid, teachers)
        buckets[bucket].append((priority, str(rid)))
    demos = tuple(tuple(rid for _, rid in sorted(bucket)[:shots]) for bucket in buckets)
    return Teachers(demos)
