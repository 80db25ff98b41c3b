"""The file source: JSON-lines or Parquet files read one after another, the operator's
:class:`~sluice.operator.ports.Source` -- so intake, batching, the engine thread, the emitter, the ledger and
the delivery strategy work on files exactly as on Kafka.

Each input file is a partition (its topic is the file's path, as the pipeline names it relative to its own
directory) and each row an offset (JSON lines: the line number from 0; Parquet: the row index). Files are
read in name order, one at a time: only the one being read is *assigned* (backpressure then gives it the
whole in-flight budget); a file read to its end leaves the assignment while its last rows finish. The source
is bounded: once every file is read it is exhausted, and the runner stops when nothing is in flight.

The ledger's watermark is the checkpoint: ``store`` (every ``runtime.commit_interval_ms``) and ``commit``
(at the end) offer each file's done prefix to the checkpoint (checkpoint.py), which saves it once the
outputs are durable. A run stopped by SIGTERM, a crash or ``kill -9`` starts again from there. Intake thread
only, like every Source.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sluice.config.files import FileFormat
from sluice.connectors.files.readers import JsonLinesReader, ParquetReader, Reader
from sluice.connectors.files.run_checkpoint import Checkpoint, CheckpointProblem, InputState
from sluice.operator.ports import PartitionsCallback, SourceFailed
from sluice.operator.record import InputRecord, TopicPartition

log = logging.getLogger(__name__)


@dataclass
class InputFile:
    """One input file of the run."""

    path: Path
    tp: TopicPartition  # (its name, 0): the name is what checkpoints and dead letters call it
    state: InputState  # how far it was done when the run started


class FileSource:
    """Reads the input files (see the module doc)."""

    bounded = True

    def __init__(self, files: list[InputFile], fmt: FileFormat, *, batch_rows: int, max_line_bytes: int,
                 checkpoint: Checkpoint, clock: Callable[[], float] = time.monotonic) -> None:
        self.files, self.format = files, fmt
        self.batch_rows, self.max_line_bytes = batch_rows, max_line_bytes
        self.checkpoint, self._clock = checkpoint, clock
        self.assignment: set[TopicPartition] = set()
        self._paused: set[TopicPartition] = set()
        self._states = {f.tp: f.state for f in files}  # the latest known, per file
        self._handed: dict[TopicPartition, deque[tuple[int, int]]] = {}  # (offset, byte) of rows not yet done
        self._next: dict[TopicPartition, tuple[int, int]] = {}  # (offset, byte) of the next row to hand out
        self._todo = deque(f for f in files if not f.state.complete)
        self._reader: Reader | None = None
        self._current: InputFile | None = None
        self._on_assign: PartitionsCallback | None = None
        self._num_rows_read = self._num_bytes_read = 0  # this run, for the JSON-lines row estimate

    # ------------------------------------------------------------------------------------ reading

    def subscribe(self, on_assign: PartitionsCallback, on_revoke: PartitionsCallback,
                  on_lost: PartitionsCallback) -> None:
        self._on_assign = on_assign
        done = [f.tp.topic for f in self.files if f.state.complete]
        if done:
            log.info("%d of %d input files are done already (checkpoint %s)", len(done), len(self.files),
                     self.checkpoint.path)

    def poll(self, max_records: int, timeout_s: float) -> list[InputRecord]:
        if self._reader is None and not self._open_next():
            time.sleep(timeout_s)  # exhausted: the runner waits for what is in flight
            return []
        assert self._reader is not None and self._current is not None
        tp = self._current.tp
        if tp in self._paused:
            time.sleep(timeout_s)
            return []
        try:
            rows = self._reader.read(max_records)
        except Exception as err:  # an unreadable block or row group: nothing past it can be read
            raise SourceFailed(f"cannot read {tp.topic}: {type(err).__name__}: {err}") from None
        now = self._clock()
        handed = self._handed.setdefault(tp, deque())
        handed.extend((r.offset, r.byte) for r in rows)
        self._next[tp] = self._reader.next_position()
        if rows:
            self._num_rows_read += len(rows)
            self._num_bytes_read += self._next[tp][1] - rows[0].byte
        records = [InputRecord(r.value, None, [], tp, r.offset, None, now) for r in rows]
        if self._reader.eof:
            self._finish_current()
        return records

    def _open_next(self) -> bool:
        """Open the next file not done yet and assign it; False when every file has been read."""
        while self._todo:
            f = self._todo.popleft()
            s = f.state
            try:
                if self.format == "parquet":
                    reader: Reader = ParquetReader(f.path, s.row, self.batch_rows)
                else:
                    reader = JsonLinesReader(f.path, s.row, s.byte, s.size, self.max_line_bytes)
            except Exception as err:
                raise SourceFailed(f"cannot open {f.tp.topic}: {type(err).__name__}: {err}") from None
            self._reader, self._current = reader, f
            self._next[f.tp] = reader.next_position()
            self.assignment = {f.tp}
            log.info("reading %s from row %d", f.tp.topic, s.row)
            if self._on_assign is not None:
                self._on_assign([f.tp])
            return True
        return False

    def _finish_current(self) -> None:
        assert self._reader is not None and self._current is not None
        tp = self._current.tp
        self._reader.close()
        end = self._next[tp][0]
        self._states[tp] = replace(self._states[tp], end=end)
        self._reader = self._current = None
        self.assignment = set()
        self._paused.discard(tp)

    def is_exhausted(self) -> bool:
        return self._reader is None and not self._todo

    # --------------------------------------------------------------------------- checkpointing

    def store(self, watermarks: dict[TopicPartition, int]) -> None:
        """Offer each file's done prefix to the checkpoint (saved once the outputs are durable). A checkpoint
        that cannot be saved stops the run (SourceFailed): going on would redo ever more after a crash."""
        try:
            self.checkpoint.offer(self._positions(watermarks))
        except CheckpointProblem as err:
            raise SourceFailed(f"{err}; stopping: a restart resumes from the last checkpoint saved") from None

    def commit(self, watermarks: dict[TopicPartition, int]) -> None:
        """The last offer, at the end of the run (it is over either way: a failure is logged)."""
        try:
            self.checkpoint.offer(self._positions(watermarks))
        except CheckpointProblem as err:
            log.error("%s; a restart repeats what was done since the last checkpoint saved", err)

    def _positions(self, watermarks: dict[TopicPartition, int]) -> dict[str, InputState]:
        """Per file touched in this run: where its first row not done starts (the row after the watermark,
        or, with every row handed out done, the next row to read)."""
        out = {}
        for tp, handed in self._handed.items():
            mark = watermarks.get(tp)
            if mark is not None:
                while handed and handed[0][0] < mark:
                    handed.popleft()
            row, byte = handed[0] if handed else self._next[tp]
            state = self._states[tp]
            if (row, byte) != (state.row, state.byte):
                state = self._states[tp] = replace(state, row=row, byte=byte)
            out[tp.topic] = state
        return out

    # ------------------------------------------------------------------------------- the rest

    def uncommitted_since(self) -> float | None:
        return None  # a file job's progress is its own file, written at once

    def lag(self) -> dict[TopicPartition, int]:
        """Rows not read yet, per file not done: exact for Parquet; for JSON lines, estimated from the bytes
        left at this run's rows per byte (nothing until the first rows are read)."""
        rows_per_byte = self._num_rows_read / self._num_bytes_read if self._num_bytes_read else None
        left = {}
        for f in ([self._current] if self._current else []) + list(self._todo):
            state = self._states[f.tp]
            row, byte = self._next.get(f.tp, (state.row, state.byte))
            if self.format == "parquet" and state.end is not None:
                left[f.tp] = max(0, state.end - row)
            elif rows_per_byte is not None:
                left[f.tp] = round(max(0, state.size - byte) * rows_per_byte)
        return left

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        self._paused.update(tp for tp in tps if tp in self.assignment)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        self._paused.difference_update(tps)

    @property
    def paused_partitions(self) -> set[TopicPartition]:
        return self._paused

    def group_metadata(self) -> Any:
        raise SourceFailed("a file source has no consumer group (delivery: exactly_once needs a Kafka source)")

    def rewind(self, tps: Iterable[TopicPartition]) -> None:
        raise SourceFailed("a file source is never rewound (delivery: exactly_once needs a Kafka source)")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
