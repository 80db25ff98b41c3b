"""Sources, sinks, codecs and delivery modes that do not go together are refused at load, each with the YAML path
of the setting to change and what to do instead; those that do go together load."""

from __future__ import annotations

import pytest

from sluice.config import ConfigError, parse_pipeline

ENGINE = 'engine: {type: python, function: "examples.functions.text:shout"}\n'
KAFKA_IN = 'source: {kafka: {bootstrap_servers: "127.0.0.1:9092", topics: [in], group_id: g}}\n'
FILES_IN = 'source: {file: {path: "data/*.parquet"}}\n'
JSONL_IN = "source: {file: {path: requests.jsonl}}\n"
KAFKA_OUT = "sink: {kafka: {topic: out}}\n"
FILE_OUT = "sink: {file: {path: out.parquet}}\n"


def problems(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(text, environ={})
    return str(info.value)


@pytest.mark.parametrize(("text", "fragments"), [
    (FILES_IN + ENGINE + FILE_OUT + "delivery: exactly_once\n", ["delivery (line 4)", "use at_least_once"]),
    (FILES_IN + ENGINE + KAFKA_OUT.replace("{topic: out}", '{topic: out, bootstrap_servers: "b:9092"}'),
     ["source.file.checkpoint (line 1)", "is required with a Kafka sink"]),
    (FILES_IN.replace('"}', '", checkpoint: c}') + ENGINE + KAFKA_OUT,
     ["sink.kafka.bootstrap_servers (line 3)", "is required with a file source"]),
    (KAFKA_IN + ENGINE + FILE_OUT, ["sink.file.format (line 3)", "JSON lines only"]),
    (FILES_IN + ENGINE + FILE_OUT + "codec: {format: raw}\n", ["codec.format (line 4)", "use format json"]),
    (FILES_IN + ENGINE + FILE_OUT + "dead_letter: {topic: dlq}\n",
     ["dead_letter.topic (line 4)", "a file sink writes its dead letters to a file"]),
    (FILES_IN + ENGINE + FILE_OUT + "dead_letter: {path: out.parquet}\n",
     ["dead_letter.path (line 4)", "a file of their own"]),
    (KAFKA_IN + ENGINE + KAFKA_OUT + "dead_letter: {path: dl.jsonl}\n",
     ["dead_letter.path (line 4)", "dead_letter.topic (line 4)", "is required with a Kafka sink"]),
    (FILES_IN + ENGINE + FILE_OUT + 'codec: {format: avro, schema_registry: {url: "http://r:8081"}}\n',
     ["codec.format (line 4)", "needs a Kafka source and sink"]),
    (JSONL_IN + ENGINE + "sink: {file: {path: results.jsonl}}\ncodec: {format: openai-batch}\n",
     ["codec.format (line 4)", "for engine type llm, not python"]),
    (JSONL_IN + "engine: {type: llm, model: m.gguf}\nsink: {file: {path: r.jsonl}, output: {field: x}}\n"
     "codec: {format: openai-batch}\n", ["sink.output.field (line 3)", "OpenAI's batch output format"]),
    (FILES_IN + "engine: {type: llm, model: m.gguf}\nsink: {file: {path: r.jsonl}}\ncodec: {format: openai-batch}\n",
     ["source.file.format (line 1)", "openai-batch files are JSON lines"]),
    ("source: {file: {path: data/in.csv}}\n" + ENGINE + FILE_OUT, ["source.file (line 1)", "set format: jsonl"]),
    ("source: {kafka: {bootstrap_servers: b, topics: [t], group_id: g}, file: {path: a.jsonl}}\n" + ENGINE + FILE_OUT,
     ["source (line 1)", "exactly one of 'kafka' or 'file' (got kafka and file)"]),
    ("source: {}\n" + ENGINE + "sink: {}\n", ["source (line 1)", "sink (line 3)", "(got neither)"]),
])
def test_what_does_not_go_together_is_refused_naming_the_setting(text: str, fragments: list[str]) -> None:
    message = problems(text)
    for fragment in fragments:
        assert fragment in message, message


def test_what_goes_together_loads_with_the_defaults_a_file_run_needs() -> None:
    p = parse_pipeline(FILES_IN + ENGINE + FILE_OUT, environ={}).pipeline
    assert p.sink.destination == "out.parquet" and p.dead_letter_destination == "out.dead-letters.jsonl"
    assert p.source.describe() == "data/*.parquet" and p.sink.file is not None
    assert p.sink.file.resolved_format("parquet") == "parquet"
    jsonl = parse_pipeline(FILES_IN + ENGINE + "sink: {file: {path: out/tagged}}\n", environ={}).pipeline
    assert jsonl.sink.file is not None and jsonl.sink.file.resolved_format("parquet") == "parquet"  # the source's
    topic = parse_pipeline(FILES_IN.replace('"}', '", checkpoint: run.checkpoint}') + ENGINE +
                           KAFKA_OUT.replace("{topic: out}", '{topic: out, bootstrap_servers: "b:9092"}'),
                           environ={}).pipeline
    assert topic.dead_letter is None and topic.sink.destination == "out"
    to_file = parse_pipeline(KAFKA_IN + ENGINE + "sink: {file: {path: export.jsonl}}\n", environ={}).pipeline
    assert to_file.dead_letter_destination == "export.dead-letters.jsonl"
    batch = parse_pipeline(JSONL_IN + "engine: {type: llm, model: m.gguf}\nsink: {file: {path: results.jsonl}}\n"
                           "codec: {format: openai-batch}\n", environ={}).pipeline
    assert batch.output_format() == "openai-batch"


def test_settings_that_do_nothing_with_files_are_warned_about() -> None:
    loaded = parse_pipeline(JSONL_IN + ENGINE + "sink: {file: {path: out.jsonl, rows_per_file: 10}, output: "
                            "{key: none}}\n", environ={})
    assert len(loaded.warnings) == 2
    rows, key = loaded.warnings
    assert rows.startswith("sink.file.rows_per_file (line 3)") and "Parquet outputs only" in rows
    assert key.startswith("sink.output.key (line 3)") and "no record keys" in key
    assert parse_pipeline(FILES_IN + ENGINE + FILE_OUT.replace("out.parquet}", "out.parquet, rows_per_file: 10}"),
                          environ={}).warnings == ()
