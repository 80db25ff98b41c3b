"""Structured output from Kafka to Kafka, on the real broker with the real SmolLM2-135M.

The example pipeline examples/pipelines/extract-reviews.yaml (topics renamed) extracts fields from 24
reviews it has never seen: with its JSON Schema as a constraint, no record is dead-lettered for a bad
answer; the same pipeline with the schema only checked afterwards (``parse: json`` + ``json_schema``, no
constraint) dead-letters most of them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sluice.model_store import fetch
from tests.integration.pipelines import ROOT, run_sluice
from tests.support.kafka import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_topic,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REVIEWS = [
    "The Bosch drill is powerful and the battery lasts all day.", "My Fitbit strap snapped after a week.",
    "Solid umbrella, survived a storm in Glasgow.", "The air fryer makes crispy fries, though it is noisy.",
    "Instant Pot changed how I cook, five stars!", "The backpack zipper broke on day two. Avoid.",
    "This tea tastes like cardboard.", "Garmin watch: accurate GPS, terrible app.",
    "Nice wool socks, warm and soft. Four stars.", "The toaster only browns one side of the bread.",
    "Perfect little notebook for sketching.", "The sofa arrived scratched and customer service ignored me.",
    "IKEA lamp, easy to assemble, looks great.", "The protein bars are too sweet for me, 2 stars.",
    "Logitech mouse works flawlessly on my Mac.", "Kids love the trampoline, sturdy build.",
    "The printer jams every third page.", "Crisp sound from these JBL speakers for the price.",
    "Mediocre pizza cutter, does the job.", "The Nespresso machine leaks water everywhere.",
    "Très bon parfum, tient toute la journée.", "Das Messer ist scharf und liegt gut in der Hand.",
    "The garden hose kinks constantly. One star.", "Best running shorts I've owned, light and comfy.",
]
EXAMPLE = ROOT / "examples" / "pipelines" / "extract-reviews.yaml"


@pytest.fixture(scope="module")
def smollm() -> Path:
    return fetch("smollm2-135m")


def run(path: Path, doc: dict[str, Any], bootstrap: str) -> tuple[list[Any], list[Any], str]:
    """Run ``doc`` on fresh topics holding the reviews; return (outputs, dead letters, group)."""
    t_in, t_out, t_dlq = unique_topic("reviews"), unique_topic("extracted"), unique_topic("dlq")
    for name, parts in ((t_in, 2), (t_out, 2), (t_dlq, 1)):
        create_topic(bootstrap, name, parts)
    produce(bootstrap, t_in, [(f"r{i}", json.dumps({"id": i, "text": t})) for i, t in enumerate(REVIEWS)])
    group = unique_topic("g")
    doc = copy.deepcopy(doc)
    doc["source"]["kafka"].update(bootstrap_servers=bootstrap, topics=[t_in], group_id=group,
                                  config={"session.timeout.ms": 6000})
    doc["sink"]["kafka"]["topic"] = t_out
    doc["dead_letter"]["topic"] = t_dlq
    doc["engine"].update(max_model_len=320)
    doc["runtime"] = {"commit_interval_ms": 200, "drain_timeout_s": 1}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = run_sluice("run", str(path), "--idle-exit", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = consume_all(bootstrap, t_out)
    dlq = consume_all(bootstrap, t_dlq)
    assert len(out) + len(dlq) == len(REVIEWS)
    assert committed_offsets(bootstrap, group, t_in) == end_offsets(bootstrap, t_in)
    return out, dlq, proc.stderr


def test_constrained_extraction_has_no_schema_dead_letters(kafka_bootstrap: str, tmp_path: Path,
                                                          smollm: Path) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    schema = example["engine"]["structured_output"]["json_schema"]

    unconstrained = copy.deepcopy(example)
    del unconstrained["engine"]["structured_output"]
    unconstrained["engine"].update(parse="json", json_schema=schema)
    _, free_dlq, _ = run(tmp_path / "free.yaml", unconstrained, kafka_bootstrap)

    out, dlq, log = run(tmp_path / "constrained.yaml", example, kafka_bootstrap)
    print(f"schema dead letters: unconstrained {len(free_dlq)}/{len(REVIEWS)}, constrained {len(dlq)}/{len(REVIEWS)}")
    assert len(free_dlq) >= len(REVIEWS) // 2
    for r in free_dlq:
        message = dict(r.headers)["sluice.error.message"].decode()
        assert "not valid JSON" in message or "does not match json_schema" in message
    assert dlq == []
    ids = set()
    for r in out:
        value = json.loads(r.value)
        jsonschema.validate(value["extracted"], schema)  # a JSON object in the record, not its text
        ids.add(value["id"])
    assert ids == set(range(len(REVIEWS)))
    assert "structured output 100% of requests (1 grammars compiled" in log
