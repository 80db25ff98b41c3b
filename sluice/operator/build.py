"""From a validated pipeline to a runnable operator: the outside parts -- the engine (started and warmed up),
the codec, the Kafka clients or files, the observer, the reloader -- built and checked, then handed to the
:class:`~sluice.operator.runner.Runner`, which wires its own inner parts."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.codecs.record_codec import RecordCodec
from sluice.config import REGISTRY_FORMATS, LoadedPipeline, Pipeline
from sluice.engines import engine_types
from sluice.engines.engine_contract import (
    BatchEngine,
    ContinuousEngine,
    EngineContext,
    EngineStartError,
    first_line,
)
from sluice.operator.instance import InstanceSlot, NoFreeSlot, claim_slot, instance_name
from sluice.operator.observer import Observer
from sluice.operator.ports import Sink, Source
from sluice.operator.reload.reloader import Reloader
from sluice.operator.reload.startup import Started, start_identified
from sluice.operator.runner import Runner
from sluice.operator.serving import Serving
from sluice.operator.topics import TopicProblem, check_topics

if TYPE_CHECKING:
    from sluice.config import KafkaSource as KafkaSourceConfig
    from sluice.connectors.files import FilePlan

log = logging.getLogger(__name__)


class StartError(Exception):
    """The pipeline cannot start (engine, broker...). One line for the user."""


def build_engine(loaded: LoadedPipeline) -> BatchEngine | ContinuousEngine:
    """Create and start (load, warm up) the pipeline's engine. Raises StartError."""
    return _build(loaded, lambda engine: engine.start())


def start_engine(loaded: LoadedPipeline) -> tuple[BatchEngine | ContinuousEngine, Started]:
    """:func:`build_engine`, hashing the model meanwhile: the engine, its identity and its footprint."""
    found: list[Started] = []
    p = loaded.pipeline
    engine = _build(loaded, lambda e: found.append(start_identified(e, e.start, p.engine.type, p.engine.model_name)))
    return engine, found[0]


def _build(loaded: LoadedPipeline, start: Callable[[BatchEngine | ContinuousEngine], object]
           ) -> BatchEngine | ContinuousEngine:
    p = loaded.pipeline
    try:
        engine_type = engine_types.lookup(p.engine.type)
    except ImportError as err:
        raise StartError(f"engine '{p.engine.type}' is not installed here ({err}); "
                         f"install it with: pip install 'sluice[{p.engine.type}]'") from None
    context = EngineContext(max_batch_size=p.batching.max_batch_size, max_batch_tokens=p.batching.max_batch_tokens,
                            pipeline_dir=str(loaded.base_dir))
    try:
        engine: BatchEngine | ContinuousEngine = engine_type.factory(loaded.engine_options, context)
        start(engine)
    except EngineStartError as err:  # "engine 'torch': <its line>", once, whether the line names the engine or not
        raise StartError(f"engine '{p.engine.type}': {str(err).removeprefix(f'engine {p.engine.type}: ')}") from None
    except Exception as err:  # an engine (or a user's module it imports) failing in a way it did not foresee
        log.debug("engine '%s' failed to start", p.engine.type, exc_info=True)
        raise StartError(f"engine '{p.engine.type}' failed to start: {type(err).__name__}: {first_line(err)}"
                         ) from err  # the cause: ``sluice run --debug`` prints its traceback
    return engine


