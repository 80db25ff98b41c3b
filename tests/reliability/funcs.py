"""User functions the reliability tests plug into the ``python`` engine (run inside the operator process).

The pace comes from the environment of the operator process, so one function serves every test:
``RELIABILITY_BATCH_MS`` (fixed cost of one engine call) and ``RELIABILITY_ITEM_MS`` (cost per input);
with ``RELIABILITY_HANG=1`` a batch holding a text with "hang" never returns (a wedged model).
A model has both: a fixed per-call overhead, which is what bisecting a failed batch multiplies.
"""

from __future__ import annotations

import os
import time


def paced_tag(texts: list[str]) -> list[str]:
    """Upper-case and bracket each text, after sleeping like a model; raise on a batch holding a poison text."""
    batch_ms = float(os.environ.get("RELIABILITY_BATCH_MS", "0"))
    item_ms = float(os.environ.get("RELIABILITY_ITEM_MS", "0"))
    delay_s = (batch_ms + item_ms * len(texts)) / 1000
    if delay_s > 0:
        time.sleep(delay_s)
    if os.environ.get("RELIABILITY_HANG") == "1" and any("hang" in t for t in texts):
        while True:
            time.sleep(3600)
    if any("poison" in t for t in texts):
        raise ValueError("the model cannot digest 'poison'")
    return [f"<{t.upper()}>" for t in texts]
