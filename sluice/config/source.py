"""``source``: where records come from -- one key picks the implementation (``kafka`` or ``file``)."""

from __future__ import annotations

from pydantic import model_validator

from sluice.config.base import Section
from sluice.config.files import FileSource
from sluice.config.kafka import KafkaSource


class Source(Section):
    kafka: KafkaSource | None = None  # a consumer group on topics: runs until stopped (or --until-end)
    file: FileSource | None = None  # JSON-lines or Parquet files: the run ends once they are done

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        given = [k for k in ("kafka", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of 'kafka' or 'file' (got {' and '.join(given) or 'neither'})")
        return self

    def describe(self) -> str:
        """What is read, for ``sluice validate`` and logs."""
        if self.kafka is not None:
            return str(self.kafka.topics)
        assert self.file is not None
        return self.file.path
