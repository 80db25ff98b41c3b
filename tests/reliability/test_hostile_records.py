"""Hostile records among good ones, through ``sluice run`` on the real broker: the record nested 100,000
levels deep that used to stop the operator for good, other deep shapes, an oversized record, wrong types at
the input field, invalid JSON and more. Every good record gets its output, every hostile one is
dead-lettered once with its reason, and the operator exits 0 with everything committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.operators import run_until_idle
from tests.reliability.pipelines import make_topics, write_pipeline
from tests.support.kafka import committed_offsets, consume_all, end_offsets, produce, unique_topic

pytestmark = [pytest.mark.kafka, pytest.mark.reliability, pytest.mark.slow]

MAX_RECORD_BYTES = 300_000  # above the 100,000-deep record (200 kB), so that its depth is what refuses it


def deep(opens: str, closes: str, levels: int) -> bytes:
    return ('{"text": "a", "x": ' + opens * levels + "0" + closes * levels + "}").encode()


# key -> (value, stage, class, a fragment of the message)
HOSTILE: dict[str, tuple[bytes | None, str, str, str]] = {
    "deep-100k": (deep("[", "]", 100_000), "decode", "CodecError", "codec.max_depth allows 128"),
    "deep-objects": (deep('{"a":', "}", 5_000), "decode", "CodecError", "codec.max_depth allows 128"),
    "deep-mixed": (deep('[{"b":', "}]", 64), "decode", "CodecError", "nests 129 levels deep"),
    "deep-unclosed": (b'{"text": "a", "x": ' + b"[" * 50_000, "decode", "CodecError", "codec.max_depth"),
    "too-big": (json.dumps({"text": "b" * MAX_RECORD_BYTES}).encode(), "decode", "CodecError",
                "codec.max_record_bytes allows 300000"),
    "not-json": (b'{"text": "a"', "decode", "CodecError", "not valid JSON"),
    "surrogate": (b'{"text": "\\ud800"}', "decode", "CodecError", "not valid JSON"),
    "huge-number": (b'{"text": 1e999999}', "decode", "CodecError", "Number out of range"),
    "tombstone": (None, "decode", "CodecError", "tombstone"),
    "not-an-object": (b"[1, 2, 3]", "decode", "CodecError", "expected a JSON object"),
    "text-is-a-list": (b'{"text": ["a"]}', "infer", "AttributeError", "'list' object has no attribute 'upper'"),
    "text-is-null": (b'{"text": null}', "infer", "TypeError", "argument of type 'NoneType' is not iterable"),
    "big-integer": (b'{"text": 123456789012345678901234567890}', "infer", "TypeError", "argument of type 'int'"),
    "poison": (b'{"text": "poison"}', "infer", "ValueError", "cannot digest"),
}
NUM_GOOD = 300


def test_hostile_records_are_dead_lettered_with_their_reason_and_every_good_one_comes_out(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    good = [(f"g{i}", json.dumps({"seq": i, "text": f"record {i}"})) for i in range(NUM_GOOD)]
    # looks hostile, is not: brackets inside a string do not nest
    good.append(("g-brackets", json.dumps({"seq": NUM_GOOD, "text": "[{" * 15_000})))
    records: list[tuple[str, bytes | str | None]] = []
    hostile = list(HOSTILE.items())
    for i, rec in enumerate(good):
        records.append(rec)
        if i % 20 == 10 and hostile:
            key, (value, _, _, _) = hostile.pop(0)
            records.append((key, value))
    assert not hostile
    topics = make_topics(kafka_bootstrap, partitions=2)
    t_in, t_out, t_dlq = topics
    produce(kafka_bootstrap, t_in, records)
    group = unique_topic("g")
    pipeline = write_pipeline(tmp_path / "p.yaml", kafka_bootstrap, topics, group,
                              codec={"format": "json", "input_field": "text", "max_record_bytes": MAX_RECORD_BYTES})
    run_until_idle(pipeline, tmp_path / "op.log")

    out = consume_all(kafka_bootstrap, t_out, expected_count=len(good))
    dead = consume_all(kafka_bootstrap, t_dlq, expected_count=len(HOSTILE))
    assert sorted((r.key or b"").decode() for r in out) == sorted(key for key, _ in good)
    for r in out:
        doc = json.loads(r.value or b"")
        assert doc["tagged"] == f"<{doc['text'].upper()}>"
    assert sorted((r.key or b"").decode() for r in dead) == sorted(HOSTILE)
    for r in dead:
        value, stage, cls, fragment = HOSTILE[(r.key or b"").decode()]
        headers = {k: (v or b"").decode() for k, v in r.headers}
        assert r.value == value  # the original bytes
        assert (headers["sluice.error.stage"], headers["sluice.error.class"]) == (stage, cls), (r.key, headers)
        assert fragment in headers["sluice.error.message"], (r.key, headers["sluice.error.message"])
    assert committed_offsets(kafka_bootstrap, group, t_in) == end_offsets(kafka_bootstrap, t_in)
