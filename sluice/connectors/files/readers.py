"""Reading one input file a chunk at a time: JSON lines by blocks of bytes, Parquet by record batches.

A reader hands out ``Row``s: the row's offset (JSON lines: its 0-based line number, so blank lines leave
gaps; Parquet: its row index), its value as the record codec reads it (the line's bytes; a Parquet row as a
JSON object), and for JSON lines the byte where the line starts (what a checkpoint resumes from). Memory
stays within one block or one record batch, whatever the file's size; a line longer than the codec's
``max_record_bytes`` is handed out cut just past that bound (so the codec refuses it, with its size) and the
rest of it is skipped unread into memory.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import msgspec

_BLOCK_BYTES = 1 << 20  # read at a time from a JSON-lines file


class Row(NamedTuple):
    offset: int
    value: bytes
    byte: int  # JSON lines: where the line starts; Parquet: 0


class Reader(Protocol):
    eof: bool  # every row up to the end was handed out

    def read(self, max_rows: int) -> list[Row]:
        """Up to ``max_rows`` rows, in order; fewer (or none) only at the end."""

    def next_position(self) -> tuple[int, int]:
        """(offset, byte) where the next row not yet handed out starts (at the end: past the last one)."""

    def close(self) -> None: ...


class JsonLinesReader:
    """Lines of ``path`` from byte ``start_byte`` (line ``start_line``) up to ``end_byte`` (its size when the run
    began: lines appended later are for the next run). Blank lines are skipped."""

    def __init__(self, path: Path, start_line: int, start_byte: int, end_byte: int, max_line_bytes: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._f.seek(start_byte)
        self._line, self._byte = start_line, start_byte  # the next line not yet split off, and where it starts
        self._left = max(0, end_byte - start_byte)  # bytes still to read from the file
        self._max = max_line_bytes
        self._carry = b""  # the start of a line whose end is in a later block
        self._skipping = False  # inside an overlong line: drop bytes up to its newline
        self._rows: deque[Row] = deque()  # split off, not yet handed out
        self.eof = False

    def read(self, max_rows: int) -> list[Row]:
        while len(self._rows) < max_rows and (self._left > 0 or self._carry):
            self._fill()
        n = min(max_rows, len(self._rows))
        out = [self._rows.popleft() for _ in range(n)]
        self.eof = not self._rows and self._left == 0 and not self._carry
        return out

    def next_position(self) -> tuple[int, int]:
        if self._rows:
            return self._rows[0].offset, self._rows[0].byte
        return self._line, self._byte

    def _fill(self) -> None:
        block = self._f.read(min(_BLOCK_BYTES, self._left)) if self._left > 0 else b""
        self._left = 0 if not block else self._left - len(block)
        data = self._carry + block
        if self._skipping:
            cut = data.find(b"\n")
            if cut < 0:
                self._byte += len(data)
                self._carry = b""
                if self._left == 0:  # the overlong line was the last, without a newline
                    self._skipping = False
                    self._line += 1
                return
            self._byte += cut + 1
            self._line += 1
            data = data[cut + 1:]
            self._skipping = False
        lines = data.split(b"\n")
        last = lines.pop()  # after the final newline: the start of a line, or b""
        line, byte, rows = self._line, self._byte, self._rows
        for text in lines:
            if text.strip():
                rows.append(Row(line, text[:-1] if text.endswith(b"\r") else text, byte))
            byte += len(text) + 1
            line += 1
        if self._left == 0 and last:  # the file's last line has no newline
            if last.strip():
                rows.append(Row(line, last[: self._max + 1], byte))
            byte += len(last)
            line += 1
            last = b""
        elif len(last) > self._max:  # an overlong line: hand out its head, skip the rest
            rows.append(Row(line, last[: self._max + 1], byte))
            self._skipping = True
            self._byte, self._line, self._carry = byte + len(last), line, b""
            return
        self._line, self._byte, self._carry = line, byte, last

    def close(self) -> None:
        self._f.close()


class ParquetReader:
    """Rows of a Parquet file from row ``start_row``, a record batch of ``batch_rows`` at a time (only the row
    groups from the one holding ``start_row`` on are read). Each row becomes one JSON object."""

    def __init__(self, path: Path, start_row: int, batch_rows: int) -> None:
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(path)
        meta = self._file.metadata
        self.num_rows = meta.num_rows
        group, first = 0, 0  # the row group holding start_row, and its first row
        while group < meta.num_row_groups and first + meta.row_group(group).num_rows <= start_row:
            first += meta.row_group(group).num_rows
            group += 1
        self._batches = self._file.iter_batches(batch_size=batch_rows, row_groups=range(group, meta.num_row_groups),
                                                use_threads=False)
        self._next = first  # offset of the first row in the next batch
        self._start, self._skip = start_row, start_row - first
        self._rows: deque[Row] = deque()
        self._encoder = msgspec.json.Encoder(enc_hook=_json_value)
        self.eof = start_row >= self.num_rows

    def read(self, max_rows: int) -> list[Row]:
        while len(self._rows) < max_rows and self._next < self.num_rows:
            batch = next(self._batches)
            offset, self._next = self._next, self._next + batch.num_rows
            if self._skip:  # rows of the first row group read that are done already
                cut = min(self._skip, batch.num_rows)
                self._skip -= cut
                batch, offset = batch.slice(cut), offset + cut
            encode = self._encoder.encode
            self._rows.extend(Row(offset + i, encode(row), 0) for i, row in enumerate(batch.to_pylist()))
        n = min(max_rows, len(self._rows))
        out = [self._rows.popleft() for _ in range(n)]
        self.eof = not self._rows and self._next >= self.num_rows
        return out

    def next_position(self) -> tuple[int, int]:
        return (self._rows[0].offset if self._rows else max(self._next, self._start)), 0

    def close(self) -> None:
        self._file.close()


def _json_value(value: Any) -> Any:
    """What msgspec cannot write itself (Parquet decimals, times, intervals...): as text."""
    return str(value)
