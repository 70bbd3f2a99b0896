"""Alembic environment: always runs on a connection handed in by twoclocks_cli.store.migrate."""

from alembic import context

from twoclocks_cli.store.models import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the raw alembic CLI
    raise RuntimeError("run migrations through `twoclocks db upgrade`, not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=target_metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=True,
)
with context.begin_transaction():
    context.run_migrations()
