"""The CLI against the session's PostgreSQL server: a wrong password is one line that names the
failure and never shows the password."""

from tests.support.cli import assert_one_line_error, twoclocks_inproc


def test_wrong_password(pg_server):
    url = pg_server.url(password="wrong-pass-123")
    line = assert_one_line_error(twoclocks_inproc("runs", "list", "--db", url),
                                 "authentication failed")
    assert "wrong-pass-123" not in line
