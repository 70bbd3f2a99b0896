"""`twoclocks db`: migrate the store forward or back and show its revision."""

from typing import Annotated

import typer

from twoclocks_cli.options import DbOption, JsonOption

app = typer.Typer(
    help="Database schema: upgrade, current revision, downgrade.", no_args_is_help=True
)


def _say(as_json: bool, text: str, **data) -> None:
    """One line for a person, or one JSON object (the masked URL, never a password)."""
    from twoclocks_cli.render.jsonout import print_json

    if as_json:
        print_json(data)
    else:
        typer.echo(text)


@app.command()
def upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Migrate the database forward (to head by default)."""
    from twoclocks_cli.store.engine import make_engine, mask_url, resolve_url
    from twoclocks_cli.store.migrate import current_revision
    from twoclocks_cli.store.migrate import upgrade as do_upgrade

    engine = make_engine(resolve_url(db))
    before = current_revision(engine)
    do_upgrade(engine, revision)
    after = current_revision(engine)
    _say(as_json, f"{mask_url(engine.url)}: {before or 'empty'} -> {after}",
         url=mask_url(engine.url), before=before, after=after)


@app.command()
def current(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Print the database's schema revision and this twoclocks' head."""
    from twoclocks_cli.store.engine import make_engine, mask_url, resolve_url
    from twoclocks_cli.store.migrate import current_revision, head_revision

    engine = make_engine(resolve_url(db))
    rev = current_revision(engine)
    head = head_revision()
    state = "up to date" if rev == head else ("empty" if rev is None else "out of date")
    _say(as_json, f"{mask_url(engine.url)}: revision {rev or 'none'} (head {head}, {state})",
         url=mask_url(engine.url), revision=rev, head=head, state=state)


@app.command()
def downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, or 'base' for empty.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Migrate the database back to REVISION."""
    from twoclocks_cli.store.engine import make_engine, mask_url, resolve_url
    from twoclocks_cli.store.migrate import current_revision
    from twoclocks_cli.store.migrate import downgrade as do_downgrade

    engine = make_engine(resolve_url(db))
    before = current_revision(engine)
    do_downgrade(engine, revision)
    after = current_revision(engine) or "base"
    _say(as_json, f"{mask_url(engine.url)}: {before or 'empty'} -> {after}",
         url=mask_url(engine.url), before=before, after=after)
