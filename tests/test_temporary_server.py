"""A run's temporary Prefect server (`flows.temporary_server`, `flows.sqlite_server`): its writes take SQLite's
write lock first, and its command is Prefect's with the patched module in place of uvicorn."""

from __future__ import annotations

import asyncio
import sqlite3
import sys

import pytest
import sqlalchemy

from flows import temporary_server
from flows.sqlite_server import begin_immediately


def _write_lock_free_during_a_server_transaction(database) -> bool:
    """Open a write transaction the way Prefect's server does (`begin_transaction`), read once in it, and say
    whether another connection can take the write lock meanwhile."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    async def probe() -> bool:
        config = AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{database}")
        engine = await config.engine()
        try:
            session = await config.session(engine)
            async with session:
                async with config.begin_transaction(session):
                    await session.execute(sqlalchemy.text("SELECT 1"))
                    other = sqlite3.connect(database, timeout=0, isolation_level=None)
                    try:
                        other.execute("BEGIN IMMEDIATE")
                        other.execute("ROLLBACK")
                        return True
                    except sqlite3.OperationalError:
                        return False
                    finally:
                        other.close()
        finally:
            await engine.dispose()

    return asyncio.run(probe())


@pytest.fixture()
def prefect_sqlite(monkeypatch):
    """Prefect's SQLite configuration, restored after the test patched it."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    for name in ("begin_transaction", "setup_sqlite"):
        monkeypatch.setattr(AioSqliteConfiguration, name, getattr(AioSqliteConfiguration, name))
    return AioSqliteConfiguration


def test_a_server_write_transaction_holds_the_write_lock_from_its_start(tmp_path, prefect_sqlite):
    sqlite3.connect(tmp_path / "before.db").close()
    # Prefect's own: DEFERRED, the lock is taken at the first write, and refused when another connection
    # committed since the transaction's read
    assert _write_lock_free_during_a_server_transaction(tmp_path / "before.db")
    begin_immediately()
    sqlite3.connect(tmp_path / "after.db").close()
    assert not _write_lock_free_during_a_server_transaction(tmp_path / "after.db")


def test_the_busy_timeout_is_the_one_asked_for(tmp_path, prefect_sqlite):
    begin_immediately(busy_timeout_ms=1234)
    connection = sqlite3.connect(tmp_path / "t.db")
    prefect_sqlite(connection_url="sqlite+aiosqlite:///unused").setup_sqlite(connection, None)
    assert connection.execute("PRAGMA busy_timeout").fetchone() == (1234,)


def test_prefects_server_command_runs_through_the_patched_module():
    prefect = [sys.executable, "-m", "uvicorn", "--app-dir", "x", "--factory", "prefect.server.api.server:create_app"]
    assert temporary_server.server_command(prefect) == [
        sys.executable, "-m", "flows.sqlite_server", "--app-dir", "x", "--factory",
        "prefect.server.api.server:create_app"]
    other = [sys.executable, "-m", "something_else"]
    assert temporary_server.server_command(other) == other
