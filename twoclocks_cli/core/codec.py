"""The one codec of the project's documents (analyses, schedules, probes, options): a dataclass
that inherits `Document` becomes a JSON-ready dict, and a dict becomes the dataclass, through
pydantic's `TypeAdapter` of its class. Where a document's shape differs from the fields', the
class says so in a pydantic serializer beside its fields; nothing writes its keys by hand."""

from __future__ import annotations

from functools import cache

from pydantic import TypeAdapter, ValidationError

from twoclocks_cli.core.errors import ConfigError


@cache
def adapter(cls) -> TypeAdapter:
    """Pydantic's reader and writer of dataclass `cls` (built once: building is slow)."""
    return TypeAdapter(cls)


class Document:
    """A dataclass that is (part of) a document: pydantic writes and reads it. A key the
    document lacks takes its field's default; one that no field names is ignored."""

    def to_json(self) -> dict:
        return adapter(type(self)).dump_python(self, by_alias=True)

    @classmethod
    def from_json(cls, data: dict | None):
        try:
            return adapter(cls).validate_python(data or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or cls.__name__
            raise ConfigError(f"{cls.__name__} {where}: {first['msg']}") from None
