"""Models on disk as engines name them, and their identity (the content hash; sluice/model_store/digest.py).

Kept apart from :mod:`sluice.engines.identity` (plain data, imported by the engine contracts) because
finding a model means the model catalogue, which imports engine code of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sluice.engines.identity import ModelIdentity, ModelSource, model_name, name_digest, safe_name
from sluice.model_store.catalogue import ModelError
from sluice.model_store.digest import content_digest
from sluice.model_store.download import resolve_model

log = logging.getLogger(__name__)


def disk_source(reference: str, base_dir: str | Path | None) -> ModelSource:
    """The source of a model the pipeline names as ``reference``: a known model name (its fetched directory)
    or a path, relative to ``base_dir``. A model that is not there has no path (its engine's start says why)."""
    try:
        path: Path | None = resolve_model(reference, base_dir=base_dir)
    except ModelError:
        path = None
    return ModelSource(name=model_name(reference), path=path)


def identify(source: ModelSource, engine: str, name: str | None = None) -> ModelIdentity:
    """The identity of the model ``source`` names, run by engine type ``engine``; ``name`` replaces the
    source's (``engine.model_name``). Hashes the model (cached: :mod:`sluice.model_store.digest`); a model that
    cannot be read is named by its name's digest, with a warning."""
    digest = name_digest(source.name)
    if source.path is not None:
        try:
            digest = content_digest(source.path)
        except OSError as err:
            log.warning("cannot hash the model at %s (%s); its outputs carry the digest of its name", source.path,
                        err)
    return ModelIdentity(name=safe_name(name) if name else source.name, digest=digest, engine=engine)
