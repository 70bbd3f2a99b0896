"""The store under cluster load: more writer processes than the server has connections, and a
server restart while they write. Every row lands exactly once (counted in SQL); no writer fails.
A real PostgreSQL server of its own (max_connections = 12: 9 for clients after the 3 reserved)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.pgserver import PgServer
from tests.support.storeload import make_runs, run_load

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def small_server():
    server = PgServer(max_connections=12).start()
    try:
        yield server
    finally:
        server.stop()


def test_thirty_writers_on_nine_connections_and_a_restart_lose_nothing(small_server):
    url = small_server.url()
    ids = make_runs(url, 30, "load")

    def restart_midway():
        # once every writer has reached the server (its first flush landed): a process whose
        # first connection meets a stopped server is a wrong address to it, and fails fast
        _wait_for_every_writer(url, ids, deadline=time.monotonic() + 120)
        small_server.restart(down_s=2.0)

    t = threading.Thread(target=restart_midway)
    t.start()
    result = run_load(url, ids, steps=400, keys=5, flush_every=20)
    t.join()
    assert result.failed == 0, result.errors
    assert result.rows_found == result.rows_expected == 30 * 400 * 5
    assert result.duplicates == 0
    assert result.retries > 0  # the limit and the restart were really hit (and waited out)


def _wait_for_every_writer(url: str, ids: list[int], deadline: float) -> None:
    """Until rows of every run in `ids` are in the store (or the deadline passes); a refused
    or full connection is retried, as the writers' own are."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    query = text("SELECT count(DISTINCT run_id) FROM metrics WHERE run_id = ANY(:ids)")
    try:
        while time.monotonic() < deadline:
            try:
                with engine.connect() as conn:
                    if conn.execute(query, {"ids": list(ids)}).scalar() >= len(ids):
                        return
            except Exception:  # the server is full: the writers hold every slot
                pass
            time.sleep(0.2)
    finally:
        engine.dispose()


def test_a_wrong_address_still_fails_fast(small_server):
    """Patience is for a server that was reached: a refused first connection is one line now."""
    from tests.support.cli import assert_one_line_error, twoclocks

    url = small_server.url().replace(f":{small_server.port}/", ":1/")
    t0 = time.monotonic()
    assert_one_line_error(twoclocks("runs", "list", "--db", url), "cannot reach database")
    assert time.monotonic() - t0 < 20


class _SlowThenForward:
    """A TCP front for the server that leaves its first `silent` connections unanswered (a
    server swamped by a burst of job starts), then forwards bytes both ways."""

    def __init__(self, port: int, silent: int):
        import socket

        self.port, self.silent, self.seen = port, silent, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.front = self.sock.getsockname()[1]
        self.held: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.seen += 1
            if self.seen <= self.silent:
                self.held.append(client)  # accepted, never answered: the client times out
                continue
            upstream = socket.create_connection(("127.0.0.1", self.port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def test_a_server_too_slow_to_answer_at_first_is_waited_for(small_server):
    """Two first connections time out (10 s each, unanswered); the third is answered: the
    command succeeds instead of failing on a server that was only busy."""
    from tests.support.cli import twoclocks

    front = _SlowThenForward(small_server.port, silent=2)
    try:
        url = small_server.url().replace(f":{small_server.port}/", f":{front.front}/")
        proc = twoclocks("runs", "list", "--db", url, "--json")
        assert proc.returncode == 0, proc.stderr
        assert front.seen >= 3
    finally:
        front.close()
