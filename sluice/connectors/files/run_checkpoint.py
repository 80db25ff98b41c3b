"""The checkpoint of a file run: a small JSON state file saying how far each input is done, and how much of
the outputs belongs to that -- written atomically, so a run killed at any moment resumes from the last one.

What it holds (``State``): per input file its identity when first read (size, modification time: an input
that changed since is refused, its offsets would mean other rows), the row its done prefix ends at (the
ledger's watermark: every row before it has its output or dead letter), and for JSON lines the byte where
that row starts; per output the durable length (JSON lines: bytes; Parquet: the part files closed); a
fingerprint of the pipeline settings that shape outputs (a changed model or codec must not resume into
outputs made by another).

The order that makes a checkpoint safe (:class:`Checkpoint`): the source offers its positions every
``runtime.commit_interval_ms`` (the at-least-once strategy's ``store``) and at the end (``commit``). Every
row below an offered position has been written to the sink's files, but not necessarily made durable: the
state is saved only once the sink says the outputs written up to the moment of the offer are durable (a
JSON-lines file fsynced, a Parquet part closed and renamed). So a saved checkpoint never claims a row whose
output could be lost, and after a crash the outputs are cut back to what it claims: every row after it is
redone, none before it (duplicates only from rows finished out of order before the checkpoint).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

VERSION = 1


class CheckpointProblem(Exception):
    """The checkpoint cannot be read or does not fit this run; one line for the user."""


@dataclass(frozen=True)
class InputState:
    """How far one input file is done."""

    size: int  # bytes when the run first read it
    mtime_ns: int
    row: int = 0  # rows (Parquet) or lines (JSON lines) before this one are done
    byte: int = 0  # JSON lines: where line ``row`` starts
    end: int | None = None  # the row after the last one, once known (Parquet: at once; JSON lines: at the end)

    @property
    def complete(self) -> bool:
        return self.end is not None and self.row >= self.end


@dataclass(frozen=True)
class State:
    fingerprint: str  # of the settings that shape outputs (engine, codec, sink.output)
    inputs: dict[str, InputState] = field(default_factory=dict)  # by absolute path
    outputs: dict[str, Any] = field(default_factory=dict)  # the sink's durable positions (sink.py)

    @property
    def complete(self) -> bool:
        return bool(self.inputs) and all(s.complete for s in self.inputs.values())


def load(path: Path) -> State | None:
    """The saved state, or None when there is none. Raises CheckpointProblem when it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CheckpointProblem(f"cannot read the checkpoint {path}: {err.strerror or err}") from None
    try:
        doc = json.loads(text)
        if doc.get("version") != VERSION:
            raise ValueError(f"version {doc.get('version')!r}, expected {VERSION}")
        inputs = {name: InputState(**s) for name, s in doc["inputs"].items()}
        return State(fingerprint=str(doc["fingerprint"]), inputs=inputs, outputs=dict(doc.get("outputs", {})))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointProblem(f"the checkpoint {path} is not one Sluice wrote ({err}); delete it (and the outputs) "
                                "to start over") from None


def save(path: Path, state: State) -> None:
    """Write ``state`` atomically: a temporary file beside it, fsynced, renamed over the old one, and the
    directory fsynced (the rename itself survives a power cut)."""
    doc = {"version": VERSION, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "fingerprint": state.fingerprint, "complete": state.complete,
           "inputs": {name: asdict(s) for name, s in state.inputs.items()}, "outputs": state.outputs}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableOutputs(Protocol):
    """What the checkpoint asks of a file sink (sluice/connectors/files/file_sink.py)."""

    @property
    def num_written(self) -> int:
        """Outputs and dead letters handed to the files so far (monotonic)."""

    def sync(self) -> tuple[int, dict[str, Any]]:
        """Make durable what is due (fsync; close a Parquet part past its roll interval) and return
        (``num_written`` as of the last durable point, the durable positions to save)."""


class Checkpoint:
    """Saves the state of a file run once what it claims is durable (see the module doc). Intake thread only.

    ``outputs`` is the file sink, or None when the outputs go to Kafka (each delivered record is durable on
    the brokers already, so every offer is saved at once).
    """

    def __init__(self, path: Path, state: State, outputs: DurableOutputs | None = None) -> None:
        self.path, self.outputs = path, outputs
        self.state = state  # the last one saved (or loaded)
        self._pending: deque[tuple[int, dict[str, InputState]]] = deque()  # (num_written at offer, inputs)
        self.num_saved = 0

    def offer(self, inputs: dict[str, InputState]) -> None:
        """The inputs' positions now; saved as soon as the outputs written so far are durable."""
        if self.outputs is None:
            self._save(inputs, {})
            return
        mark = self.outputs.num_written
        if self._pending and self._pending[-1][0] == mark:
            self._pending.pop()  # nothing written since: the newer positions claim the same outputs
        self._pending.append((mark, inputs))
        durable, positions = self.outputs.sync()
        latest = None
        while self._pending and self._pending[0][0] <= durable:
            latest = self._pending.popleft()[1]
        if latest is not None:
            self._save(latest, positions)

    def _save(self, inputs: dict[str, InputState], outputs: dict[str, Any]) -> None:
        state = State(self.state.fingerprint, {**self.state.inputs, **inputs}, outputs or self.state.outputs)
        if state == self.state and self.num_saved:
            return
        try:
            save(self.path, state)
        except OSError as err:  # a full disk, say: the last checkpoint saved stays the one a restart uses
            raise CheckpointProblem(f"cannot save the checkpoint {self.path}: {err.strerror or err}") from None
        self.state = state
        self.num_saved += 1
