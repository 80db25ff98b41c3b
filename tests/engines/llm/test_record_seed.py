"""Per-record sampling seeds (``record_seed.py``): what each ``seed_from`` reads, the fallbacks, the salt, and
values pinned so that a seed cannot change between versions (a replay after an upgrade draws the same)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluice.engines.engine_contract import RecordOrigin
from sluice.engines.llm.core.record_seed import SeedFrom
from sluice.engines.llm.operator_options import LLMOptions

AT_5 = RecordOrigin("reviews", 1, 5, b"user-7")
AT_6 = RecordOrigin("reviews", 1, 6, b"user-7")
NO_KEY = RecordOrigin("reviews", 1, 5, None)


def test_offset_seeds_follow_the_record_not_its_text() -> None:
    offset = SeedFrom.parse("offset")
    assert offset.seed(None, "same text", AT_5) == offset.seed(None, "other text", AT_5)
    assert offset.seed(None, "same text", AT_5) != offset.seed(None, "same text", AT_6)
    assert offset.seed(None, "x", RecordOrigin("other-topic", 1, 5, None)) != offset.seed(None, "x", AT_5)
    assert offset.seed(None, "x", AT_5) == 7740588744864780339  # pinned: stable across processes and versions


def test_key_and_field_seeds_and_their_fallback_to_the_offset() -> None:
    key, field = SeedFrom.parse("key"), SeedFrom.parse("field:review_id")
    assert key.seed(None, "a", AT_5) == key.seed(None, "b", AT_6)  # one key, two offsets
    assert key.seed(None, "a", NO_KEY) == SeedFrom.parse("offset").seed(None, "a", NO_KEY)
    assert field.seed(None, {"review_id": 17}, AT_5) == field.seed(None, {"review_id": 17, "x": 1}, AT_6)
    assert field.seed(None, {"review_id": 17}, AT_5) != field.seed(None, {"review_id": "17x"}, AT_5)
    assert field.seed(None, {"review_id": {"a": 1, "b": 2}}, AT_5) == field.seed(None, {"review_id": {"b": 2, "a": 1}}, AT_6)
    assert field.seed(None, {"other": 1}, AT_5) == SeedFrom.parse("offset").seed(None, {}, AT_5)


def test_the_salt_gives_another_draw_and_none_keeps_the_pipeline_seed() -> None:
    offset = SeedFrom.parse("offset")
    assert offset.seed(1, "x", AT_5) != offset.seed(2, "x", AT_5)
    assert offset.seed(None, "x", AT_5) == offset.seed(0, "x", AT_5)
    none = SeedFrom.parse("none")
    assert none.seed(42, "x", AT_5) == 42 and none.seed(None, "x", AT_5) is None
    assert offset.seed(42, "x", None) == 42  # no origin (warm-up, validate): the salt alone
    seeds = {offset.seed(None, "x", RecordOrigin("t", 0, i, None)) for i in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2**63 for s in seeds if s is not None)


@pytest.mark.parametrize("text", ["offsets", "field:", "field: ", "Key", ""])
def test_a_bad_seed_from_is_refused_with_the_choices(text: str) -> None:
    with pytest.raises(ValidationError, match="seed_from must be offset, key, none or field:NAME"):
        LLMOptions(seed_from=text)
    assert LLMOptions().seed_source == SeedFrom("offset")
