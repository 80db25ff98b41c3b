"""When has the model on disk changed, and finished changing? Pure: fingerprints and times are given.

The reloader polls the model path's fingerprint (:func:`sluice.model_store.digest.fingerprint`: a few ``stat``
calls) every ``poll_interval_s`` and asks :class:`ChangeWatcher` whether to load what is there now.

Guarantees:

* A fingerprint other than the known one is loaded only once it has stayed the same for ``settle_s``
  (a copy written in place, file by file, is not loaded half-written; an atomic swap -- a rename, a
  symlink replaced -- settles at the next look).
* A missing model (deleted, or in the middle of a swap that is not atomic) is never loaded: the serving
  one stays, and the watcher waits for a model to be there again.
* The known fingerprint is what :meth:`ChangeWatcher.accept` was last told: the serving model's, or one
  that was tried and refused (a broken version is not tried again until it changes once more).
"""

from __future__ import annotations

from typing import Any

Fingerprint = Any  # sluice.model_store.digest.Fingerprint, or anything comparable (tests use strings)


class ChangeWatcher:
    """See the module docstring. Not thread-safe: the reloader's thread owns it."""

    def __init__(self, known: Fingerprint, poll_interval_s: float, settle_s: float) -> None:
        self.known = known
        self.poll_interval_s = poll_interval_s
        self.settle_s = settle_s
        self._seen: Fingerprint = None  # a new fingerprint that has not settled yet
        self._seen_at_s = 0.0

    def observe(self, fingerprint: Fingerprint, now_s: float) -> bool:
        """The model path's fingerprint at ``now_s``: True when a new version is there to be loaded."""
        if fingerprint is None or fingerprint == self.known:
            self._seen = None
            return False
        if fingerprint != self._seen:
            self._seen, self._seen_at_s = fingerprint, now_s
        return now_s - self._seen_at_s >= self.settle_s

    def accept(self, fingerprint: Fingerprint) -> None:
        """``fingerprint`` was loaded, or refused: only a different one is a change."""
        self.known = fingerprint
        self._seen = None

    def next_look_s(self, now_s: float) -> float:
        """How long to wait before the next look: sooner while a change settles."""
        if self._seen is None:
            return self.poll_interval_s
        return max(0.0, min(self.poll_interval_s, self._seen_at_s + self.settle_s - now_s))
