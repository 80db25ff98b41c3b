"""What ``sluice validate`` finds out about a pipeline's model without loading it.

The model is looked for where ``sluice run`` on this machine would look (a known model's fetched directory,
a path relative to the pipeline file); when it is there, the engine's own start checks that come before
any weights run on it (:meth:`sluice.engines.engine_contract.ModelInfo.check_model`: a ``config.json``'s architecture
or task head, a GGUF header, the tokenizer), so validate refuses exactly what start would refuse first.

Two outcomes are kept apart, because a pipeline file may be validated on another machine than the one
that runs it (a CI job linting pipelines): a *refusal* -- the engine would stop at start on this model,
wherever it ran -- and a model that *could not be checked* here (not fetched, a path or hub id that is no
directory here), which is only a warning saying so. Guarantees: imports no torch and loads no weights
(those of ``check_model``); a pipeline without a ``model`` on disk (a function, a factory) is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.engines import engine_types
from sluice.engines.engine_contract import EngineContext, EngineStartError, first_line


@dataclass(frozen=True, slots=True)
class ModelCheck:
    """At most one of the two is set."""

    refusal: str | None = None  # the line the engine's start would stop with
    unchecked: str | None = None  # why the model could not be checked on this machine


def check_model(engine_type: str, options: Any, context: EngineContext) -> ModelCheck:
    """Check the model that ``options`` (an engine type's validated options) name; see the module docstring."""
    model = getattr(options, "model", None)
    if not isinstance(model, str):
        return ModelCheck()
    try:
        from sluice.model_store import ModelError, resolve_model
    except ImportError:  # models support not installed
        return ModelCheck()
    try:
        resolve_model(model, base_dir=context.pipeline_dir)
    except ModelError as err:
        return ModelCheck(unchecked=f"{err}; its files could not be checked here, and 'sluice run' on this "
                                    "machine would stop at start")
    engine = engine_types.lookup(engine_type).factory(options, context)  # cheap, by the engine contract
    try:
        engine.check_model()
    except EngineStartError as err:  # as `sluice run` words it (sluice/operator/build.py)
        return ModelCheck(refusal=str(err).removeprefix(f"engine {engine_type}: "))
    except Exception as err:  # a failure the engine did not foresee: start would fail on it too
        return ModelCheck(refusal=f"the engine would fail to start: {type(err).__name__}: {first_line(err)}")
    return ModelCheck()
