"""User functions the integration tests plug into the ``python`` engine."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path


def tag(texts: list[str]) -> list[str]:
    return [f"<{t.upper()}>" for t in texts]


def slow_tag(texts: list[str]) -> list[str]:
    time.sleep(0.02)  # a slow model: keeps records in flight when the test sends SIGTERM
    return tag(texts)


UNHANG = threading.Event()  # set by the test that made ``hang_on_request`` hang


def hang_on_request(texts: list[str]) -> list[str]:
    """A model call that never returns (until the test lets it) on a batch holding "hang"."""
    if any("hang" in t for t in texts):
        UNHANG.wait(120)
    return tag(texts)


def fail_on_poison(texts: list[str]) -> list[str]:
    if any("poison" in t for t in texts):
        raise ValueError("the model cannot digest 'poison'")
    return tag(texts)


def inflate(texts: list[str]) -> list[str]:
    """Blows up the result of records that ask for it: more than a small output topic accepts."""
    return ["x" * 50_000 if "big" in t else t.upper() for t in texts]


def load_tagger(model: Path) -> Callable[[list[str]], list[dict[str, str]]]:
    """A "model" kept in a JSON file, ``{"tag": "v2"}``, for the ``python`` engine's ``factory``: it tags each
    text with its version and the batch it ran in. A file without a tag is a broken model: it fails to load."""
    spec = json.loads(model.read_text())
    if "tag" not in spec:
        raise ValueError(f"{model.name} holds no tag")
    tag, pause_s = str(spec["tag"]), float(spec.get("pause_s", 0.0))
    engine_id, batches = uuid.uuid4().hex[:8], itertools.count()

    def tag_batch(texts: list[str]) -> list[dict[str, str]]:
        batch = f"{engine_id}-{next(batches)}"
        time.sleep(pause_s)  # a model that takes its time: the switch lands mid-stream, under load
        return [{"tag": tag, "batch": batch, "text": t.upper()} for t in texts]

    return tag_batch


def type_flip(texts: list[str]) -> list[object]:
    """Text results for rows below 2000, then lists: a result type that changes halfway through a file."""
    return [t.upper() if int(t.split()[-1]) < 2000 else [t] for t in texts]
