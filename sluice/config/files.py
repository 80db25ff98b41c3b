"""``source.file`` and ``sink.file``: JSON-lines and Parquet files on a local disk (sluice/connectors/files/).

Paths are relative to the pipeline file's directory. A file run is bounded: it ends once every input row
has its output, and it resumes from its checkpoint after SIGTERM or a crash (at-least-once, docs/bounded-runs.md).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

from pydantic import Field, model_validator

from sluice.config.section import Section

FileFormat = Literal["jsonl", "parquet"]

_SUFFIXES: dict[str, FileFormat] = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def format_of(path: str) -> FileFormat | None:
    """The format a path's extension names (``*.jsonl``, ``data/*.parquet``...), or None."""
    return _SUFFIXES.get(PurePath(path).suffix.lower())


class FileSource(Section):
    # A file or a glob ("corpus/*.parquet", "logs/**/*.jsonl"); matching files are read one after another,
    # in name order, each up to the size it had when the run started.
    path: str = Field(min_length=1)
    """A JSON-lines or Parquet file, or a glob of them."""
    format: FileFormat | None = None
    """`jsonl` or `parquet` (default: from the extension)."""
    batch_rows: int = Field(default=1024, ge=1, le=1_000_000)
    """Rows read at a time: a Parquet record batch, or JSON lines; never a whole file."""
    checkpoint: str | None = Field(default=None, min_length=1)
    """The file that records how far the inputs are done, written atomically every
    `runtime.commit_interval_ms` (default: beside the file sink's output; required with a Kafka sink)."""

    @model_validator(mode="after")
    def _known_format(self) -> FileSource:
        if self.format is None and format_of(self.path) is None:
            raise ValueError(f"cannot tell the format of {self.path!r} from its extension; set format: jsonl or "
                             "format: parquet")
        return self

    @property
    def file_format(self) -> FileFormat:
        fmt = self.format or format_of(self.path)
        assert fmt is not None  # checked by the validator
        return fmt


class FileSink(Section):
    # jsonl: the output file. parquet: a directory of part files (part-00000.parquet, ...), read as one table
    # by pyarrow, pandas, DuckDB or Spark. Either way one row per input row that did not fail; the failed
    # ones go to the dead-letter file beside it (dead_letter.path).
    path: str = Field(min_length=1)
    """A JSON-lines file, or a directory of Parquet part files."""
    format: FileFormat | None = None  # default: from the extension, else the source file's format
    """`jsonl` or `parquet` (default: from the extension, else the source file's format)."""
    overwrite: bool = False
    """Replace an output that exists when no checkpoint says how far it got (or the checkpoint is another
    pipeline's); `false` stops with an error instead."""
    rows_per_file: int = Field(default=1_000_000, ge=1)
    """Parquet: start a new part file after this many rows (a part's rows are durable once it is closed)."""
    roll_interval_s: float = Field(default=60.0, gt=0)
    """Parquet: close the open part file at least this often."""
    row_group_rows: int = Field(default=10_000, ge=1)
    """Parquet: rows per row group (what readers load at a time)."""

    def resolved_format(self, source_format: FileFormat | None) -> FileFormat:
        """The output's format: ``format``, else the extension's, else the source file's, else jsonl."""
        return self.format or format_of(self.path) or source_format or "jsonl"


def default_dead_letter_path(output: str) -> str:
    """``out.jsonl`` -> ``out.dead-letters.jsonl``; a Parquet output ``out.parquet`` -> the same name."""
    p = PurePath(output)
    return str(p.with_name(f"{p.stem if p.suffix else p.name}.dead-letters.jsonl"))


def default_checkpoint_path(output: str) -> str:
    """``out.parquet`` -> ``out.parquet.checkpoint``, beside the output."""
    p = PurePath(output)
    return str(p.with_name(p.name + ".checkpoint"))
