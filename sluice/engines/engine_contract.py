"""The engine contracts the operator runs against.

Two kinds of engine share one operator:

* :class:`BatchEngine` -- the batcher decides the batch; ``infer`` returns one result per input, in order.
* :class:`ContinuousEngine` (the LLM engine, ``sluice.engines.llm.operator_engine``) -- requests are added
  one by one as there is room and advanced step by step; each comes back from ``step`` when it finishes.

Lifecycle, as driven by the runner (``sluice.operator.runner``)::

    engine = factory(options, context)   # cheap: no model loading, no device work
    engine.start()                       # load the model, warm up; raises EngineStartError (one line)
    items = engine.prepare(values)       # intake thread, per decoded record(s), before batching
    results = engine.infer(items)        # engine thread, one batch at a time
    engine.close()                       # once, after the last infer

``model_source()`` (before ``start``) and ``memory_device()`` (after) tell the operator which model this is
and where it lives: every output names the model (``sluice.engines.identity``), and a reload loads a new
version beside the running one (``sluice.operator.reload``), so two engines of one type may be started,
used and closed at once in one process (each owns its own model).

``prepare`` runs on the intake thread while ``infer`` of the previous batch runs on the engine thread, so
per-record Python work (tokenising, say) overlaps inference instead of delaying it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sluice.engines.identity import ModelSource, code_source


class EngineError(Exception):
    """Base class of engine errors."""


class EngineStartError(EngineError):
    """The engine cannot start (missing model, wrong input names, missing provider...).

    The message is one line a user can act on; the runner prints it and exits non-zero before consuming.
    """


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (libraries' messages can run to pages), or its class name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class RecordError(EngineError):
    """One input cannot be handled (too long, wrong type...). The record goes to the dead-letter topic.

    Raised from ``prepare``; it never stops the pipeline. ``stage`` names the step that failed in the
    dead letter's ``stage`` header: ``prepare`` unless a finer step is known (``fetch``, ``decode-image``).
    """

    def __init__(self, message: str, stage: str = "prepare") -> None:
        super().__init__(message)
        self.stage = stage


@dataclass(frozen=True, slots=True)
class RecordOrigin:
    """Where a decoded value came from: its source topic (a file source's path), partition, offset and key."""

    topic: str
    partition: int
    offset: int
    key: bytes | None


@dataclass(frozen=True, slots=True)
class EngineContext:
    """What the runner tells an engine about the pipeline it serves (plain data, no live objects)."""

    max_batch_size: int  # the batcher never hands ``infer`` more items than this
    max_batch_tokens: int | None = None  # cap on batch size x padded length, when length-aware batching is on
    pipeline_dir: str = "."  # directory of the pipeline file; relative model paths resolve against it


class ModelInfo:
    """What both kinds of engine say about their model (the operator's identity and reload need it)."""

    def model_source(self) -> ModelSource:
        """Where the model comes from (:class:`~sluice.engines.identity.ModelSource`). Called before ``start``
        and again for each reload; cheap, never raises. Default: a model built in code (this class)."""
        return code_source(f"{type(self).__module__}:{type(self).__qualname__}", type(self).__module__)

    def memory_device(self) -> str:
        """After ``start``: where the model's memory lives, ``cpu`` or ``cuda:N`` (a reload checks for room
        for a second copy there). Default ``cpu``."""
        return "cpu"

    def check_model(self) -> None:
        """Refuse, as ``start`` would and with its line (EngineStartError), what the model's files say
        before its weights are loaded: a ``config.json``, a GGUF header, the tokenizer. ``sluice validate``
        calls it instead of ``start`` on a model it found on this machine (a model not there is the caller's
        to report). Guarantees: it runs the code ``start`` runs first, so it refuses nothing ``start`` would
        accept; it checks nothing about this machine (devices, runtimes); it loads none of the model's
        weights and imports no torch (beyond what ``start`` itself reads first: a sentence-transformers
        model's small Dense layers, with torch only when they are a torch pickle). Default: nothing to check
        (a model built in code)."""


class BatchEngine(ModelInfo, ABC):
    """A model served batch by batch.

    Guarantees the engine must give:

    * ``infer(items)`` returns exactly ``len(items)`` results, result ``i`` for item ``i``.
    * ``infer`` may raise; the runner then treats the whole batch as failed (and may bisect it).
    * ``prepare`` is pure with respect to the batch: it never sees other records and may be called from a
      different thread than ``infer`` (but never concurrently with itself).
    """

    def start(self) -> None:  # noqa: B027 - optional hook
        """Load and warm up. Called once, before any ``prepare``/``infer``. May block for a long time."""

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        """Turn decoded input values into engine items (e.g. tokenise). Default: unchanged.

        Raise :class:`RecordError` only when called with a single value; the runner calls ``prepare`` one
        record at a time when it needs to know which record failed.
        """
        return list(values)

    def records_per_poll(self) -> int | None:
        """At most this many records per poll of the source, when preparing them may take long (images fetched
        from a store): the poll loop comes back between polls to commit, serve delivery reports and report
        progress. None: the operator's default."""
        return None

    def takes_bytes(self) -> bool:
        """Whether a raw record's value reaches ``prepare`` as its bytes (image files) rather than UTF-8 text
        (``codec.format: raw``). Default: text."""
        return False

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        """``prepare``, where a value that fails alone may give its exception (a RecordError) in its place, so
        the runner need not prepare the batch again one record at a time (image fetches are not repeated).
        Default: ``prepare``, which raises."""
        return self.prepare(values)

    def item_length(self, item: Any) -> int:
        """Length of one prepared item in the unit of ``max_batch_tokens`` (tokens). Default 1."""
        return 1

    @abstractmethod
    def infer(self, items: Sequence[Any]) -> list[Any]:
        """Run one batch; return one JSON-serialisable result per item, in order."""

    def result_schema(self) -> dict[str, Any] | None:
        """A JSON Schema that every result validates against, when the engine knows it (after ``start``).

        Schema-registry outputs derive their schema from it (a float array for embeddings, a record for
        labels, a string or the structured-output schema for an LLM). None: unknown (then the pipeline
        gives ``sink.output.schema_file``).
        """
        return None


    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model and device memory. Called once; no call follows."""


class ContinuousEngine(ModelInfo, ABC):
    """A model served request by request, advanced step by step (continuous batching; the LLM engine).

    Driven by the operator's engine thread, which alone calls ``add`` / ``step`` / ``abort``::

        items = engine.prepare(values)        # intake thread, as for batch engines (RecordError per record)
        while work:
            for key, item in new records, up to engine.room():
                engine.add(key, item)         # joins the running batch at the next step
            for key, result in engine.step(): # one step of every running request
                ...                           # result: the output value, or an Exception for that record

    Guarantees the engine must give: every added key comes back from ``step`` exactly once (unless aborted),
    with a result or an exception; ``step`` never blocks when nothing was added; ``abort`` frees what the
    request held.
    """

    def start(self) -> None:  # noqa: B027 - optional hook
        """Load and warm up. Called once, before anything else."""

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        """Turn decoded input values into requests (render the prompt, tokenise). Default: unchanged."""
        return list(values)

    def records_per_poll(self) -> int | None:
        """As :meth:`BatchEngine.records_per_poll`. Default None."""
        return None

    def prepare_records(self, values: Sequence[Any], origins: Sequence[RecordOrigin]) -> list[Any]:
        """``prepare``, told where each value came from (the operator calls this one; an engine whose requests
        depend on the record's identity -- the LLM's ``seed_from`` -- overrides it). Default: ``prepare``."""
        return self.prepare(values)

    def item_length(self, item: Any) -> int:
        """Length of one prepared item (prompt tokens). Default 1."""
        return 1

    def result_schema(self) -> dict[str, Any] | None:
        """A JSON Schema that every result validates against, when the engine knows it (after ``start``).

        Schema-registry outputs derive their schema from it (a float array for embeddings, a record for
        labels, a string or the structured-output schema for an LLM). None: unknown (then the pipeline
        gives ``sink.output.schema_file``).
        """
        return None

    @abstractmethod
    def room(self) -> int:
        """How many more requests it is worth adding now (0 when the running batch is full)."""

    @abstractmethod
    def add(self, key: Any, item: Any) -> None:
        """Queue one request under ``key``. May raise for that request alone (it is then dead-lettered)."""

    @abstractmethod
    def step(self) -> list[tuple[Any, Any]]:
        """Advance every running request by one step; return (key, result or Exception) of those finished."""

    @abstractmethod
    def abort(self, key: Any) -> None:
        """Drop a request (shutdown with unfinished work, revoked partition)."""


    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model. Called once; no call follows."""
