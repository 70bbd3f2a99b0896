"""Pydantic field types built on `core.limits`' bounds. Apart from the limits themselves, so the
CLI's option layer reads those without importing pydantic at start-up."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from twoclocks_cli.core.limits import INT32_MAX

# at most INT32_MAX; give a lower bound on the field itself (a second Ge here would override it)
Int32 = Annotated[int, Field(le=INT32_MAX)]
