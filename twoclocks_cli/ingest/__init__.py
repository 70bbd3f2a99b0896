"""Import runs logged by other trainers (TRL, verl, CSV/JSONL tables) into the store.

Foreign formats are translated here, at the edge, into the store's own metric names, so the
clocks never see a foreign key.
"""

from twoclocks_cli.ingest.base import DEFAULT_MAX_BYTES, FORMATS, IngestOptions, ParsedLog
from twoclocks_cli.ingest.importer import IngestResult, ingest_files, parse_file
from twoclocks_cli.ingest.mapping import parse_map

__all__ = [
    "DEFAULT_MAX_BYTES", "FORMATS", "IngestOptions", "IngestResult", "ParsedLog",
    "ingest_files", "parse_file", "parse_map",
]
