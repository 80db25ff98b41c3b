"""``codec.format: json_schema``: JSON records with Schema Registry framing, validated against their JSON
Schema by confluent-kafka's JSONDeserializer and JSONSerializer.

The output schema, unless ``sink.output.schema_file`` gives one, is the input's object schema with the
result field added to its properties (the engine's result schema as it is), registered under the output
subject once per input schema id.
"""

from __future__ import annotations

from typing import Any

from sluice.codecs.derived_format import DerivedSchemaFormat
from sluice.codecs.result_types import merged_json_schema, result_json_schema
from sluice.codecs.subjects import no_subject


class JsonSchemaFormat(DerivedSchemaFormat):
    schema_type = "JSON"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        self._deserializer = JSONDeserializer(None, schema_registry_client=self.client,
                                              conf={"subject.name.strategy": no_subject})

    def deserialize(self, value: bytes) -> Any:
        return self._deserializer(value, None)

    def as_dict(self, record: Any) -> dict[str, Any]:
        return record if isinstance(record, dict) else {"input": record}

    def derive(self, input_schema: Any, result_schema: dict[str, Any]) -> dict[str, Any]:
        field = self.output.field
        if self.output.mode == "merge":
            return merged_json_schema(input_schema, field, result_schema)
        title = input_schema.get("title", "Record") if isinstance(input_schema, dict) else "Record"
        return result_json_schema(f"{title}Result", field, result_schema)

    def record_name(self, out_schema: dict[str, Any]) -> str | None:
        title = out_schema.get("title")
        return str(title) if title else None

    def serializer(self, schema: Any) -> Any:
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return JSONSerializer(schema, self.client, conf={"auto.register.schemas": True, **self.out.serializer_conf})
