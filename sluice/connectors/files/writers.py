"""Writing outputs to files: JSON lines appended to one file, or Parquet into a directory of part files.

Both say what is *durable* -- what survives a crash -- and start from a checkpoint's durable positions:

* :class:`JsonLinesWriter` appends lines; they are durable once ``sync`` has fsynced them. Opened at a
  checkpoint's length it cuts the file back to it (lines written after that checkpoint are redone, and a
  line torn by a crash goes with them); opened without one it appends after the last complete line.
* :class:`ParquetPartsWriter` writes rows into ``part-NNNNN.parquet`` files, each written as
  ``.part-NNNNN.parquet.tmp`` and renamed once closed (footer written, fsynced), so a reader of the
  directory never sees a torn file. A part's rows are durable once it is closed: after ``rows_per_file``
  rows, or when ``roll_interval_s`` has passed at a ``sync``, or at the end. Opened from a checkpoint, it
  deletes the parts the checkpoint does not list (closed after it: their rows are redone) and any
  temporary one. All parts share one schema: inferred from the first row group (nulls promoted to the
  types the values take), with the input file's types kept for the columns it has (int32 stays int32, a
  timestamp stays a timestamp, where the JSON round trip of a row is lossless).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from sluice.connectors.files.run_checkpoint import fsync_dir

log = logging.getLogger(__name__)

_PART = re.compile(r"^part-(\d{5,})\.parquet$")


class SchemaMismatch(Exception):
    """Rows that do not fit the output file's schema; one line for the user."""


