"""`--json` on the db commands: one JSON object each, the URL masked, values the same as the
migration API's own (alembic's revision table)."""

from __future__ import annotations

import json

from tests.support.cli import twoclocks


def test_db_current_upgrade_downgrade_json(tmp_path):
    from twoclocks_cli.store.engine import make_engine
    from twoclocks_cli.store.migrate import current_revision, head_revision

    url = f"sqlite:///{tmp_path / 's.db'}"
    up = json.loads(twoclocks("db", "upgrade", "--db", url, "--json").stdout)
    assert up["after"] == head_revision() and up["before"] is None
    cur = json.loads(twoclocks("db", "current", "--db", url, "--json").stdout)
    assert cur == {"url": url, "revision": current_revision(make_engine(url)),
                   "head": head_revision(), "state": "up to date"}
    down = json.loads(twoclocks("db", "downgrade", "base", "--db", url, "--json").stdout)
    assert down["before"] == head_revision() and down["after"] == "base"
    cur = json.loads(twoclocks("db", "current", "--db", url, "--json").stdout)
    assert cur["revision"] is None and cur["state"] == "empty"
