"""What the ``sluice`` commands share: exit codes, argument types and ``--set``, reading a pipeline file.

Every argument error is argparse's usage error (exit 2) naming the option and what it expects; a pipeline
file that is not valid prints its one-line problems and gives ``None`` (the command exits 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from sluice.config import ConfigError, LoadedPipeline, load_pipeline

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", type=_override, default=[],
                        metavar="PATH=VALUE", help="set a pipeline setting over the file's, by its dotted path "
                        "(--set telemetry.metrics.enabled=true); repeatable, the last one wins")


def _override(text: str) -> tuple[str, object]:
    from sluice.config.overrides import OverrideError, parse_override

    try:
        return parse_override(text)
    except OverrideError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
        return value

    return parse


def load(path: Path, overrides: Sequence[tuple[str, object]] = ()) -> LoadedPipeline | None:
    try:
        return load_pipeline(path, overrides=overrides)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return None
