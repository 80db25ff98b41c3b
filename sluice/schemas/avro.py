"""``codec.format: avro``: Avro records with Schema Registry framing, read and written by confluent-kafka's
AvroDeserializer and AvroSerializer (fastavro underneath).

The output schema, unless ``sink.output.schema_file`` gives one, is the input's record schema plus the
result field, its Avro type derived from the engine's result schema (sluice/schemas/result_types.py);
it is registered under the output subject once per input schema id.
"""

from __future__ import annotations

from typing import Any

from sluice.schemas.derived_format import DerivedSchemaFormat
from sluice.schemas.result_types import avro_type, merged_avro_record, result_avro_record
from sluice.schemas.subjects import no_subject


class AvroFormat(DerivedSchemaFormat):
    schema_type = "AVRO"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        self._deserializer = AvroDeserializer(self.client, conf={"subject.name.strategy": no_subject})

    def deserialize(self, value: bytes) -> Any:
        return self._deserializer(value, None)

    def derive(self, input_schema: Any, result_schema: dict[str, Any]) -> dict[str, Any]:
        field = self.output.field
        result_type = avro_type(result_schema, name=field)
        if self.output.mode == "merge":
            return merged_avro_record(input_schema, field, result_type)
        named = input_schema if isinstance(input_schema, dict) else {}
        name = str(named.get("name", "Record")).rsplit(".", 1)[-1]
        return result_avro_record(f"{name}Result", named.get("namespace"), field, result_type)

    def record_name(self, out_schema: dict[str, Any]) -> str | None:
        """The full name, as the serializer's record strategies use it."""
        name, namespace = str(out_schema.get("name", "")), out_schema.get("namespace")
        if not name:
            return None
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def serializer(self, schema: Any) -> Any:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        return AvroSerializer(self.client, schema, conf={"auto.register.schemas": True, **self.out.serializer_conf})
