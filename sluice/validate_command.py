"""``sluice validate``: check pipeline files without running them -- YAML, keys, types, environment
variables, the settings the engine would refuse, and the model as far as it can be read without loading it.

Exit 0 when every file is valid, 1 otherwise; one line per file (and per problem), a count when there are
several. A model that is not on this machine is a warning, not an error: pipeline files are often linted on
another machine than the one that runs them (a CI job).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.cli_args import EXIT_FAILED, EXIT_OK, load, set_option
from sluice.config import LoadedPipeline


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    validate = sub.add_parser("validate", help="check pipeline files without running them", parents=parents,
                              description="Check pipeline files: YAML syntax, keys, types, environment "
                                          "variables, the settings the engine would refuse and the model's own "
                                          "configuration (read, not loaded). Exit 0 when every file is valid, "
                                          "1 otherwise.")
    validate.add_argument("pipelines", type=Path, nargs="+", metavar="pipeline",
                          help="pipeline YAML files, or quoted glob patterns ('pipelines/*.yaml')")
    set_option(validate)
    validate.set_defaults(handler=validate_files)


def validate_files(args: argparse.Namespace) -> int:
    paths = _expand(args.pipelines)
    if not paths:
        print(f"sluice: error: no pipeline file matches {' '.join(map(str, args.pipelines))}", file=sys.stderr)
        return EXIT_FAILED
    failed = 0
    for path in paths:
        loaded = load(path, args.overrides)
        if loaded is None:
            failed += 1
            continue
        p = loaded.pipeline
        refusal, warnings = _check_model(loaded)
        for warning in (*loaded.warnings, *warnings):
            print(f"{path}: warning: {warning}", file=sys.stderr)
        if refusal is not None:
            print(f"{path}: {refusal}", file=sys.stderr)
            failed += 1
            continue
        kernels = getattr(loaded.engine_options, "kernels", None)  # the llm engine's choices, as asked
        note = f"; kernels: {kernels.options().describe()}, resolved for the machine at start" if kernels else ""
        print(f"{path}: ok ({p.source.describe()} -> {p.engine.type} -> {p.sink.destination}{note})")
    if len(paths) > 1:
        print(f"{len(paths) - failed} of {len(paths)} pipeline files valid", file=sys.stderr if failed else sys.stdout)
    return EXIT_FAILED if failed else EXIT_OK


def _expand(patterns: Sequence[Path]) -> list[Path]:
    """Files as given; a pattern with ``*``, ``?`` or ``[`` (quoted, so the shell left it) expanded, sorted."""
    import glob

    paths: list[Path] = []
    for pattern in patterns:
        text = str(pattern)
        if any(c in text for c in "*?["):
            paths += [Path(p) for p in sorted(glob.glob(text, recursive=True))]
        else:
            paths.append(pattern)
    return paths


def _check_model(loaded: LoadedPipeline) -> tuple[str | None, list[str]]:
    """(the error, the warnings) about ``engine.model``, found as ``sluice run`` would find it here and checked
    as the engine's start checks it before loading it (sluice/engines/model_check.py). A model that is not
    here is only a warning: the file may be validated on another machine than the one that runs it (a CI job)."""
    from sluice.engines.engine_contract import EngineContext
    from sluice.engines.model_check import check_model

    p = loaded.pipeline
    check = check_model(p.engine.type, loaded.engine_options, EngineContext(
        max_batch_size=p.batching.max_batch_size, max_batch_tokens=p.batching.max_batch_tokens,
        pipeline_dir=str(loaded.base_dir)))
    return (f"engine.model: {check.refusal}" if check.refusal else None,
            [f"engine.model: {check.unchecked}"] if check.unchecked else [])
