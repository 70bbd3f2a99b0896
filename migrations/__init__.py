"""Alembic migrations of the twoclocks store, shipped as `twoclocks_cli.migrations`."""
