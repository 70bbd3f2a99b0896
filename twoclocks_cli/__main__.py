"""`python -m twoclocks_cli` is the `twoclocks` command."""

from twoclocks_cli.app import main

main()
