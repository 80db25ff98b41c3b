"""The YAML pipeline file as typed, validated data.

One call, :func:`load_pipeline`, reads a file, interpolates ``${VAR}`` / ``${VAR:default}`` from the
environment, and validates the result into :class:`Pipeline`. Every problem becomes a
:class:`ConfigError` whose lines name the YAML path, its line in the file, and what was expected -- never a
traceback. Unknown keys are errors everywhere (a misspelt option must not be silently ignored).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sluice.config.yaml_file import YamlPath, YamlProblem, load_yaml, read_text
from sluice.engines import registry
from sluice.operator.batcher import BatchPolicy

_MAX_PROBLEMS = 20  # problems listed; a file with more is not a pipeline with a few mistakes


class ConfigError(Exception):
    """A pipeline file is not valid. ``str(err)`` is the message to show a user, one problem per line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        if len(problems) > _MAX_PROBLEMS:  # the first ones say what is wrong; hundreds would bury them
            problems = [*problems[:_MAX_PROBLEMS], f"... and {len(problems) - _MAX_PROBLEMS} more problems"]
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------- sections


class Sasl(_Strict):
    """SASL authentication. The password is a SecretStr: it prints as '**********' everywhere."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str = Field(min_length=1)
    password: SecretStr  # write ${KAFKA_PASSWORD}: from the environment (a Kubernetes Secret), not the file


class Tls(_Strict):
    """TLS to the brokers. ``tls: {}`` trusts the system's CAs. Paths are relative to the working directory."""

    ca_location: str | None = None  # PEM file of the CA that signed the brokers' certificates
    certificate_location: str | None = None  # client certificate (mutual TLS), PEM
    key_location: str | None = None  # its private key, PEM
    key_password: SecretStr | None = None  # if that key is encrypted
    verify_hostname: bool = True  # check the broker's certificate names the host connected to

    @model_validator(mode="after")
    def _pair(self) -> Tls:
        if (self.certificate_location is None) != (self.key_location is None):
            raise ValueError("certificate_location and key_location go together (mutual TLS needs both)")
        return self


class KafkaSecurity(_Strict):
    """How a client proves who it is and protects the connection: SASL, TLS, or both (SASL_SSL)."""

    sasl: Sasl | None = None
    tls: Tls | None = None

    @model_validator(mode="after")
    def _something(self) -> KafkaSecurity:
        if self.sasl is None and self.tls is None:
            raise ValueError("give 'sasl', 'tls' or both (or leave 'security' out for a plaintext cluster)")
        return self


class KafkaSource(_Strict):
    bootstrap_servers: str = Field(min_length=1)
    topics: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    group_id: str = Field(min_length=1)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    security: KafkaSecurity | None = None
    # librdkafka settings passed through unchanged (timeouts...; they override `security`). Values may come
    # from ${ENV}.
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)


class Source(_Strict):
    kafka: KafkaSource


class BasicAuth(_Strict):
    """HTTP basic authentication to a Schema Registry (an API key and secret on Confluent Cloud)."""

    username: str = Field(min_length=1)
    password: SecretStr  # write ${SCHEMA_REGISTRY_PASSWORD}: from the environment, not the file


class RegistryTls(_Strict):
    """TLS to the Schema Registry (an https URL). Leave out ``ca_location`` to trust the system's CAs."""

    ca_location: str | None = None  # PEM file of the CA that signed the registry's certificate
    certificate_location: str | None = None  # client certificate (mutual TLS), PEM
    key_location: str | None = None  # its private key, PEM
    key_password: SecretStr | None = None  # if that key is encrypted

    @model_validator(mode="after")
    def _pair(self) -> RegistryTls:
        if self.key_location is not None and self.certificate_location is None:
            raise ValueError("key_location needs certificate_location (mutual TLS needs both)")
        return self


