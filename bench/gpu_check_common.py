"""Plumbing shared by the GPU check's steps: child arguments, rows written as they come, time, bandwidth.

Each step of ``bench/gpu_check.py`` is a child process with a hard timeout. A child learns its device,
profile (``full`` shapes on the GPU, ``tiny`` in the CPU dry run) and time budget from
:func:`child_args`, and records its results in :class:`Rows`: every row it plans is written at once with
the reason it has not been measured yet, then replaced as it is measured or fails. The file is rewritten
after every change, so a child killed at its timeout still leaves each row measured or with a reason.

A row is a flat JSON object: ``name`` (unique in its step), ``kind`` (rows of one kind share a table),
``reason`` (None when measured, else one line saying why not) and the measured values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _path in (str(ROOT), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import gpu_check_guard  # noqa: E402

gpu_check_guard.install_if_asked()  # before any heavy import of a child (see gpu_check_guard)

Row = dict[str, Any]
NOT_REACHED = "not reached: the step's time ran out before this row"


class Clock:
    """A deadline; each part asks for at most ``cap_s`` and leaves ``reserve_s`` for what comes after it."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def grant(self, cap_s: float, reserve_s: float = 0.0) -> float:
        return max(0.0, min(cap_s, self.deadline - time.monotonic() - reserve_s))

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def one_line(err: BaseException) -> str:
    """An exception as one line: its class and the first line of its message, at most 240 characters."""
    text = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    return line if len(line) <= 240 else line[:237] + "..."


class Rows:
    """A step's rows in the order planned, saved to ``path`` (JSON list) after every change."""

    def __init__(self, path: Path, kind_by_name: dict[str, str]) -> None:
        self.path = path
        self._rows: dict[str, Row] = {name: {"name": name, "kind": kind, "reason": NOT_REACHED}
                                      for name, kind in kind_by_name.items()}
        self._save()

    def measured(self, name: str, kind: str, **values: Any) -> None:
        self._rows[name] = {"name": name, "kind": kind, "reason": None, **values}
        self._save()

    def reason(self, name: str, text: str, **values: Any) -> None:
        kind = self._rows.get(name, {}).get("kind", "note")
        self._rows[name] = {"name": name, "kind": kind, "reason": text, **values}
        self._save()

    def reason_for_pending(self, text: str) -> None:
        """Give every row still not reached this reason (e.g. what stopped the step)."""
        for name, row in self._rows.items():
            if row["reason"] == NOT_REACHED:
                self._rows[name] = {**row, "reason": text}
        self._save()

    @contextlib.contextmanager
    def attempt(self, name: str) -> Iterator[None]:
        """Run a measurement; if it raises, the row gets the error as its reason and the step goes on."""
        try:
            yield
        except Exception as err:  # a bench step reports any failure as the row's reason
            self.reason(name, one_line(err))

    def all(self) -> list[Row]:
        return list(self._rows.values())

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.all(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)  # a reader never sees half a file


def child_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for this step's rows")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run")
    parser.add_argument("--profile", choices=("full", "tiny"), default="full", help="tiny: dry-run shapes")
    parser.add_argument("--budget-s", type=float, default=120.0, help="this step's time; rows past it get a reason")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def synchronize(torch: Any, device: str) -> Callable[[], None]:
    """A function that waits for the device (a no-op on the CPU)."""
    if str(device).startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def median_ms(fn: Callable[[], object], sync: Callable[[], None], min_time_s: float, max_reps: int,
              min_reps: int = 3) -> float:
    """Median wall time of one call in ms, after one warm-up call, each call waited for."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (time.perf_counter() - start < min_time_s or len(times) < min_reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth_bytes_per_s(torch: Any, device: str, num_bytes: int) -> float:
    """Bytes read plus bytes written per second by a device-to-device copy of ``num_bytes``.

    The memory floor of a step that reads B bytes is B over this rate: a copy moves its bytes once each
    way, which is what the memory system can sustain in total.
    """
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    sync = synchronize(torch, device)
    ms = median_ms(lambda: dst.copy_(src), sync, min_time_s=0.2, max_reps=50, min_reps=5)
    return 2 * num_bytes / (ms / 1e3)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
