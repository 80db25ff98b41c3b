"""What every section model shares: unknown keys are errors, values are frozen once validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every section: an unknown key is an error (a misspelt option is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_import_path(value: str) -> None:
    """``package.module:Name``, as protobuf message types and Python functions are named."""
    module, _, attr = value.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'package.module:Name', got {value!r}")