class JsonLinesWriter:
    """One JSON-lines file, appended to. Intake thread only."""

    def __init__(self, path: Path, start_bytes: int | None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if start_bytes is not None:
            size = path.stat().st_size if path.exists() else 0
            if size < start_bytes:
                raise FileNotFoundError(f"{path} holds {size} bytes, but the checkpoint counts {start_bytes}")
            with open(path, "ab") as f:  # created when missing
                f.truncate(start_bytes)
        else:
            _drop_torn_line(path)
        self.path = path
        self._f = open(path, "ab")  # noqa: SIM115 - closed by close()
        self.position = self._f.tell()  # bytes written, buffered ones included

    def write(self, lines: list[bytes]) -> None:
        data = b"\n".join(lines) + b"\n"
        self._f.write(data)
        self.position += len(data)

    def sync(self) -> int:
        """Everything written is durable now; returns the file's length."""
        self._f.flush()
        os.fsync(self._f.fileno())
        return self.position

    def close(self) -> None:
        if not self._f.closed:
            self.sync()
            self._f.close()


def _drop_torn_line(path: Path) -> None:
    """A file ending in the middle of a line (a crash while writing it) is cut back after its last newline."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            cut = f.read(end - start).rfind(b"\n")
            if cut >= 0:
                end = start + cut + 1
                break
            end = start
        if end < size:
            log.warning("%s ended in a torn line (%d bytes after its last newline): cut off", path, size - end)
            f.truncate(end)


class ParquetPartsWriter:
    """A directory of Parquet part files. Intake thread only."""

    def __init__(self, directory: Path, kept_parts: list[str] | None, *, rows_per_file: int, roll_interval_s: float,
                 row_group_rows: int, input_schema: Any, clock: Callable[[], float]) -> None:
        """``kept_parts``: the parts a checkpoint lists (the others are deleted); None: a fresh output, which
        must not hold part files already (the caller checked, or removed them)."""
        import pyarrow.parquet as pq

        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.clock = directory, clock
        self.rows_per_file, self.roll_interval_s, self.row_group_rows = rows_per_file, roll_interval_s, row_group_rows
        self.input_schema = input_schema
        keep = set(kept_parts or ())
        for p in directory.iterdir():
            if (_PART.match(p.name) and p.name not in keep) or (p.name.startswith(".part-") and p.name.endswith(".tmp")):
                log.info("removing %s: written after the checkpoint, its rows are redone", p)
                p.unlink()
        missing = [name for name in keep if not (directory / name).exists()]
        if missing:
            raise FileNotFoundError(f"{directory / missing[0]} is listed in the checkpoint but missing")
        self.parts: list[str] = sorted(keep, key=_part_index)
        self.schema = pq.read_schema(directory / self.parts[-1]) if self.parts else None
        self._next_index = _part_index(self.parts[-1]) + 1 if self.parts else 0
        self._writer: Any = None  # pq.ParquetWriter of the open part
        self._tmp: Path | None = None
        self._buffer: list[Any] = []  # pa.Table per write, not yet in a row group
        self._buffered_rows = self._part_rows = 0
        self._opened_s: float | None = None  # when the open part took its first row
        self.num_rows = 0  # rows written, open part included

    def write(self, lines: list[bytes]) -> None:
        """One JSON object per line (the codec's output records). Raises SchemaMismatch."""

        table = _table([msgspec.json.decode(line) for line in lines])
        if self.schema is not None:
            table = _conform(table, self.schema)
        self.num_rows += table.num_rows
        while table.num_rows:
            room = self.rows_per_file - self._part_rows - self._buffered_rows
            head, table = table.slice(0, room), table.slice(room)
            self._buffer.append(head)
            self._buffered_rows += head.num_rows
            if self._opened_s is None:
                self._opened_s = self.clock()
            if self._buffered_rows >= self.row_group_rows:
                self._write_row_group()
            if self._part_rows + self._buffered_rows >= self.rows_per_file:
                self.roll()

    @property
    def is_open(self) -> bool:
        """Rows are written that are not in a closed part yet."""
        return self._writer is not None or self._buffered_rows > 0

    def roll_due(self) -> bool:
        return self._opened_s is not None and self.clock() - self._opened_s >= self.roll_interval_s

    def roll(self) -> bool:
        """Close the open part (its rows are durable once this returns). False when none was open."""
        if self._buffered_rows:
            self._write_row_group()
        if self._writer is None:
            return False
        self._writer.close()
        assert self._tmp is not None
        with open(self._tmp, "rb") as f:
            os.fsync(f.fileno())
        name = f"part-{self._next_index:05d}.parquet"
        os.replace(self._tmp, self.directory / name)
        fsync_dir(self.directory)
        self.parts.append(name)
        self._next_index += 1
        self._writer, self._tmp, self._part_rows, self._opened_s = None, None, 0, None
        return True

    def positions(self) -> dict[str, Any]:
        return {"parts": list(self.parts)}

    def close(self) -> None:
        self.roll()

    def _write_row_group(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.schema is None:  # the first row group fixes the schema of every part
            table = pa.concat_tables(self._buffer, promote_options="permissive")
            self.schema = _with_input_types(table.schema, self.input_schema, table)
            table = _conform(table, self.schema)
        else:  # what was buffered before the schema was fixed is cast to it now
            table = pa.concat_tables([t if t.schema == self.schema else _conform(t, self.schema)
                                      for t in self._buffer])
        self._buffer, self._buffered_rows = [], 0
        if self._writer is None:
            self._tmp = self.directory / f".part-{self._next_index:05d}.parquet.tmp"
            self._writer = pq.ParquetWriter(self._tmp, self.schema)
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self._part_rows += table.num_rows


def _table(rows: list[Any]) -> Any:
    """The rows as an Arrow table; SchemaMismatch naming the first field whose values do not share a type."""
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        for name in dict.fromkeys(k for row in rows for k in row):
            try:
                pa.array([row.get(name) for row in rows])
            except (pa.ArrowInvalid, pa.ArrowTypeError) as field_err:
                raise SchemaMismatch(f"field {name!r} holds values of different types ({field_err}); the results "
                                     "must keep one type per field") from None
        raise SchemaMismatch(f"outputs cannot become Parquet rows: {err}") from None


def _part_index(name: str) -> int:
    m = _PART.match(name)
    return int(m.group(1)) if m else -1


def _conform(table: Any, schema: Any) -> Any:
    """``table`` in ``schema``: columns cast, missing ones null; a column the schema lacks, or a value that
    does not cast, raises SchemaMismatch naming the column."""
    import pyarrow as pa

    extra = [n for n in table.column_names if schema.get_field_index(n) < 0]
    if extra:
        raise SchemaMismatch(f"outputs have a field {extra[0]!r} that the output file's schema lacks (the first "
                             "rows written had none); the results must have the same fields throughout")
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        try:
            columns.append(table.column(f.name).cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
            raise SchemaMismatch(f"field {f.name!r} is {f.type} in the output file, but outputs now hold "
                                 f"{table.schema.field(f.name).type} ({err}); the results must keep one type "
                                 "per field") from None
    return pa.Table.from_arrays(columns, schema=schema)


def _with_input_types(inferred: Any, input_schema: Any, table: Any) -> Any:
    """The inferred schema, with each column the input file has taking the input's type where a row's
    JSON round trip loses nothing (integers of any width, floats, booleans, timestamps, dates, decimals)."""
    import pyarrow as pa
    import pyarrow.types as t

    if input_schema is None:
        return inferred
    fields = []
    for f in inferred:
        i = input_schema.get_field_index(f.name)
        wanted = input_schema.field(i).type if i >= 0 else None
        lossless = wanted is not None and (t.is_integer(wanted) or t.is_floating(wanted) or t.is_boolean(wanted)
                                           or t.is_timestamp(wanted) or t.is_date(wanted) or t.is_decimal(wanted))
        if lossless and wanted != f.type:
            try:
                table.column(f.name).cast(wanted)
                f = f.with_type(wanted)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
        fields.append(f)
    return pa.schema(fields)
