"""What every section model shares: unknown keys are errors, values are frozen once validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every section: an unknown key is an error (a misspelt option is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def check_import_path(value: str) -> None:
    """``package.module:Name``, as protobuf message types and Python functions are named."""
    module, _, attr = value.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'package.module:Name', got {value!r}")


def changed_keys(section: Section) -> set[str]:
    """The keys of ``section`` set to something other than their default (a file that spells a default out,
    or a dumped and reloaded model, changes nothing)."""
    fields = type(section).model_fields
    return {k for k in section.model_fields_set
            if getattr(section, k) != fields[k].get_default(call_default_factory=True)}


def exactly_one_of(section: Section, *keys: str) -> None:
    """A section where one key picks the implementation (``source: {kafka: ...}`` or ``{file: ...}``)."""
    given = [k for k in keys if getattr(section, k) is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {' or '.join(repr(k) for k in keys)} "
                         f"(got {' and '.join(given) or 'neither'})")
