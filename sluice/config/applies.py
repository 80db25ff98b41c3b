"""Options that do not apply to the engine or the delivery mode a pipeline chose.

Each section validates on its own; this is where one section's choice makes another section's option
meaningless. An option that would silently do nothing is never accepted without a word:

* an **error** where ignoring it would break what the user asked for: ``exactly_once:`` settings under
  ``delivery: at_least_once`` (the user believes in transactions that never happen), a latency target for
  an engine that schedules its own batches, a device name no engine knows;
* a **warning** where it is harmless but does nothing (or less than its name says), e.g.
  ``batching.max_queue_delay_ms`` for the ``llm`` engine.

``sluice validate`` prints both; ``sluice run`` refuses the errors and logs the warnings at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sluice.config.connectors import check_connectors, connector_warnings
from sluice.config.pipeline import Pipeline
from sluice.config.section import changed_keys
from sluice.config.yaml_file import YamlPath

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

# batching keys and what they mean to a continuous engine (one that admits records as it has room)
_CONTINUOUS_BATCHING = {
    "max_queue_delay_ms": "does not apply: a record joins the running batch as soon as there is room",
    "max_batch_size": "only caps how many queued records join the running batch per step",
    "max_batch_tokens": "only caps the tokens of the records joining the running batch per step",
    "bucket_by": "only orders the queued records by length as they join the running batch",
    "bucket_width": "only orders the queued records by length as they join the running batch",
}


@dataclass
class Findings:
    """Problems (errors) and warnings, each one line naming the YAML path."""

    errors: list[tuple[YamlPath, str]] = field(default_factory=list)
    warnings: list[tuple[YamlPath, str]] = field(default_factory=list)


def check_applicable(pipeline: Pipeline, engine_options: Any, continuous: bool) -> Findings:
    """What of ``pipeline`` does not apply to its engine (``continuous``: driven by add/step, as ``llm``
    is) or its delivery mode. Pure: reads the validated models and which keys the file gave."""
    found = Findings()
    found.errors.extend(check_connectors(pipeline))
    found.warnings.extend(connector_warnings(pipeline))
    _delivery(pipeline, found)
    engine = pipeline.engine.type
    if continuous:
        _continuous_batching(pipeline, engine, found)
    elif pipeline.sink.output.preserve_order:
        found.warnings.append((("sink", "output", "preserve_order"),
                               f"applies to continuous engines (llm) only; engine {engine} keeps each "
                               "partition's order by itself unless batching.bucket_by is tokens"))
    device = getattr(engine_options, "device", None)
    if isinstance(device, str) and not _DEVICE.match(device):
        found.errors.append((("engine", "device"), f"expected auto, cpu, cuda or cuda:N, got {device[:40]!r}"))
    return found


def _delivery(p: Pipeline, found: Findings) -> None:
    if p.delivery == "at_least_once" and changed_keys(p.exactly_once):
        found.errors.append((("exactly_once",), "applies only with delivery: exactly_once, and delivery is "
                                                "at_least_once here: add 'delivery: exactly_once', or remove "
                                                "this section"))


def _continuous_batching(p: Pipeline, engine: str, found: Findings) -> None:
    given = changed_keys(p.batching)
    if "latency_target_ms" in given:
        found.errors.append((("batching", "latency_target_ms"),
                             f"does not apply to engine {engine}, which schedules its own running batch; size "
                             f"it with engine.max_num_seqs and engine.max_num_batched_tokens"))
    for key, meaning in _CONTINUOUS_BATCHING.items():
        if key in given:
            found.warnings.append((("batching", key), f"with engine {engine}, {meaning} (engine.max_num_seqs "
                                                      "and engine.max_num_batched_tokens size that batch)"))
