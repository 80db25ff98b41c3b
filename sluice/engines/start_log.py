"""What an engine says while it starts: one log line per phase, with its duration.

A model's start takes from a second to minutes (a first export to ONNX, compiling kernels, reading gigabytes
of weights), and a user watching ``sluice run`` must see which phase it is in. Each phase ends with one line::

    llm smollm2-135m: read weights and tokenizer in 0.3 s (GGUF, 272 tensors, 98 MB)

A phase that can be long is announced when it begins as well (``announce=``), and one with a known amount of
work logs its progress at most every :data:`PROGRESS_EVERY_S` (``Phase.progress``). Nothing here changes what
the engine does; a phase that raises logs nothing (the error is the caller's one line).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

PROGRESS_EVERY_S = 5.0

log = logging.getLogger("sluice.start")


class Phase:
    """One running phase: the caller may add a detail to its closing line and report progress."""

    def __init__(self, start_log: StartLog, name: str, started_s: float) -> None:
        self._log = start_log
        self.name = name
        self.started_s = started_s
        self.detail = ""  # appended to the closing line in parentheses
        self._next_progress_s = started_s + PROGRESS_EVERY_S

    def progress(self, done: int, total: int, unit: str) -> None:
        """``done`` of ``total`` ``unit`` so far; logged when :data:`PROGRESS_EVERY_S` has passed since the
        phase began or since the last progress line."""
        now = time.monotonic()
        if now < self._next_progress_s or total <= 0:
            return
        self._next_progress_s = now + PROGRESS_EVERY_S
        self._log.say("%s: %d of %d %s (%.0f%%, %.0f s)", self.name, done, total, unit, 100.0 * done / total,
                      now - self.started_s)


class StartLog:
    """The phases of one engine's start, logged under ``subject`` (``llm smollm2-135m``)."""

    def __init__(self, subject: str) -> None:
        self.subject = subject

    def say(self, message: str, *args: object) -> None:
        log.info(f"%s: {message}", self.subject, *args)

    @contextmanager
    def phase(self, name: str, announce: str | None = None) -> Iterator[Phase]:
        """Time ``name``; ``announce``: a line logged as it begins (for phases that can take long)."""
        if announce:
            self.say("%s", announce)
        phase = Phase(self, name, time.monotonic())
        yield phase
        seconds = time.monotonic() - phase.started_s
        detail = f" ({phase.detail})" if phase.detail else ""
        self.say("%s in %.1f s%s", name, seconds, detail)
