"""Hooks that put other trainers' runs into the store while they train.

TRL: `twoclocks_cli.integrations.trl.TwoClocksCallback`.
"""
