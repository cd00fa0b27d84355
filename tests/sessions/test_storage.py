"""`agentloop.storage.connect_sqlite`: many connections opening a new file at once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from agentloop.storage import connect_sqlite

_SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER);"


def _open_together(path: Path, count: int) -> list[BaseException]:
    """Open `count` connections to `path` from threads released at the same moment."""
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            connect_sqlite(path, _SCHEMA).close()
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_twenty_connections_set_up_a_new_file_together(tmp_path: Path) -> None:
    # Switching a new file to WAL needs it alone and does not wait on the busy timeout:
    # done on every connection, one of twenty opened together failed "database is locked".
    for trial in range(30):
        path = tmp_path / f"{trial}" / "store.db"
        assert _open_together(path, 20) == []
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
            assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]


def test_a_file_already_set_up_is_only_read(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    connect_sqlite(path, _SCHEMA).close()
    # A reader holding a transaction open does not stop a new connection from opening.
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()
    try:
        db = connect_sqlite(path, _SCHEMA)
        db.execute("INSERT INTO t VALUES (1)")
        db.close()
    finally:
        reader.execute("COMMIT")
        reader.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT x FROM t").fetchall() == [(1,)]
