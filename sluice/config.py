"""The YAML pipeline file as typed, validated data.

One call, :func:`load_pipeline`, reads a file, interpolates ``${VAR}`` / ``${VAR:default}`` from the
environment, and validates the result into :class:`Pipeline`. Every problem becomes a
:class:`ConfigError` whose lines name the YAML path, its line in the file, and what was expected -- never a
traceback. Unknown keys are errors everywhere (a misspelt option must not be silently ignored).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from sluice.engines import registry
from sluice.operator.batcher import BatchPolicy


class ConfigError(Exception):
    """A pipeline file is not valid. ``str(err)`` is the message to show a user, one problem per line."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
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


class Codec(_Strict):
    format: Literal["json", "raw"] = "json"
    # Dotted path of the model input inside a JSON record (e.g. "review.text"), or "." for the whole
    # record (an LLM prompt template filling several fields, say). Ignored for raw records, whose whole
    # value (UTF-8) is the input.
    input_field: str = Field(default="text", min_length=1)


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
_Path = tuple[str | int, ...]


def load_pipeline(path: str | Path, environ: Mapping[str, str] | None = None) -> LoadedPipeline:
    """Read, interpolate and validate a pipeline file. Raises ConfigError with user-facing messages."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(source, [f"cannot read the file: {err.strerror or err}"]) from None
    except UnicodeDecodeError as err:
        raise ConfigError(source, [f"the file is not UTF-8 text (byte {err.start}); save it as UTF-8"]) from None
    return parse_pipeline(text, source=source, environ=os.environ if environ is None else environ,
                          base_dir=Path(path).resolve().parent)


def parse_pipeline(text: str, *, source: str = "<pipeline>", environ: Mapping[str, str] | None = None,
                   base_dir: Path | None = None) -> LoadedPipeline:
    """Validate pipeline YAML text; see :func:`load_pipeline`."""
    environ = os.environ if environ is None else environ
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(source, ["the YAML is nested too deeply to be a pipeline"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(source, [f"{where}YAML syntax error: {problem}"]) from None
    if data is None:
        raise ConfigError(source, ["the file is empty; expected a mapping with 'source', 'engine' and 'sink'"])
    if not isinstance(data, dict):
        raise ConfigError(source, [f"the top level is a {_kind(data)}; expected a mapping of sections"])
    lines = _line_index(node)

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
        # base_dir: engine options may name files relative to the pipeline file (a JSON Schema, say)
        options = engine_type.options.model_validate(pipeline.engine.raw_options(),
                                                     context={"base_dir": base_dir or Path.cwd()})
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
        shown = "<redacted>" if secret else repr(e.get("input"))
        if kind == "extra_forbidden":
            msg = f"unknown key '{loc[-1]}'; check the spelling against the pipeline reference in the README"
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
            msg = e["msg"].removeprefix("Value error, ")
            if "input" in e and not isinstance(e["input"], (dict, list)):
                msg += f" (got {shown})"
        problems.append(f"{_where(loc, lines)}: {msg}")
    return problems


def _where(loc: _Path, lines: dict[_Path, int]) -> str:
    dotted = ".".join(f"[{p}]" if isinstance(p, int) else p for p in loc).replace(".[", "[") or "<top>"
    probe = loc
    while probe and probe not in lines:  # a missing key: report the line of its parent mapping
        probe = probe[:-1]
    line = lines.get(probe)
    return f"{dotted} (line {line})" if line else dotted


def _line_index(node: yaml.Node | None) -> dict[_Path, int]:
    """Map each YAML path to the 1-based line where its value (or key) starts."""
    out: dict[_Path, int] = {}

    def walk(n: yaml.Node, path: _Path) -> None:
        out[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                child = (*path, str(key_node.value))
                walk(value_node, child)
                out[child] = key_node.start_mark.line + 1
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, (*path, i))

    if node is not None:
        walk(node, ())
    return out


def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
            bool: "boolean", type(None): "nothing (null)"}.get(type(value), type(value).__name__)
