"""``source``: where records come from -- one key picks the implementation (``kafka`` or ``file``)."""

from __future__ import annotations

from pydantic import model_validator

from sluice.config.files import FileSource
from sluice.config.kafka import KafkaSource
from sluice.config.section import Section, exactly_one_of


class Source(Section):
    kafka: KafkaSource | None = None
    """Read a consumer group's share of Kafka topics; runs until stopped (or `sluice run --until-end`)."""
    file: FileSource | None = None
    """Read JSON-lines or Parquet files; the run ends once they are done."""

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        exactly_one_of(self, "kafka", "file")
        return self

    @property
    def group_id(self) -> str | None:
        """The consumer group a Kafka source reads in; None for files (nothing is shared with other readers)."""
        return self.kafka.group_id if self.kafka is not None else None

    def describe(self) -> str:
        """What is read, for ``sluice validate`` and logs."""
        if self.kafka is not None:
            return str(self.kafka.topics)
        assert self.file is not None
        return self.file.path
