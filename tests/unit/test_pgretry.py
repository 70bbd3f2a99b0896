"""Which PostgreSQL connection failures the store waits out, and which it reports at once.

The texts are the server's own (as libpq prints them); the one for a server replaying WAL after
a restart was seen from a real PostgreSQL 16 during the store-load test."""

from __future__ import annotations

import pytest

from twoclocks_cli.store.pgretry import transient

REPLAYING = ('connection failed: connection to server at "127.0.0.1", port 49229 failed: FATAL:  '
             "the database system is not yet accepting connections\n"
             "DETAIL:  Consistent recovery state has not been yet reached.")


@pytest.mark.parametrize("text", [
    REPLAYING,
    "FATAL:  the database system is starting up",
    "FATAL:  the database system is shutting down",
    "FATAL:  sorry, too many clients already",
    "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
    "FATAL:  the database system is not accepting connections\n"
    "DETAIL:  Hot standby mode is disabled.",
])
def test_a_busy_or_restarting_server_is_waited_for_even_before_it_was_reached(text):
    assert transient(Exception(text), reached_before=False)


def test_a_refused_connection_is_waited_for_only_after_the_server_was_reached():
    text = 'connection to server at "127.0.0.1", port 1 failed: Connection refused'
    assert not transient(Exception(text), reached_before=False)
    assert transient(Exception(text), reached_before=True)


def test_a_wrong_password_is_never_retried():
    text = 'FATAL:  password authentication failed for user "tc"'
    assert not transient(Exception(text), reached_before=True)


def test_a_silent_server_is_retried_a_few_times_before_first_contact():
    text = "connection timeout expired"
    assert transient(Exception(text), reached_before=False, timeouts_so_far=0)
    assert not transient(Exception(text), reached_before=False, timeouts_so_far=4)
    assert transient(Exception(text), reached_before=True, timeouts_so_far=9)
