"""Run a pipeline file over a list of records, in memory: its real engine, codec, batching, dead letters and
delivery, with no broker -- what a user's own tests of a pipeline need.

Guarantees of :func:`run_pipeline`: every record given ends in exactly one of ``outputs`` or
``dead_letters`` (or the run raises); the engine is started from the pipeline's ``engine`` section as
``sluice run`` starts it and closed afterwards; nothing is left running. Records are produced to partition 0
of the pipeline's first input topic, in order, with offsets from 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.config import LoadedPipeline, load_pipeline
from sluice.operator.build import build_codec, start_engine
from sluice.operator.record import Headers
from sluice.operator.runner import Runner, RunSummary
from sluice.testing.memory_kafka import MemorySink, MemorySource, Produced


class PipelineRunError(Exception):
    """The pipeline cannot run in memory (it reads or writes files, say); the message says why."""


@dataclass(frozen=True)
class PipelineRun:
    """What a run produced: the output records and the dead letters, in the order they were produced."""

    outputs: list[Produced]
    dead_letters: list[Produced]
    summary: RunSummary

    def output_values(self) -> list[Any]:
        """Each output's value read as JSON (``None`` for a record without a value)."""
        return [None if r.value is None else json.loads(r.value) for r in self.outputs]

    def dead_letter_reasons(self) -> list[str]:
        """Each dead letter's reason (its ``sluice.error.message`` header)."""
        return [r.header("sluice.error.message") for r in self.dead_letters]


def as_bytes(value: Any) -> bytes | None:
    """A record value as Kafka holds it: bytes as given, text UTF-8 encoded, anything else as JSON."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


def run_pipeline(pipeline: str | Path | LoadedPipeline, values: Sequence[Any], *,
                 keys: Sequence[bytes | None] | None = None, environ: Mapping[str, str] | None = None) -> PipelineRun:
    """Run ``pipeline`` (a pipeline file, or one already loaded) over ``values`` until every record is
    answered. ``keys``: one record key per value. ``environ``: what ``${VAR}`` in the file reads (default:
    the process environment)."""
    loaded = pipeline if isinstance(pipeline, LoadedPipeline) else load_pipeline(pipeline, environ)
    p = loaded.pipeline
    if p.source.kafka is None or p.sink.kafka is None:
        raise PipelineRunError("run_pipeline runs Kafka-to-Kafka pipelines; a file job runs as it is, with "
                               "`sluice run` over small input files")
    if keys is not None and len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys for {len(values)} values")
    records: list[tuple[bytes | None, bytes | None, Headers]] = [
        (as_bytes(v), None if keys is None else keys[i], []) for i, v in enumerate(values)]
    engine, started = start_engine(loaded)
    try:
        sink = MemorySink()
        source = MemorySource(records, topic=p.source.kafka.topics[0], bounded=True)  # ends when all are answered
        runner = Runner(loaded, source, sink, engine, codec=build_codec(loaded, engine), model=started.identity,
                        warmup_s=started.warmup_s)  # fmt: skip
        summary = runner.run()
    finally:
        engine.close()
    if summary.error is not None:
        raise PipelineRunError(f"the pipeline stopped: {summary.error}")
    dead_topic = p.dead_letter.topic if p.dead_letter is not None else None
    run = PipelineRun(outputs=sink.on(p.sink.kafka.topic), dead_letters=sink.on(dead_topic) if dead_topic else [],
                      summary=summary)
    answered = sorted(r.input_offset for r in run.outputs + run.dead_letters)
    if answered != list(range(len(records))):  # the guarantee, checked: each record answered exactly once
        missing = sorted(set(range(len(records))) - set(answered))
        raise PipelineRunError(f"records without exactly one answer: missing {missing[:10]}, answered "
                               f"{len(answered)} times for {len(records)} records")
    return run
