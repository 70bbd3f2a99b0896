"""`analyze`'s analysis options come from one model: every option's default and help are the
`AnalysisOptions` field's, and every field with a help text is an option."""

from __future__ import annotations

import dataclasses

import typer
from typer.testing import CliRunner

from twoclocks_cli.app import app
from twoclocks_cli.clocks.options import AnalysisOptions

# analyze's own options, which are not analysis knobs (files, the store, the output form)
OWN = {"sweeps", "csv", "plot", "save", "cost", "db", "as_json"}


def _params() -> dict:
    """analyze's click parameters by name, as the CLI builds them."""
    command = typer.main.get_command(app).commands["analyze"]
    return {p.name: p for p in command.params}


def test_every_option_is_a_model_field_with_its_default_and_help():
    params = _params()
    fields = {f.name: f for f in dataclasses.fields(AnalysisOptions) if "help" in f.metadata}
    assert set(params) - OWN == set(fields)
    for name, f in fields.items():
        p = params[name]
        assert p.help == f.metadata["help"], name
        assert p.default == f.metadata.get("cli_default", f.default), name
        if f.type == "bool":
            assert p.opts == [f"--{name.replace('_', '-')}"], name
            assert p.secondary_opts == [f"--no-{name.replace('_', '-')}"], name


def test_library_and_command_defaults_differ_only_where_the_model_says():
    """The command asks for 200 stability resamples; a library caller gets 0 (not measured)."""
    differ = {f.name: f.metadata["cli_default"] for f in dataclasses.fields(AnalysisOptions)
              if "cli_default" in f.metadata}
    assert differ == {"stability": 200}
    assert AnalysisOptions().stability == 0


def test_a_generated_option_is_validated_by_the_model(tmp_path):
    """An out-of-range value stops at the model's check: one line, exit 2, no store created."""
    db = tmp_path / "a.db"
    r = CliRunner().invoke(app, ["analyze", "--window", "0", "--db", f"sqlite:///{db}"])
    assert r.exit_code == 2, r.output
    assert "--window 0: must be >= 1" in r.output
    assert not db.exists()
