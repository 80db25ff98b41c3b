"""Which seed a record's sampling gets: drawn from the record's identity, so a replay samples the same tokens.

With ``temperature`` above 0 an answer is a random draw. The engine gives each request its own random stream
(``sampling.py``: seeded from ``(seed, step index)``, whatever else is in the batch), and this module picks
that seed per record from what ``seed_from`` names:

* ``offset`` (the default): the record's source topic, partition and offset (a file source's path and line)
  -- the record re-read after a crash, a rebalance or a rewind gets the draw it got the first time, while
  two records with the same text get independent draws;
* ``key``: the record's key -- the same draw for a record re-published under its key (a record without a
  key falls back to its offset);
* ``field:NAME``: a field of the record's value (a JSON value, canonicalised; a record without it falls
  back to its offset);
* ``none``: every record sampled with ``seed`` alone (all alike), or -- without ``seed`` -- from the
  engine's own stream (not reproducible record by record).

``seed`` salts the draw: change it to get another, equally reproducible, draw for every record. A seed given
by the record itself wins (an ``overrides: {seed: FIELD}`` field, an OpenAI batch line's ``seed``).

Guarantee: the seed is a pure function of ``(seed_from, seed, the named identity)``: stable across
processes, machines and Sluice versions (blake2b, not Python's ``hash``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from sluice.engines.engine_contract import RecordOrigin

Kind = Literal["offset", "key", "field", "none"]
CHOICES = "offset, key, none or field:NAME"


@dataclass(frozen=True, slots=True)
class SeedFrom:
    kind: Kind
    field: str | None = None  # with kind "field"

    @classmethod
    def parse(cls, text: str) -> SeedFrom:
        """``offset`` | ``key`` | ``none`` | ``field:NAME``; ValueError naming the choices otherwise."""
        if text in ("offset", "key", "none"):
            return cls(text)  # type: ignore[arg-type]
        name = text.removeprefix("field:") if text.startswith("field:") else ""
        if not name.strip():
            raise ValueError(f"seed_from must be {CHOICES}, got {text!r}")
        return cls("field", name)

    def seed(self, salt: int | None, value: Any, origin: RecordOrigin | None) -> int | None:
        """The seed of one record (``value``: the decoded value; ``origin``: where it came from, None when the
        caller does not know -- warm-up, ``sluice validate``)."""
        if self.kind == "none":
            return salt
        identity: bytes | None = None
        if self.kind == "field" and isinstance(value, dict) and value.get(self.field) is not None:
            found = value[self.field]
            identity = b"field\0" + (found if isinstance(found, str) else _canonical(found)).encode()
        elif self.kind == "key" and origin is not None and origin.key is not None:
            identity = b"key\0" + origin.key
        if identity is None:
            if origin is None:
                return salt
            identity = b"offset\0%s\0%d\0%d" % (origin.topic.encode(), origin.partition, origin.offset)
        digest = hashlib.blake2b(identity, digest_size=8, key=str(salt or 0).encode()).digest()
        return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