def build_runner(loaded: LoadedPipeline, *, observer: Observer | None = None, until_end: bool = False,
                 **limits: Any) -> tuple[Runner, BatchEngine | ContinuousEngine]:
    """The topics' and files' checks, then the engine (a slow warm-up must not eat into the consumer's poll
    interval), then the source and sink: Kafka clients or files.

    The observer (from the pipeline's ``telemetry`` section unless one is given) comes before the engine,
    so /healthz answers and /readyz says "warming up" during a long model load. The topics and files are
    checked before the engine loads: a missing output topic or input file is found in milliseconds, not
    after a model load and a first batch (sluice/operator/topics.py, sluice/connectors/files/plan.py).
    ``until_end``: a Kafka source reads up to the end offsets its partitions have when assigned, then the
    run stops (``sluice run --until-end``; a file source always ends).
    """
    from confluent_kafka import KafkaException

    from sluice.connectors.files import FileSetupError, plan_files

    p = loaded.pipeline
    if observer is None:
        observer = _build_observer(loaded)
    try:
        check_topics(p)
        plan = plan_files(p, loaded.base_dir) if p.source.file or p.sink.file else None
        engine, started = start_engine(loaded)
        reloader = build_reloader(loaded, engine, started, observer)
    except (TopicProblem, FileSetupError) as err:
        observer.stopped()
        raise StartError(str(err)) from None
    except KafkaException as err:  # a client setting librdkafka rejects
        observer.stopped()
        raise StartError(f"kafka client configuration: {err.args[0].str()}") from None
    except BaseException:
        observer.stopped()
        raise
    observer.engine_started(engine, started.warmup_s)
    try:
        codec = build_codec(loaded, engine)
        source, sink, on_close = _ports(loaded, plan, until_end)
    except StartError:
        engine.close()
        observer.stopped()
        raise
    return Runner(loaded, source, sink, engine, observer=observer, on_close=on_close, codec=codec,
                  model=started.identity, warmup_s=started.warmup_s, reloader=reloader, **limits), engine


def _ports(loaded: LoadedPipeline, plan: FilePlan | None, until_end: bool) -> tuple[Source, Sink, list[Callable[[], None]]]:
    """The source and the sink, each Kafka or files; and what to close after the run. Raises StartError."""
    from confluent_kafka import KafkaException

    from sluice.connectors.files import FileSetupError, open_files

    p = loaded.pipeline
    on_close: list[Callable[[], None]] = []
    try:
        files = None
        if plan is not None:
            dead_letter_line = None
            if p.codec.format == "openai-batch":  # its dead letters are OpenAI's error lines
                from sluice.codecs import openai_batch

                dead_letter_line = openai_batch.error_line
            files = open_files(p, plan, time.monotonic, dead_letter_line)
            on_close.append(files.close)
        kafka_source, kafka_sink, slot = _kafka_clients(p, until_end)
        if slot is not None:
            on_close.append(slot.release)
    except (KafkaException, NoFreeSlot, FileSetupError) as err:
        for close in on_close:
            close()
        if isinstance(err, FileSetupError):
            raise StartError(str(err)) from None
        if isinstance(err, NoFreeSlot):
            raise StartError(f"instance slot (for the transactional id and the static group membership): {err}"
                             ) from None
        raise StartError(f"kafka client configuration: {err.args[0].str()}") from None
    source = kafka_source if kafka_source is not None else (files.source if files else None)
    sink = kafka_sink if kafka_sink is not None else (files.sink if files else None)
    assert source is not None and sink is not None  # config: exactly one kind per side
    return source, sink, on_close


def _kafka_clients(p: Pipeline, until_end: bool) -> tuple[Source | None, Sink | None, InstanceSlot | None]:
    """The Kafka consumer and producer the pipeline has (None for a side that is files), and the instance
    slot they claimed. Raises KafkaException, NoFreeSlot."""
    from sluice.connectors.kafka import KafkaSink, KafkaSource
    from sluice.connectors.kafka.bounded import BoundedKafkaSource

    exactly_once = p.delivery == "exactly_once"  # Kafka on both sides (config/connectors.py)
    src = p.source.kafka
    slot: InstanceSlot | None = None
    # One instance slot per process names both its transactional id and its static group membership,
    # unless the pipeline names them itself (sluice/operator/instance.py).
    txn_id = p.exactly_once.transactional_id if exactly_once else None
    member_id = src.config.get("group.instance.id") if src is not None else None
    if src is not None and ((exactly_once and txn_id is None) or (src.static_membership and member_id is None)):
        slot = claim_slot(src.group_id)
        name = instance_name(src.group_id, socket.gethostname(), slot.slot)
        txn_id = txn_id or (name if exactly_once else None)
        member_id = member_id or (name if src.static_membership else None)
    try:
        if txn_id is not None:
            log.info("exactly-once with transactional id %s", txn_id)
        if member_id is not None and src is not None:
            log.info("%s", _membership_line(src, str(member_id)))
        source: Source | None = None
        if src is not None:
            source_type = BoundedKafkaSource if until_end else KafkaSource
            source = source_type(src, p.runtime.commit_interval_ms, transactional=exactly_once,
                                 group_instance_id=None if member_id is None else str(member_id))
        sink: Sink | None = None
        if p.sink.kafka is not None:
            bootstrap = p.sink.kafka.bootstrap_servers or (src.bootstrap_servers if src is not None else "")
            sink = KafkaSink(bootstrap, p.sink.kafka, transactional_id=txn_id,
                             transaction_timeout_ms=p.exactly_once.transaction_timeout_ms)
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    return source, sink, slot


