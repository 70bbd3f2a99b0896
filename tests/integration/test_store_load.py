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
        time.sleep(4.0)  # the writers are connecting and flushing by now
        small_server.restart(down_s=2.0)

    t = threading.Thread(target=restart_midway)
    t.start()
    result = run_load(url, ids, steps=400, keys=5, flush_every=20)
    t.join()
    assert result.failed == 0, result.errors
    assert result.rows_found == result.rows_expected == 30 * 400 * 5
    assert result.duplicates == 0
    assert result.retries > 0  # the limit and the restart were really hit (and waited out)


def test_a_wrong_address_still_fails_fast(small_server):
    """Patience is for a server that was reached: a refused first connection is one line now."""
    from tests.support.cli import assert_one_line_error, twoclocks

    url = small_server.url().replace(f":{small_server.port}/", ":1/")
    t0 = time.monotonic()
    assert_one_line_error(twoclocks("runs", "list", "--db", url), "cannot reach database")
    assert time.monotonic() - t0 < 20
