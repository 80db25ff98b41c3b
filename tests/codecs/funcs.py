"""User functions the schema-registry tests plug into the ``python`` engine."""

from __future__ import annotations

# What `embed` returns, for engine.result_schema in the tests' pipelines: 32-bit floats (Avro float)
EMBED_SCHEMA = {"type": "array", "items": {"type": "number", "format": "float"}}


def embed(texts: list[str]) -> list[list[float]]:
    """A stand-in embedding, exact in float32: (characters, spaces, 0.5)."""
    return [expected_embedding(t) for t in texts]


def expected_embedding(text: str) -> list[float]:
    return [float(len(text)), float(text.count(" ")), 0.5]
