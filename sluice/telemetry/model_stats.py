"""The engine's numbers per model, and the reloads: what the metrics' ``model`` label and the reload metrics
read.

The engine numbers (batches, batch sizes, inference time, warm-up) are kept per model label
(:attr:`ModelIdentity.label <sluice.engines.identity.ModelIdentity.label>`, the ``sluice.model`` header's
text): after a reload the old model's series keep their last values and the new model's start from zero,
as Prometheus expects of a new label value. A batch counts for the model serving when it started, which is
exact for batch engines (they switch between batches); while a continuous engine runs two models after a
reload, its steps count for the new one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from sluice.engines.identity import ModelIdentity
from sluice.operator.reload.outcome import ReloadOutcome
from sluice.telemetry.histogram import SECONDS_BUCKETS, SIZE_BUCKETS, BatchHistogram, HistogramSnapshot


@dataclass
class _PerModel:
    warmup_s: float
    batch_size: BatchHistogram = field(default_factory=lambda: BatchHistogram(SIZE_BUCKETS))
    infer_s: BatchHistogram = field(default_factory=lambda: BatchHistogram(SECONDS_BUCKETS))
    num_batches: int = 0


@dataclass(frozen=True)
class ModelSnapshot:
    """One model's engine numbers."""

    warmup_s: float
    num_batches: int
    batch_size: HistogramSnapshot
    infer_s: HistogramSnapshot


@dataclass(frozen=True)
class ReloadFailure:
    """The latest failed reload."""

    model: str  # the label of the model that failed to load ("" when it could not even be read)
    stage: str
    reason: str
    at_unix_s: float


@dataclass(frozen=True)
class ModelsSnapshot:
    serving: ModelIdentity | None
    models: dict[str, ModelSnapshot]  # by label, every model served in this run
    reloads: dict[str, int]  # by result: ready, unchanged, failed
    failures: dict[str, int]  # failed reloads by stage
    last_failure: ReloadFailure | None


class ModelStats:
    """See the module docstring. Fed by the engine thread (batches), the reloader (outcomes) and the
    thread a model starts serving on; read by scrapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._serving: ModelIdentity | None = None
        self._current: _PerModel | None = None
        self._models: dict[str, _PerModel] = {}
        self._reloads: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._last_failure: ReloadFailure | None = None

    def record_serving(self, identity: ModelIdentity, warmup_s: float) -> None:
        with self._lock:
            self._serving = identity
            self._current = self._models.setdefault(identity.label, _PerModel(warmup_s))

    def record_batch(self, num_records: int) -> None:
        current = self._current
        if current is not None:
            current.batch_size.observe(num_records)
            with self._lock:
                current.num_batches += 1

    def record_infer(self, infer_s: float) -> None:
        current = self._current
        if current is not None:
            current.infer_s.observe(infer_s)

    def record_reload(self, outcome: ReloadOutcome) -> None:
        with self._lock:
            self._reloads[outcome.result] += 1
            if outcome.result == "failed":
                self._failures[outcome.stage or "start"] += 1
                self._last_failure = ReloadFailure(outcome.identity.label if outcome.identity else "",
                                                   outcome.stage or "start", outcome.reason or "", time.time())

    def snapshot(self) -> ModelsSnapshot:
        with self._lock:
            models = {label: ModelSnapshot(m.warmup_s, m.num_batches, m.batch_size.snapshot(), m.infer_s.snapshot())
                      for label, m in self._models.items()}
            return ModelsSnapshot(self._serving, models, dict(self._reloads), dict(self._failures),
                                  self._last_failure)
