"""The accountants' answers the suite asks for, kept with the tests: a fresh clone's `make test` starts with them.

Every answer in the accounting cache (`dpcore.privacy.memo`) is a pure function of its key: public inputs, the
accountants' versions and a digest of the accounting code. A fresh environment computes each of the suite's
about 1,300 answers once; measured on the 2-core development machine, that cold start cost 241 s of CPU and 127 s
of wall over a warm one (benchmarks/RESULTS.md, the test suite). The seed holds those answers; only those whose
key names this code's digest and these accountants' versions are planted, so a stale seed plants nothing and
the suite computes its answers as before (`test_accounting_seed.py` says when it is stale). A planted answer is
read back only under its full key, like any other.

    python tests/accounting_seed.py write FOLDER   # the answers of FOLDER (a suite's cache) that this code reads
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from dpcore.privacy import memo

SEED = Path(__file__).with_name("accounting-seed.jsonl.gz")


def current(key: dict) -> bool:
    """Whether an answer's key is one this code and these accountants would ask for (the fields `memo.key` sets
    apart from the inputs)."""
    now = memo.key(str(key.get("kind")))
    return all(key.get(field) == now[field] for field in ("format", "versions", "code"))


def answers(seed: Path = SEED) -> list[dict]:
    """The seed's answers ({"key", "value"}), current or not; none where there is no seed."""
    if not seed.exists():
        return []
    with gzip.open(seed, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def plant(folder: Path, seed: Path = SEED) -> int:
    """Put the seed's current answers that `folder` lacks into it (atomically, as the accountants do); their
    number."""
    planted = 0
    for answer in answers(seed):
        if current(answer["key"]) and memo.get(folder, answer["key"]) is None:
            memo.put(folder, answer["key"], answer["value"])
            planted += 1
    return planted


def write(folder: Path, seed: Path = SEED) -> int:
    """The seed from the current answers stored in `folder`, in a stable order (byte-identical for the same
    answers); their number."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            answer = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(answer, dict) and isinstance(answer.get("key"), dict) and current(answer["key"]):
            found.append(json.dumps({"key": answer["key"], "value": answer["value"]}, sort_keys=True))
    found.sort()
    with open(seed, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as packed:
        packed.write("".join(line + "\n" for line in found).encode())
    return len(found)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "write":
        sys.exit("usage: python tests/accounting_seed.py write FOLDER")
    print(f"{write(Path(sys.argv[2]))} answers written to {SEED}")
