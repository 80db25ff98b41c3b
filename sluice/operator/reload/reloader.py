"""The reloader: builds and warms up the next engine beside the serving one, on a thread of its own.

One reload at a time, in phases owned here (:class:`Phase`)::

    IDLE --(a change settled on disk, or a manual request)--> hash, check memory, build & warm up
         --> READY (or back to IDLE: unchanged, or failed and logged) --take_ready (intake)--> SWITCHING
         --retire(old engine) (engine thread, once the old one is done with)--> IDLE, the old one closed here

Guarantees:

* The serving engine is never touched: the new one is built, started and warmed up beside it, and closed
  again when anything fails -- the memory check, the start or warm-up, its results' schema (with a schema
  registry the output schema is fixed at start), or the model changing again while it loaded (it is
  loaded again once it settles).
* A version that failed is not tried again until it changes on disk (or a manual reload asks).
* A model whose content digest is the serving one's is not loaded at all (``touch``, a copy of the same
  files, a symlink swapped to an identical directory).
* Every engine this thread built and that is not serving at the end is closed (here, or by :meth:`stop`).

Threads: :meth:`request` any (not from a signal handler: it takes a lock; the runner's loop calls it),
:meth:`take_ready` the intake thread, :meth:`retire` the engine thread, :meth:`stop` the intake thread.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.config.engine import Reload
from sluice.engines.engine_contract import first_line
from sluice.engines.identity import ModelIdentity, ModelSource
from sluice.model_store.digest import content_digest, fingerprint, size_bytes
from sluice.operator.observer import Observer
from sluice.operator.reload.memory import Footprint, measure_start, room_for
from sluice.operator.reload.outcome import ReloadOutcome, Stage
from sluice.operator.reload.watch import ChangeWatcher
from sluice.operator.serving import Engine, Serving

log = logging.getLogger("sluice.reload")


class Phase(enum.Enum):
    IDLE = "idle"  # serving one engine; watching
    BUILDING = "building"  # a new engine is being hashed, built, warmed up
    READY = "ready"  # built and warmed up; the intake has not taken it yet
    SWITCHING = "switching"  # handed over; the old engine is still running what it prepared


class Reloader:
    """See the module docstring. ``build`` creates and starts (loads, warms up) a new engine of the pipeline's
    type, raising an exception with a one-line message; ``check`` says why a built engine cannot replace the
    serving one (None: it can)."""

    def __init__(self, source: ModelSource, serving: Serving, footprint: Footprint, build: Callable[[], Engine],
                 settings: Reload, observer: Observer, *, check: Callable[[Engine], str | None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic, digest: Callable[[Path], str] = content_digest,
                 known: Any = None) -> None:
        """``known``: the model's fingerprint taken before the serving engine loaded it (default: now), so a
        change made while it loaded is found at the first look."""
        self.source, self.settings, self.observer, self.clock = source, settings, observer, clock
        self._build, self._check, self._digest = build, check, digest
        self.serving = serving  # the newest engine taken by the intake (what a change is compared with)
        self._footprint = footprint
        self.phase = Phase.IDLE
        self.watcher = ChangeWatcher(known if known is not None else self._fingerprint(), settings.poll_interval_s,
                                     settings.settle_s)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._requested = False
        self._stopping = False
        self._ready: Serving | None = None
        self._ready_footprint = footprint
        self._retired: list[Engine] = []
        self._thread = threading.Thread(target=self._run, name="sluice-reload", daemon=True)

    # ------------------------------------------------------------------------------------ the API

    def start(self) -> None:
        self._thread.start()

    def request(self) -> None:
        """Reload now, as if the model had changed (``sluice reload``, SIGHUP): also a version that failed
        before, but not one identical to the serving model."""
        self._requested = True
        self._wake.set()

    def take_ready(self) -> Serving | None:
        """Intake thread, every pass: the new engine, built and warmed up, once (None: none ready)."""
        if self._ready is None:  # one attribute read: the loop asks on every pass
            return None
        with self._lock:
            ready, self._ready = self._ready, None
            if ready is not None:
                self.phase, self.serving, self._footprint = Phase.SWITCHING, ready, self._ready_footprint
        return ready

    def retire(self, engine: Engine) -> None:
        """Engine thread: ``engine`` was switched away from and nothing runs on it any more: close it (here,
        on the reloader's thread, so the engine thread goes on at once)."""
        with self._lock:
            self._retired.append(engine)
            if self.phase is Phase.SWITCHING:
                self.phase = Phase.IDLE
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        """Shutdown, after the engine thread has ended: close every engine built and not serving. A build in
        progress is waited for up to ``timeout_s``; past that, it closes its engine itself when done."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_s))
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is not None:
            self._discard(ready.engine)
        self._close_retired()

    # ---------------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        watching = self.settings.watch and self.source.path is not None and self.source.reloadable
        if self.settings.watch and not watching:  # build.py refuses this at start; said again for a caller
            log.warning("engine.reload.watch: %s has no model file to watch", self.source.name)
        while not self._stopping:
            self._wake.wait(self.watcher.next_look_s(self.clock()) if watching else None)
            self._wake.clear()
            self._close_retired()
            if self._stopping or self.phase is not Phase.IDLE:
                continue  # one reload at a time; a request waits for the switch to end
            manual, self._requested = self._requested, False
            now_fingerprint = self._fingerprint()
            if manual or (watching and self.watcher.observe(now_fingerprint, self.clock())):
                try:
                    self._attempt(now_fingerprint, manual)
                except Exception as err:  # a bug here must not stop the serving engine
                    log.exception("model reload failed unexpectedly")
                    self._finish(self.clock(), "failed", None, "start", f"{type(err).__name__}: {first_line(err)}")
                    self.phase = Phase.IDLE

    def _attempt(self, seen: Any, manual: bool) -> None:
        started_s = self.clock()
        path = self.source.path
        if path is None or not self.source.reloadable:
            log.warning("reload asked for, but %s is built in code: a reload loads a new version of a model on "
                        "disk (engine.model)", self.source.name)
            return
        try:
            digest = self._digest(path)
        except OSError as err:
            self.watcher.accept(seen)
            self._finish(started_s, "failed", None, "read", f"cannot read the model at {path}: {err}")
            return
        identity = ModelIdentity(self.serving.identity.name, digest, self.serving.identity.engine)
        if digest == self.serving.identity.digest:
            self.watcher.accept(seen)
            log.info("%sthe model at %s is the one serving (%s): nothing to reload", "reload asked for: " if manual
                     else "", path, identity.label)
            self._finish(started_s, "unchanged", identity)
            return
        if self.settings.check_memory:
            reason = room_for(self.serving.engine.memory_device(), size_bytes(path), self._footprint)
            if reason is not None:
                self.watcher.accept(seen)
                self._finish(started_s, "failed", identity, "memory", reason)
                return
        log.info("loading %s from %s beside the serving %s", identity.label, path, self.serving.identity.label)
        self.phase = Phase.BUILDING
        try:
            engine, footprint = measure_start(self._build)
        except Exception as err:  # StartError: one line already; anything else said in one
            self.phase = Phase.IDLE
            self.watcher.accept(seen)
            self._finish(started_s, "failed", identity, "start", first_line(err))
            return
        after = self._fingerprint()
        if after != seen and self._digest(path) == digest:
            seen = after  # files touched while it loaded (times, a chmod), the same content: no change
        problem = self._refusal(engine, after != seen)
        if problem is not None:
            self._discard(engine)
            self.phase = Phase.IDLE
            if problem[0] != "changed":
                self.watcher.accept(seen)
            self._finish(started_s, "failed", identity, *problem)
            return
        ready = Serving(engine, identity, warmup_s=self.clock() - started_s)
        with self._lock:
            self._ready, self._ready_footprint, self.phase = ready, footprint, Phase.READY
        self.watcher.accept(seen)
        self._finish(started_s, "ready", identity)

    def _refusal(self, engine: Engine, changed: bool) -> tuple[Stage, str] | None:
        """Why the engine just built must not serve, if it must not."""
        if self._stopping:
            return "start", "the pipeline is stopping"
        if changed:  # what loaded may not be what was hashed
            return "changed", "the model changed again while it loaded; it is loaded again once it settles"
        try:
            reason = self._check(engine)
        except Exception as err:
            reason = f"{type(err).__name__}: {first_line(err)}"
        return None if reason is None else ("schema", reason)

    def _finish(self, started_s: float, result: Any, identity: ModelIdentity | None, stage: Stage | None = None,
                reason: str | None = None) -> None:
        outcome = ReloadOutcome(result, identity, self.clock() - started_s, stage, reason)
        if result == "ready":
            log.info("model %s is built and warmed up in %.1f s; it serves from the next batch on",
                     identity.label if identity else "?", outcome.seconds)
        elif result == "failed":
            log.warning("model reload failed (%s): %s; still serving %s", stage, reason,
                        self.serving.identity.label)
        try:
            self.observer.model_reloaded(outcome)
        except Exception as err:  # telemetry must not break a reload
            log.debug("the observer failed on a reload outcome: %s", err)

    def _fingerprint(self) -> Any:
        return fingerprint(self.source.path) if self.source.path is not None and self.source.reloadable else None

    def _discard(self, engine: Engine) -> None:
        with self._lock:
            self._retired.append(engine)

    def _close_retired(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, []
        for engine in retired:
            try:
                engine.close()
            except Exception as err:  # the old model's memory may leak; the new one serves all the same
                log.warning("closing the replaced engine failed: %s: %s", type(err).__name__, first_line(err))
