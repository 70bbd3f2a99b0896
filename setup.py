"""Packages are found, not listed: every package under `twoclocks_cli/` and `trainer/`, plus the
top-level `migrations/` shipped inside the package as `twoclocks_cli.migrations` (the layout keeps
`migrations/` at the top of the repository; an installed twoclocks must still migrate its store).
Everything else about the build is in pyproject.toml."""

from setuptools import find_packages, setup

MIGRATIONS = {
    "twoclocks_cli.migrations": "migrations",
    "twoclocks_cli.migrations.versions": "migrations/versions",
}

setup(
    packages=find_packages(include=["twoclocks_cli", "twoclocks_cli.*", "trainer", "trainer.*"])
    + list(MIGRATIONS),
    package_dir=MIGRATIONS,
)