class SchemaRegistry(_Strict):
    """A Confluent-compatible Schema Registry, for the avro, protobuf and json_schema formats."""

    url: str = Field(min_length=1)  # http(s)://host:port[/path]; several, comma-separated, are tried in turn
    basic_auth: BasicAuth | None = None
    tls: RegistryTls | None = None
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)  # one HTTP request; a hung call never blocks
    # How long Sluice keeps retrying (with backoff) while the registry is down, slow or refuses the
    # credentials; the partitions waiting on it stay paused and uncommitted. Past this the operator stops.
    max_outage_s: float = Field(default=300.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        for url in value.split(","):
            if not url.strip().startswith(("http://", "https://")):
                raise ValueError(f"expected http://host:port or https://host:port, got {url.strip()!r}")
        return value


REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")


class Codec(_Strict):
    format: Literal["json", "raw", "avro", "protobuf", "json_schema"] = "json"
    # Dotted path of the model input inside a JSON record (e.g. "review.text"), or "." for the whole
    # record (an LLM prompt template filling several fields, say). Ignored for raw records, whose whole
    # value (UTF-8) is the input. For avro, protobuf and json_schema: a path into the decoded record.
    input_field: str = Field(default="text", min_length=1)
    # Bounds on one record, checked before decoding: a record over either is dead-lettered with the reason.
    # 4 MiB is four times Kafka's default message size; the depth bound keeps every recursive step after
    # decoding (encoding the output, the engine's own code) far from Python's recursion limit.
    max_record_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    max_depth: int = Field(default=128, ge=1, le=512)
    schema_registry: SchemaRegistry | None = None  # required by avro, protobuf and json_schema
    # protobuf: the generated message class of the input records, "package.module_pb2:Message"
    message_type: str | None = None

    @model_validator(mode="after")
    def _registry_formats(self) -> Codec:
        if self.format in REGISTRY_FORMATS and self.schema_registry is None:
            raise ValueError(f"format {self.format} needs schema_registry: {{url: ...}}")
        if self.format == "protobuf" and self.message_type is None:
            raise ValueError("format protobuf needs message_type: 'package.module_pb2:Message' (the input's class)")
        if self.message_type is not None and self.format != "protobuf":
            raise ValueError("message_type is for format protobuf only")
        if self.message_type is not None:
            _check_import_path(self.message_type)
        return self


def _check_import_path(value: str) -> None:
    module, _, attr = value.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'package.module:Name', got {value!r}")


class Batching(_Strict):
    max_batch_size: int = Field(default=32, ge=1, le=100_000)
    max_queue_delay_ms: float = Field(default=10.0, ge=0, le=600_000)
    bucket_by: Literal["none", "tokens"] = "none"  # tokens: group records of similar length
    max_batch_tokens: int | None = Field(default=None, ge=1)  # cap on batch size x padded length
    # Width of a length bucket when bucket_by is tokens: records whose lengths round up to the same
    # multiple of this share a batch.
    bucket_width: int = Field(default=16, ge=1)
    # Adaptive mode: the latency (queue wait + service) records should stay under. Sluice then learns the
    # engine's service time and the arrival rate and chooses each batch's size (up to max_batch_size);
    # max_queue_delay_ms is not used.
    latency_target_ms: float | None = Field(default=None, gt=0)

    def policy(self) -> BatchPolicy:
        """The batcher's policy. In adaptive mode the target stands in for the delay: the policy then
        decides when a batch goes, and a record is never held past the target by the batcher itself."""
        delay_ms = self.latency_target_ms if self.latency_target_ms is not None else self.max_queue_delay_ms
        return BatchPolicy(max_batch_size=self.max_batch_size, max_queue_delay_s=delay_ms / 1000,
                           bucket_by_length=self.bucket_by == "tokens", max_batch_tokens=self.max_batch_tokens,
                           bucket_width=self.bucket_width)


class EngineSection(BaseModel):
    """``engine: {type: NAME, ...options}``; the options are validated by the engine type's own model."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str

    @field_validator("type")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in registry.known_types():
            raise ValueError(f"unknown engine type {value!r}; expected one of {registry.known_types()}")
        return value

    def raw_options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class KafkaSink(_Strict):
    topic: str = Field(min_length=1)
    bootstrap_servers: str | None = None  # defaults to the source's
    # Defaults to the source's when the sink uses the source's cluster (no bootstrap_servers of its own);
    # a sink on another cluster never gets the source's credentials.
    security: KafkaSecurity | None = None
    config: dict[str, str | int | float | bool] = Field(default_factory=dict)


class Output(_Strict):
    # merge: the input JSON object plus the result under `field`; result: {field: result} only.
    mode: Literal["merge", "result"] = "merge"
    field: str = Field(default="result", min_length=1)
    # Key of the output record: "input" keeps the input key, "none" drops it, "field:a.b" takes it from
    # the input record.
    key: str = "input"
    # Continuous engines (llm) produce each result the moment it is ready, so records of a partition may
    # leave out of input order; true holds results back to leave in input order per partition.
    preserve_order: bool = False
    # Output format; default: the input's (json for raw input). avro / json_schema / protobuf outputs are
    # registered in the codec's schema registry and need that same input format.
    format: Literal["json", "avro", "protobuf", "json_schema"] | None = None
    # avro / json_schema: the output schema, instead of the input's record schema plus the result field
    # (relative to the pipeline file)
    schema_file: str | None = None
    # protobuf: the generated class of the output messages, "package.module_pb2:Message"
    message_type: str | None = None
    # Subject the output schema is registered under: topic (<topic>-value, Confluent's TopicNameStrategy),
    # record (the record's full name) or topic_record (<topic>-<record full name>)
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if value in ("input", "none") or (value.startswith("field:") and len(value) > 6):
            return value
        raise ValueError("expected 'input', 'none' or 'field:<dotted.path>'")


class Sink(_Strict):
    kafka: KafkaSink
    output: Output = Field(default_factory=Output)


class DeadLetter(_Strict):
    topic: str = Field(min_length=1)
    # Stop once this many records in a row have failed (none reached the output topic in between): that
    # points at a broken engine, codec or producer rather than at bad records. null: never stop.
    max_consecutive_failures: int | None = Field(default=1000, ge=1)


class Runtime(_Strict):
    drain_timeout_s: float = Field(default=30.0, gt=0)  # SIGTERM: finish in-flight work within this
    max_in_flight: int = Field(default=10_000, ge=1)  # records between poll and delivery report
    commit_interval_ms: int = Field(default=1000, ge=10)  # how often stored offsets are committed


class ExactlyOnce(_Strict):
    """Settings of ``delivery: exactly_once`` (a transactional producer, offsets inside the transaction)."""

    # Must be unique per running process and stable across its restarts (so a restart fences its zombie
    # and aborts the transaction it left open). Default: sluice-<group_id>-<hostname>-<slot>, the slot being
    # the lowest free one among this group's processes on the host (sluice/operator/instance.py).
    transactional_id: str | None = Field(default=None, min_length=1)
    transaction_interval_ms: int = Field(default=500, ge=10)  # commit at least this often...
    transaction_max_batches: int = Field(default=64, ge=1)  # ...or after this many batches
    transaction_timeout_ms: int = Field(default=60_000, ge=1000)  # the broker aborts a transaction open longer
    max_batch_time_s: float = Field(default=10.0, gt=0)  # the longest one engine batch may take

    @model_validator(mode="after")
    def _fits_in_timeout(self) -> ExactlyOnce:
        # A transaction stays open for the interval, plus the batch running when the commit is due, plus
        # the commit itself (about one more batch time of margin).
        needed_ms = self.transaction_interval_ms + 2 * self.max_batch_time_s * 1000
        if self.transaction_timeout_ms <= needed_ms:
            raise ValueError(f"transaction_timeout_ms ({self.transaction_timeout_ms}) must exceed "
                             f"transaction_interval_ms + 2 x max_batch_time_s = {needed_ms:.0f} ms, or the broker "
                             "could abort a transaction while a batch is still running")
        return self


class Tracing(_Strict):
    # none: no tracing work at all, input headers (traceparent included) pass through unchanged.
    exporter: Literal["none", "console", "otlp"] = "none"
    endpoint: str | None = None  # otlp: collector address; default per protocol (localhost:4317 / :4318)
    protocol: Literal["grpc", "http"] = "grpc"
    # Share of new traces recorded; a record with a traceparent follows its sampled flag instead. Every
    # output gets a traceparent in its input's trace either way; only sampled records cost SDK spans
    # (about 50 µs each in Python), so the default keeps them near 0.05 µs per record: 100 traces/s at
    # 100k records/s.
    sample_ratio: float = Field(default=0.001, ge=0, le=1)


class Metrics(_Strict):
    enabled: bool = False  # serve /metrics, /healthz and /readyz over HTTP
    host: str = "127.0.0.1"  # loopback unless opened up on purpose (0.0.0.0 in a container)
    port: int = Field(default=9464, ge=0, le=65535)  # 0 picks a free port (tests)


class Telemetry(_Strict):
    tracing: Tracing = Field(default_factory=Tracing)
    metrics: Metrics = Field(default_factory=Metrics)
    status: Literal["auto", "off"] = "auto"  # auto: a live line on a terminal, a log line every 10 s otherwise

    @field_validator("status", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false


class Pipeline(_Strict):
    name: str = "pipeline"
    source: Source
    codec: Codec = Field(default_factory=Codec)
    batching: Batching = Field(default_factory=Batching)
    engine: EngineSection
    sink: Sink
    dead_letter: DeadLetter | None = None
    delivery: Literal["at_least_once", "exactly_once"] = "at_least_once"
    exactly_once: ExactlyOnce = Field(default_factory=ExactlyOnce)
    runtime: Runtime = Field(default_factory=Runtime)
    telemetry: Telemetry = Field(default_factory=Telemetry)

    def output_format(self) -> str:
        """The output records' format: ``sink.output.format``, else the input's (json for raw input)."""
        given = self.sink.output.format
        return given if given is not None else ("json" if self.codec.format == "raw" else self.codec.format)

    @model_validator(mode="after")
    def _output_format_fits(self) -> Pipeline:
        out, given = self.output_format(), self.sink.output
        if out in REGISTRY_FORMATS and out != self.codec.format:
            raise ValueError(f"sink.output.format {out} needs codec.format {out} (its schema registry and "
                             f"schemas); with codec.format {self.codec.format}, write json")
        if given.message_type is not None and out != "protobuf":
            raise ValueError("sink.output.message_type is for the protobuf output format only")
        if out == "protobuf" and given.message_type is None:
            raise ValueError("sink.output.format protobuf needs sink.output.message_type: "
                             "'package.module_pb2:Message' (the output's class)")
        if given.message_type is not None:
            _check_import_path(given.message_type)
        if given.schema_file is not None and out not in ("avro", "json_schema"):
            raise ValueError("sink.output.schema_file is for the avro and json_schema output formats")
        return self

    @model_validator(mode="before")
    @classmethod
    def _sink_inherits_security(cls, data: Any) -> Any:
        """The sink writes to the source's cluster unless it names its own: then it uses the source's
        security too. Copied only when valid, so a mistake there is reported once, at the source."""
        try:
            source_kafka, sink_kafka = data["source"]["kafka"], data["sink"]["kafka"]
            security = source_kafka["security"]
        except (KeyError, TypeError):
            return data
        if not isinstance(sink_kafka, dict) or "security" in sink_kafka or "bootstrap_servers" in sink_kafka:
            return data
        try:
            KafkaSecurity.model_validate(security)
        except ValidationError:
            return data
        return {**data, "sink": {**data["sink"], "kafka": {**sink_kafka, "security": security}}}


@dataclass(frozen=True)
class LoadedPipeline:
    """A validated pipeline plus its validated engine options and where it came from."""

    pipeline: Pipeline
    engine_options: Any  # instance of the engine type's options model
    base_dir: Path  # directory of the pipeline file; relative paths in it resolve against this


# ------------------------------------------------------------------------------------------ loading

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")
_Path = YamlPath
_MAX_SHOWN = 80  # characters of a value, key or message shown in an error
log = logging.getLogger(__name__)


def load_pipeline(path: str | Path, environ: Mapping[str, str] | None = None) -> LoadedPipeline:
    """Read, interpolate and validate a pipeline file. Raises ConfigError with user-facing messages."""
    source = str(path)
    try:
        text = read_text(path)
    except YamlProblem as err:
        raise ConfigError(source, [str(err)]) from None
    return parse_pipeline(text, source=source, environ=os.environ if environ is None else environ,
                          base_dir=Path(path).resolve().parent)


def parse_pipeline(text: str, *, source: str = "<pipeline>", environ: Mapping[str, str] | None = None,
                   base_dir: Path | None = None) -> LoadedPipeline:
    """Validate pipeline YAML text; see :func:`load_pipeline`. Raises ConfigError, and nothing else: the
    YAML is read within bounds (sluice/config/yaml_file.py), and an error no check foresaw still becomes one
    line (naming it a bug) rather than a traceback."""
    try:
        return _parse(text, source, os.environ if environ is None else environ, base_dir)
    except ConfigError:
        raise
    except Exception as err:  # a bug in a validator, say: still one line for the user
        log.debug("validating %s failed unexpectedly", source, exc_info=True)
        raise ConfigError(source, [f"cannot validate the file: {type(err).__name__}: {_short(str(err))} (a bug "
                                   "in Sluice or an engine: please report it, with the file)"]) from None


def _parse(text: str, source: str, environ: Mapping[str, str], base_dir: Path | None) -> LoadedPipeline:
    try:
        data, lines = load_yaml(text)
    except YamlProblem as err:
        raise ConfigError(source, [str(err)]) from None
    if data is None:
        raise ConfigError(source, ["the file is empty; expected a mapping with 'source', 'engine' and 'sink'"])
    if not isinstance(data, dict):
        raise ConfigError(source, [f"the top level is a {_kind(data)}; expected a mapping of sections"])
    # Top-level keys starting with "x-" hold anchors for the rest of the file (`x-kafka: &kafka {...}`, then
    # `<<: *kafka`), as in Docker Compose files: they are not settings, so they are not validated.
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}

    problems: list[str] = []
    data = _interpolate(data, (), environ, problems, lines)
    if problems:
        raise ConfigError(source, problems)
    try:
        pipeline = Pipeline.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, _describe(err, (), lines)) from None

    try:
        engine_type = registry.lookup(pipeline.engine.type)
    except ImportError as err:
        raise ConfigError(source, [f"{_where(('engine', 'type'), lines)}: engine '{pipeline.engine.type}' is not "
                                   f"available in this installation ({err})"]) from None
    try:
        options = engine_type.options.model_validate(pipeline.engine.raw_options())
    except ValidationError as err:
        raise ConfigError(source, _describe(err, ("engine",), lines)) from None
    return LoadedPipeline(pipeline=pipeline, engine_options=options, base_dir=base_dir or Path.cwd())


def _interpolate(value: Any, path: _Path, environ: Mapping[str, str], problems: list[str],
                 lines: dict[_Path, int]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, (*path, str(k)), environ, problems, lines) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, (*path, i), environ, problems, lines) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problems.append(f"{_where(path, lines)}: environment variable {name} is not set "
                        f"(set it, or give a default as ${{{name}:value}})")
        return ""

    return _ENV.sub(substitute, value)


# librdkafka keys and Sluice fields whose values are secrets (sasl.password, ssl.key.password, ...)
_SECRET_KEY = re.compile(r"password|secret|token|jaas|credential|private|ssl\.key", re.IGNORECASE)


def _describe(err: ValidationError, prefix: _Path, lines: dict[_Path, int]) -> list[str]:
    problems = []
    for e in err.errors():
        loc: _Path = (*prefix, *(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
        kind = e["type"]
        # a secret's value (even a wrong one) never reaches a message
        secret = any(isinstance(p, str) and _SECRET_KEY.search(p) for p in loc)
        shown = "<redacted>" if secret else _short(repr(e.get("input")))
        if kind == "extra_forbidden":
            msg = f"unknown key '{_short(str(loc[-1]))}'; check the spelling against the pipeline reference in the README"
        elif kind == "missing":
            msg = "is required but missing"
        elif kind in ("int_parsing", "int_type", "int_from_float"):
            msg = f"expected an integer, got {shown}"
        elif kind in ("float_parsing", "float_type"):
            msg = f"expected a number, got {shown}"
        elif kind in ("string_type",):
            msg = f"expected a string, got {_kind(e['input'])}"
        elif kind in ("list_type",):
            msg = f"expected a list, got {_kind(e['input'])}"
        elif kind in ("model_type", "dict_type", "model_attributes_type"):
            msg = f"expected a mapping, got {_kind(e['input'])}"
        elif kind == "literal_error":
            msg = f"expected one of {e['ctx']['expected']}, got {shown}"
        else:
            msg = _short(e["msg"].removeprefix("Value error, "), 300)
            if "input" in e and not isinstance(e["input"], (dict, list)):
                msg += f" (got {shown})"
        problems.append(f"{_where(loc, lines)}: {msg}")
    return problems


def _where(loc: _Path, lines: dict[_Path, int]) -> str:
    dotted = ".".join(f"[{p}]" if isinstance(p, int) else _short(p, 40) for p in loc).replace(".[", "[") or "<top>"
    probe = loc
    while probe and probe not in lines:  # a missing key: report the line of its parent mapping
        probe = probe[:-1]
    line = lines.get(probe)
    return f"{dotted} (line {line})" if line else dotted


def _short(text: str, max_chars: int = _MAX_SHOWN) -> str:
    """``text`` on one line, cut to ``max_chars``: a message must stay short whatever the file holds."""
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
            bool: "boolean", type(None): "nothing (null)"}.get(type(value), type(value).__name__)