def _membership_line(src: KafkaSourceConfig, member_id: str) -> str:
    """The start's line on static membership: "restarted under this id" only when the group still holds a
    member of that id (sluice/connectors/kafka/membership.py), never on a first start."""
    from sluice.connectors.kafka import security_config
    from sluice.connectors.kafka.membership import membership_line, static_member_present

    conf = {"bootstrap.servers": src.bootstrap_servers, **security_config(src.security), **src.config}
    return membership_line(member_id, static_member_present(conf, src.group_id, member_id))


def build_reloader(loaded: LoadedPipeline, engine: BatchEngine | ContinuousEngine, started: Started,
                   observer: Observer) -> Reloader:
    """What builds new versions of the engine's model (``engine.reload``, ``sluice reload``). Raises
    StartError when ``engine.reload.watch`` asks for what the engine cannot do."""
    p = loaded.pipeline
    settings = p.engine.reload
    if settings.watch and (started.source.path is None or not started.source.reloadable):
        engine.close()
        raise StartError(f"engine.reload.watch: engine {p.engine.type} runs {started.source.name}, built in code, "
                         "not a model on disk: there is nothing to watch (give engine.model -- with engine.factory "
                         "for the python engine -- or leave reload.watch off)")
    schema = engine.result_schema()
    fixed = p.output_format() in REGISTRY_FORMATS and p.sink.output.schema_file is None

    def same_results(new: BatchEngine | ContinuousEngine) -> str | None:
        if not fixed or new.result_schema() == schema:
            return None
        return ("the new model's results have another JSON Schema than the output schema registered at start; "
                "restart the pipeline to register one for it")

    return Reloader(started.source, Serving(engine, started.identity, started.warmup_s), started.footprint,
                    lambda: build_engine(loaded), settings, observer, check=same_results, known=started.fingerprint)


def build_codec(loaded: LoadedPipeline, engine: BatchEngine | ContinuousEngine) -> RecordCodec:
    """The record codec; for avro, protobuf and json_schema, with its schema registry format set up (output
    schemas derived from the engine's result schema and registered). Raises StartError."""
    from sluice.codecs.registry_formats import build_schema_format
    from sluice.codecs.schema_format import SchemaSetupError

    p = loaded.pipeline
    try:
        schemas = build_schema_format(p, engine.result_schema(), loaded.base_dir)
    except SchemaSetupError as err:
        raise StartError(f"schema registry: {err}") from None
    binary = p.codec.format == "raw" and isinstance(engine, BatchEngine) and engine.takes_bytes()
    if binary and p.sink.output.mode == "merge":
        raise StartError("codec.format raw with an image task: sink.output.mode merge would copy every image "
                         "into its output (base64); set sink.output.mode: result")
    return RecordCodec(p.codec, p.sink.output, schemas, binary=binary)


def _build_observer(loaded: LoadedPipeline) -> Observer:
    from sluice.telemetry import TelemetrySetupError, build_observer

    try:
        return build_observer(loaded.pipeline)
    except (TelemetrySetupError, OSError) as err:
        raise StartError(f"telemetry: {err}") from None
