"""``engine``: the engine type, and its options as given (validated by the type's own model at load).

Besides the type's own options, two keys are the operator's, for any engine type: ``model_name`` (what
the ``sluice.model`` header calls the model) and ``reload`` (rolling a new model version out while the
pipeline runs, sluice/operator/reload/).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sluice.config.base import Section
from sluice.engines import registry


class Reload(Section):
    """``engine.reload``: load a new version of the model beside the running one, then switch."""

    watch: bool = False  # poll the model path and reload when what is there changes
    poll_interval_s: float = Field(default=30.0, gt=0)  # how often to look (a few stat calls)
    # A change is loaded once the model has stayed unchanged this long (a copy written in place is not
    # loaded half-written; an atomic swap -- rename, symlink -- settles at the next look).
    settle_s: float = Field(default=1.0, ge=0)
    check_memory: bool = True  # refuse a reload that does not fit beside the running engine


class EngineSection(BaseModel):
    """``engine: {type: NAME, ...options}``; the options are validated by the engine type's own model."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())
    type: str
    # The model's name in the sluice.model header and metrics; default: from engine.model (a known model's
    # name, a file's or directory's name) or the function's import path.
    model_name: str | None = Field(default=None, min_length=1, max_length=200)
    reload: Reload = Field(default_factory=Reload)

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in registry.known_types():
            raise ValueError(f"unknown engine type {value!r}; expected one of {registry.known_types()}")
        return value

    def raw_options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})
