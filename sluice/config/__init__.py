"""The YAML pipeline file as typed, validated data, one module per section.

=============  ==========================================================================
module         what it holds
=============  ==========================================================================
source         ``source``: one of ``kafka`` or ``file``
kafka          ``source.kafka``, ``sink.kafka``, ``security`` (SASL, TLS)
files          ``source.file``, ``sink.file`` (JSON lines, Parquet)
codec          ``codec`` and its ``schema_registry``
batching       ``batching``
engine         ``engine`` (the type; its options are the engine type's own model)
sink           ``sink`` (one of ``kafka`` or ``file``), ``sink.output``, ``dead_letter``
delivery       ``exactly_once``, ``runtime``
telemetry      ``telemetry``
pipeline       the whole file, and the rules between sections
applies        options the chosen engine or delivery mode ignores: errors and warnings
connectors     which sources, sinks, codecs and delivery modes go together
loader         reading a file: :func:`load_pipeline`, :func:`parse_pipeline`
messages       :class:`ConfigError` and how a validation error reads to a user
yaml_file      the bounded YAML reader
=============  ==========================================================================

This layer imports nothing of the operator: the operator, the connectors and the codecs read these models.
``from sluice.config import X`` works for every public name below.
"""

from __future__ import annotations

from sluice.config.batching import Batching
from sluice.config.codec import REGISTRY_FORMATS, BasicAuth, Codec, RegistryTls, SchemaRegistry
from sluice.config.delivery import ExactlyOnce, Runtime
from sluice.config.engine import EngineSection
from sluice.config.files import FileSink, FileSource
from sluice.config.kafka import KafkaSecurity, KafkaSink, KafkaSource, Sasl, Tls
from sluice.config.loader import load_pipeline, parse_pipeline
from sluice.config.messages import ConfigError
from sluice.config.pipeline import LoadedPipeline, Pipeline
from sluice.config.section import Section
from sluice.config.sink import DeadLetter, Output, Sink
from sluice.config.source import Source
from sluice.config.telemetry import Metrics, Telemetry, Tracing

__all__ = [
    "REGISTRY_FORMATS", "BasicAuth", "Batching", "Codec", "ConfigError", "DeadLetter", "EngineSection",
    "ExactlyOnce", "FileSink", "FileSource", "KafkaSecurity", "KafkaSink", "KafkaSource", "LoadedPipeline", "Metrics", "Output",
    "Pipeline", "RegistryTls", "Runtime", "Sasl", "SchemaRegistry", "Section", "Sink", "Source", "Telemetry",
    "Tls", "Tracing", "load_pipeline", "parse_pipeline",
]
