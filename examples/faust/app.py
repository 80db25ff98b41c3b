"""A Faust app whose agent hands its model work to Sluice: Sluice's length-aware batcher, a Sluice engine
run off the event loop, Faust's own topics, acknowledgements and sends.

Run it (a broker with the topics `reviews` and `reviews.shouted`; see README.md next to this file):

    SLUICE_KAFKA_BOOTSTRAP=127.0.0.1:9092 python examples/faust/app.py worker -l info

Settings from the environment: SLUICE_KAFKA_BOOTSTRAP, FAUST_APP_ID (consumer group), FAUST_TOPIC_IN,
FAUST_TOPIC_OUT, FAUST_DATA_DIR (Faust's local state). The engine is the ``python`` engine with
``examples.functions.text:shout``; any batch engine section works the same way (``{"type": "onnx",
"model": "minilm-l6"}`` embeds instead).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import faust

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `examples.functions` from a checkout

from sluice.adapters.faust import Enricher  # noqa: E402 - after the path set-up above

BOOTSTRAP = os.environ.get("SLUICE_KAFKA_BOOTSTRAP", "127.0.0.1:9092")

app = faust.App(
    os.environ.get("FAUST_APP_ID", "sluice-faust-example"),
    broker=f"kafka://{BOOTSTRAP}",
    value_serializer="json",
    web_enabled=False,
    datadir=os.environ.get("FAUST_DATA_DIR", "faust-data"),
    consumer_auto_offset_reset="earliest",
    topic_replication_factor=1,
)
reviews = app.topic(os.environ.get("FAUST_TOPIC_IN", "reviews"))
shouted = app.topic(os.environ.get("FAUST_TOPIC_OUT", "reviews.shouted"))
dead_letters = app.topic(os.environ.get("FAUST_TOPIC_DLQ", "reviews.dlq"))

# The pipeline YAML's `engine:` and `batching:` sections, as dicts.
enricher = Enricher(
    engine={"type": "python", "function": "examples.functions.text:shout"},
    batching={"max_batch_size": 32, "max_queue_delay_ms": 20},
    to_input=lambda review: review["text"],
)


@app.agent(reviews)
async def shout(stream: Any) -> None:
    async for batch in enricher.batches(stream):
        for item in batch:
            if item.error is None:
                await shouted.send(key=item.event.key, value={**item.value, "shouted": item.result})
            else:  # the engine rejected this record: keep it, with the reason
                await dead_letters.send(key=item.event.key, value={"record": item.value, "error": item.error})
        # Returning to `async for` acknowledges the events whose results were just sent (at-least-once).


if __name__ == "__main__":
    enricher.start()  # load and warm up the model before the worker joins the group
    try:
        app.main()
    finally:
        enricher.close()
