"""Prefect's API server on SQLite with every write transaction begun IMMEDIATE: run as
`python -m flows.sqlite_server <uvicorn's arguments>` in place of `python -m uvicorn`.

Prefect's SQLite server begins a write transaction DEFERRED: it reads, then asks for the write lock. When
another connection committed in between, SQLite refuses the upgrade at once (the reader's snapshot is stale;
no busy wait can help). Prefect's server then answers 503, and its client sleeps 2 s (then 4, 8, ...) before
retrying; its task-run recorder logs "database is locked" with a traceback and retries its batch. Every task
run with tags meets this when it asks for its concurrency slots (`increment-with-lease`): measured on the
test suite's server, 18 refusals in 98.9 s of `tests/test_neighbours.py`, one acquisition waiting 62 s.
Begun IMMEDIATE, a transaction takes the write lock first and waits its turn (SQLite's busy timeout) instead.

Both a run's temporary server (`flows.temporary_server`) and the test suite's shared server run through here.
Nothing changes for a server on PostgreSQL: only Prefect's SQLite configuration is patched.
"""

from __future__ import annotations

import contextlib
import runpy
import sys


def begin_immediately(busy_timeout_ms: int | None = None) -> None:
    """Patch Prefect's SQLite database configuration in this process: write transactions begin IMMEDIATE, and
    with `busy_timeout_ms`, a connection waits that long for the lock (Prefect's own: 60 s; 30 s in its test
    mode)."""
    from prefect.server.database import configurations

    sqlite = configurations.AioSqliteConfiguration

    @contextlib.asynccontextmanager
    async def begin_transaction(self, session, with_for_update=False):  # noqa: ARG001 - Prefect's signature
        token = configurations.SQLITE_BEGIN_MODE.set("IMMEDIATE")
        try:
            async with session.begin() as transaction:
                yield transaction
        finally:
            configurations.SQLITE_BEGIN_MODE.reset(token)

    sqlite.begin_transaction = begin_transaction
    if busy_timeout_ms is not None:
        setup_sqlite = sqlite.setup_sqlite

        def setup_sqlite_waiting(self, conn, record):
            setup_sqlite(self, conn, record)
            cursor = conn.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)};")
            cursor.close()

        sqlite.setup_sqlite = setup_sqlite_waiting


def main(argv: list[str]) -> None:
    """`[--busy-timeout-ms N] <uvicorn's arguments>`: patch, then run uvicorn as `python -m uvicorn` would."""
    busy_timeout_ms = None
    if argv[:1] == ["--busy-timeout-ms"]:
        busy_timeout_ms, argv = int(argv[1]), argv[2:]
    begin_immediately(busy_timeout_ms)
    sys.argv = ["uvicorn", *argv]
    runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
