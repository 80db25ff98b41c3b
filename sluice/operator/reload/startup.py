"""The first engine's start, as a reload needs to know it: the model's identity and the memory it took.

The model is hashed on a thread of its own while the engine loads it (both read the same files: the
second read comes from the page cache), so a multi-GB model's first start costs about the longer of the
two, not their sum; later starts find the digest cached (sluice/model_store/digest.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.engines.identity import ModelIdentity, ModelSource
from sluice.engines.model_source import identify
from sluice.model_store.digest import fingerprint, size_bytes
from sluice.operator.reload.memory import Footprint, measure_start
from sluice.operator.serving import Engine

log = logging.getLogger("sluice.reload")


@dataclass(frozen=True, slots=True)
class Started:
    """An engine started, and what it is."""

    source: ModelSource
    identity: ModelIdentity
    footprint: Footprint
    warmup_s: float  # the start: load and warm-up
    fingerprint: Any  # of the model's files before it loaded (sluice/model_store/digest.py)


def start_identified(engine: Engine, start: Callable[[], None], engine_type: str, name: str | None) -> Started:
    """Run ``start()`` (the engine's, with the caller's error handling) while hashing its model."""
    source = engine.model_source()
    before = fingerprint(source.path) if source.path is not None and source.reloadable else None
    found: list[ModelIdentity] = []
    hashing = threading.Thread(target=lambda: found.append(identify(source, engine_type, name)),
                               name="sluice-model-digest", daemon=True)
    hashed_s = time.monotonic()
    if source.path is not None:
        hashing.start()
    _, footprint = measure_start(start)
    warmup_s = time.monotonic() - hashed_s
    if source.path is not None:
        hashing.join()
    else:  # nothing on disk before the start (a known model fetched by it, say): look again
        source = engine.model_source()
        found.append(identify(source, engine_type, name))
    identity = found[0]
    log.info("model %s (sha256 %s%s) on %s, started in %.1f s", identity.label, identity.digest,
             f", {size_bytes(source.path) / 1e6:.1f} MB at {source.path}" if source.path else "",
             engine.memory_device(), warmup_s)
    return Started(source, identity, footprint, warmup_s, before)
