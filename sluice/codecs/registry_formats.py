"""Builds the Schema Registry format of a pipeline (avro, protobuf, json_schema): one module per format,
chosen here once, by ``codec.format``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.codecs.schema_format import SchemaFormat, SchemaSetupError
from sluice.config import REGISTRY_FORMATS, Pipeline


def build_schema_format(pipeline: Pipeline, result_schema: dict[str, Any] | None,
                        base_dir: Path) -> SchemaFormat | None:
    """The started format (client connected, fixed output schemas registered, the input topics' latest
    schemas' outputs derived and checked), or None for json and raw. Raises SchemaSetupError."""
    codec = pipeline.codec
    if codec.format not in REGISTRY_FORMATS:
        return None
    assert codec.schema_registry is not None  # the config requires it for these formats
    from sluice.codecs.schema_registry import connect

    try:
        import confluent_kafka.schema_registry  # noqa: F401 - its extras: httpx, fastavro, protobuf, jsonschema
        import fastavro  # noqa: F401
        import google.protobuf  # noqa: F401
        import jsonschema  # noqa: F401
    except ImportError as err:
        raise SchemaSetupError(f"codec.format {codec.format} needs confluent-kafka's Schema Registry extras ({err}); "
                               "install them with: pip install 'sluice[schema-registry]'") from None
    try:
        client = connect(codec.schema_registry)
    except (ValueError, TypeError, OSError) as err:  # bad URL, unreadable TLS files
        raise SchemaSetupError(f"codec.schema_registry: {err}") from None
    args = (client, codec, pipeline.sink.output, pipeline.sink.destination, pipeline.output_format() == "json",
            result_schema, base_dir)
    schema_format: SchemaFormat
    if codec.format == "avro":
        from sluice.codecs.avro import AvroFormat

        schema_format = AvroFormat(*args)
    elif codec.format == "json_schema":
        from sluice.codecs.json_schema import JsonSchemaFormat

        schema_format = JsonSchemaFormat(*args)
    else:
        from sluice.codecs.protobuf import ProtobufFormat

        assert codec.message_type is not None  # the config requires it for protobuf
        schema_format = ProtobufFormat(*args, message_type=codec.message_type)
    assert pipeline.source.kafka is not None  # registry formats read Kafka records (config/connectors.py)
    schema_format.start(list(pipeline.source.kafka.topics))
    return schema_format
