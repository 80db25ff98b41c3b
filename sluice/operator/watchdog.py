"""The progress watchdog: notices a part of the operator that owes work and has stopped getting it done.

A process can be alive and useless: an engine call that never returns, a poll loop wedged in a callback, a
producer whose delivery reports stopped coming. Liveness that only asks "does the HTTP thread answer" never
sees those, so nothing restarts them. The runner watches three parts instead, each through a *probe*:

* ``poll loop``  -- owes a turn whenever the run is going; progress: the turns it made;
* ``engine``     -- owes work while records are queued for it or a batch (an LLM step) runs; progress: the
  batches and steps it finished;
* ``delivery``   -- owes reports while outputs wait for the brokers' acknowledgement; progress: the outputs
  acknowledged.

A part is *stalled* once it has owed work for longer than ``stall_after_s`` and its progress counter has not
moved for that long. It recovers the moment its counter moves or it owes nothing. A slow part that gets
anything done within the bound is never stalled: the bound must exceed the longest batch (or LLM step),
and, for deliveries, the longest broker outage the operator should ride out without a restart.

Guarantees: pure (the clock is passed in); :meth:`Watchdog.check` may be called from any thread (the HTTP
server's for ``/healthz``, the poll loop's for logs and metrics), so a wedged poll loop is still seen; a
probe is a cheap read of counters the owning threads write, never a lock another thread may hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    """One part's state as read now."""

    owed: bool  # work is waiting on this part
    progress: int  # grows whenever the part gets some of it done
    waiting: str = ""  # what waits, for the reason ("37 records queued"); empty when unknown


@dataclass(frozen=True)
class Stall:
    """A part that owes work and has made no progress for ``for_s`` seconds."""

    part: str
    for_s: float
    waiting: str

    @property
    def reason(self) -> str:
        what = f" with {self.waiting}" if self.waiting else ""
        return f"{self.part}: no progress for {self.for_s:.0f} s{what}"


@dataclass
class _Seen:
    progress: int
    moved_s: float  # when the progress counter last moved (or the part was first seen)
    owed_since_s: float | None  # since when it has owed work, without a break


class Watchdog:
    """Judges the probes against ``stall_after_s``. Thread-safe."""

    def __init__(self, probes: Mapping[str, Callable[[], Probe]], stall_after_s: float,
                 clock: Callable[[], float]) -> None:
        if stall_after_s <= 0:
            raise ValueError("stall_after_s must be positive")
        self.probes = dict(probes)
        self.stall_after_s = stall_after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}
        self._reported: dict[str, Stall] = {}

    @property
    def parts(self) -> list[str]:
        return list(self.probes)

    def check(self) -> list[Stall]:
        """The stalled parts now, in probe order (empty: healthy)."""
        with self._lock:
            now = self.clock()
            stalls = []
            for part, probe in self.probes.items():
                stall = self._judge(part, probe(), now)
                if stall is not None:
                    stalls.append(stall)
            return stalls

    def changes(self) -> tuple[list[Stall], list[Stall]]:
        """Parts newly stalled, and parts recovered (as they were when last reported), since the last call:
        for one caller that logs transitions (the poll loop's tick)."""
        stalls = {s.part: s for s in self.check()}
        with self._lock:
            new = [s for part, s in stalls.items() if part not in self._reported]
            recovered = [s for part, s in self._reported.items() if part not in stalls]
            self._reported = stalls
        return new, recovered

    def _judge(self, part: str, probe: Probe, now: float) -> Stall | None:
        seen = self._seen.get(part)
        if seen is None:
            seen = self._seen[part] = _Seen(probe.progress, now, None)
        elif probe.progress != seen.progress:
            seen.progress, seen.moved_s = probe.progress, now
        if not probe.owed:
            seen.owed_since_s = None
            return None
        if seen.owed_since_s is None:
            seen.owed_since_s = now
        quiet_s = now - max(seen.moved_s, seen.owed_since_s)
        return Stall(part, quiet_s, probe.waiting) if quiet_s > self.stall_after_s else None
