"""Revision 0002 (analyses table): head -> 0001 -> base -> head on SQLite and PostgreSQL."""

from sqlalchemy import inspect

from twoclocks_cli.store.engine import make_engine
from twoclocks_cli.store.migrate import current_revision, downgrade, head_revision, upgrade


def _tables(engine):
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names())


def test_analyses_table_up_down_up(db_url):
    engine = make_engine(db_url)
    upgrade(engine)
    assert "analyses" in _tables(engine) and current_revision(engine) == head_revision()
    downgrade(engine, "0001")
    assert "analyses" not in _tables(engine) and "runs" in _tables(engine)
    downgrade(engine, "base")
    assert current_revision(engine) is None
    upgrade(engine)
    assert "analyses" in _tables(engine) and current_revision(engine) == head_revision()
    engine.dispose()


def test_saved_analysis_roundtrip(store):
    from twoclocks_cli.store import Sweep

    with store.session() as s:
        s.add(Sweep(name="s", backend="sim", config={}))
    assert store.latest_analysis("s") is None
    store.save_analysis("s", {"options": {"a": 1}, "x": 1})
    store.save_analysis("s", {"options": {"a": 2}, "x": 2})
    assert store.latest_analysis("s")["x"] == 2
