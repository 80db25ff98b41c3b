"""Which sources, sinks, codecs and delivery modes go together.

Each section validates on its own; here one section's choice rules out another's. Every rule is an error with
the YAML path of the setting to change, and says what to do instead:

* ``delivery: exactly_once`` needs Kafka on both sides: its transactions commit the consumer's offsets with
  the outputs. A file source or sink is at-least-once, resumable from its checkpoint (docs/bounded-runs.md);
* ``dead_letter``: a ``topic`` with a Kafka sink, a ``path`` (or the default beside the output) with a file
  sink;
* a file source feeding a Kafka topic keeps its checkpoint where ``source.file.checkpoint`` says (there is
  no output file to keep it beside);
* a file sink fed by a Kafka topic writes JSON lines: each line is durable once written, so the consumer may
  commit past it; a Parquet part is durable only once closed;
* Parquet rows are read as JSON objects (``codec.format: json``); the Schema Registry formats read Kafka
  records; ``openai-batch`` lines are chat requests for the ``llm`` engine, answered in OpenAI's own format.
"""

from __future__ import annotations

from sluice.config.codec import REGISTRY_FORMATS
from sluice.config.pipeline import Pipeline
from sluice.config.section import changed_keys
from sluice.config.yaml_file import YamlPath

Problem = tuple[YamlPath, str]


def check_connectors(p: Pipeline) -> list[Problem]:
    """The rules above, as (YAML path, message) pairs. Pure: reads the validated model only."""
    found: list[Problem] = []
    _delivery(p, found)
    _dead_letter(p, found)
    _files(p, found)
    _formats(p, found)
    return found


def connector_warnings(p: Pipeline) -> list[Problem]:
    """Settings that do nothing with these sources and sinks (harmless, but not what their names say)."""
    found: list[Problem] = []
    sink = p.sink.file
    if sink is not None:
        if sink.resolved_format(p.source.file.file_format if p.source.file else None) == "jsonl":
            for key in sorted(changed_keys(sink) & {"rows_per_file", "roll_interval_s", "row_group_rows"}):
                found.append((("sink", "file", key), "applies to Parquet outputs only; a JSON-lines output is "
                                                     "one file, durable line by line"))
        if "key" in changed_keys(p.sink.output):
            found.append((("sink", "output", "key"), "a file has no record keys: the output rows hold values only"))
    if p.codec.format == "openai-batch" and "input_field" in changed_keys(p.codec):
        found.append((("codec", "input_field"), "does not apply to openai-batch: the whole line is the request"))
    return found


def _delivery(p: Pipeline, found: list[Problem]) -> None:
    if p.delivery == "exactly_once" and (p.source.kafka is None or p.sink.kafka is None):
        found.append((("delivery",), "exactly_once needs a Kafka source and a Kafka sink (a transaction commits the "
                                     "consumer's offsets with the outputs); with files, use at_least_once: a file run "
                                     "resumes from its checkpoint (docs/bounded-runs.md)"))


def _dead_letter(p: Pipeline, found: list[Problem]) -> None:
    dl = p.dead_letter
    if dl is None:
        return
    if p.sink.kafka is not None:
        if dl.path is not None:
            found.append((("dead_letter", "path"), "is for a file sink; with a Kafka sink, give dead_letter.topic"))
        if dl.topic is None:
            found.append((("dead_letter", "topic"), "is required with a Kafka sink: the topic failed records go to"))
    elif dl.topic is not None:
        found.append((("dead_letter", "topic"), "is for a Kafka sink; a file sink writes its dead letters to a file "
                                                "(dead_letter.path, default beside the output)"))
    elif p.sink.file is not None and p.dead_letter_destination == p.sink.file.path:
        found.append((("dead_letter", "path"), "is the output's own path; dead letters need a file of their own"))


def _files(p: Pipeline, found: list[Problem]) -> None:
    src, sink = p.source.file, p.sink.file
    if src is not None and p.sink.kafka is not None and p.sink.kafka.bootstrap_servers is None:
        found.append((("sink", "kafka", "bootstrap_servers"), "is required with a file source (there is no "
                                                              "source cluster to default to)"))
    if src is not None and sink is None and src.checkpoint is None:
        found.append((("source", "file", "checkpoint"), "is required with a Kafka sink: the state file that records "
                                                        "how far the input files are done (e.g. 'run.checkpoint')"))
    if src is not None and src.file_format == "parquet" and p.codec.format != "json":
        found.append((("codec", "format"), f"Parquet rows are read as JSON objects: use format json, not "
                                           f"{p.codec.format}"))
    if sink is not None:
        out_format = sink.resolved_format(src.file_format if src is not None else None)
        if src is None and out_format == "parquet":
            found.append((("sink", "file", "format"), "a Kafka topic is written to JSON lines only (a Parquet part "
                                                      "is durable only once closed, and the consumer commits as "
                                                      "records are delivered); write format: jsonl"))
        if p.codec.format == "openai-batch" and out_format != "jsonl":
            found.append((("sink", "file", "format"), "openai-batch answers are JSON lines, as OpenAI's batch "
                                                      "output file; write format: jsonl"))


def _formats(p: Pipeline, found: list[Problem]) -> None:
    fmt = p.codec.format
    if fmt in REGISTRY_FORMATS and (p.source.kafka is None or p.sink.kafka is None):
        found.append((("codec", "format"), f"{fmt} goes through a Schema Registry, for Kafka records: it needs a "
                                           "Kafka source and sink; files are read as json"))
    if fmt != "openai-batch":
        return
    if p.engine.type != "llm":
        found.append((("codec", "format"), f"openai-batch lines are chat requests for engine type llm, not "
                                           f"{p.engine.type}"))
    if p.source.file is not None and p.source.file.file_format != "jsonl":
        found.append((("source", "file", "format"), "openai-batch files are JSON lines; write format: jsonl"))
    for key in sorted(changed_keys(p.sink.output) - {"preserve_order"}):
        found.append((("sink", "output", key), "does not apply to codec.format openai-batch, whose output lines "
                                               "are OpenAI's batch output format"))
