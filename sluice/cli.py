"""The ``sluice`` command line: run | validate | reload | models.

Every error is one line on stderr and a non-zero exit code, in every command and every phase of a start; a
failure no command foresaw too (``--debug`` prints its traceback above the line). SIGINT / SIGTERM before a
pipeline runs (a model load, a fetch) stop at once with one line and exit code 130 / 143; while it runs, the
first drains and stops it (exit 0), a second stops it at once (exit 130 / 143, nothing undelivered committed).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from sluice import __version__
from sluice.config import ConfigError, LoadedPipeline, load_pipeline
from sluice.engines.base import first_line

if TYPE_CHECKING:
    from sluice.operator.reload.pid_file import PidFile

log = logging.getLogger("sluice")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USAGE
    with _interruptible():
        try:
            code: int = args.handler(args)
            return code
        except Interrupted as stop:
            print(f"sluice: stopped by {signal.Signals(stop.signum).name}{stop.during}", file=sys.stderr)
            return 128 + stop.signum
        except KeyboardInterrupt:
            print("sluice: interrupted", file=sys.stderr)
            return 128 + signal.SIGINT
        except Exception as err:  # a failure no command foresaw: still one line, the traceback on request
            _fail(args, f"sluice: error: {type(err).__name__}: {first_line(err)}", err)
            return EXIT_FAILED


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM before a command has its own handlers (a model load, a fetch, an export): the command
    stops where it is, with one line and exit code 128 + the signal's number (130, 143)."""

    def __init__(self, signum: int, during: str = "") -> None:
        super().__init__(signum)
        self.signum = signum
        self.during = during  # " while starting; nothing was consumed", say


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread until the command replaces them
    (``sluice run`` does once its pipeline runs: they then drain and stop it)."""
    if threading.current_thread() is not threading.main_thread():  # main() called from a thread (tests)
        yield
        return

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _fail(args: argparse.Namespace, line: str, err: BaseException | None) -> None:
    """The one ``line`` of a failed command; with ``--debug``, the traceback of what caused it above it."""
    cause = err.__cause__ if err is not None and err.__cause__ is not None else err
    debug = bool(getattr(args, "debug", False))
    if debug and cause is not None:
        traceback.print_exception(cause)
    hint = " (--debug shows the traceback)" if cause is not None and not debug else ""
    print(f"{line}{hint}", file=sys.stderr)


def _common_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """``--log-level`` and ``--debug``, accepted before the command and after it (a subcommand's copy has no
    default, so it never overwrites what was given before the command)."""
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        default="info" if top else argparse.SUPPRESS, help="what the log shows (default: info)")
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="on an error, print its traceback above the one line")


def common_parent() -> argparse.ArgumentParser:
    """A parent parser giving a subcommand ``--log-level`` and ``--debug`` (``parents=[common_parent()]``)."""
    parent = argparse.ArgumentParser(add_help=False)
    _common_options(parent, top=False)
    return parent


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Streaming inference operator: "
                                     "Kafka topic in -> micro-batches -> model -> Kafka topic out.")
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    _common_options(parser, top=True)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    common = [common_parent()]

    run = sub.add_parser("run", help="run a pipeline until SIGINT/SIGTERM", parents=common,
                         description="Run a pipeline. SIGINT/SIGTERM stops intake, drains in-flight batches, "
                                     "commits what is done and exits 0; a second one stops at once, "
                                     "committing only what was delivered (exit 130/143). SIGHUP (or 'sluice reload') loads the "
                                     "model again beside the serving one and switches to it between two batches.")
    run.add_argument("pipeline", type=Path, help="pipeline YAML file")
    _set_option(run)
    run.add_argument("--max-records", type=_positive(int), metavar="N", help="stop after consuming N records")
    run.add_argument("--idle-exit", type=_positive(float), metavar="SECONDS",
                     help="stop once no record has arrived for SECONDS while partitions are assigned, "
                          "and nothing is in flight")
    run.add_argument("--until-end", action="store_true",
                     help="a bounded run (a backfill, a Kubernetes Job): read each assigned partition up to the "
                          "end offset it has when assigned, then commit and exit 0; records produced later are "
                          "left for the next run. A file source always ends this way")
    run.set_defaults(handler=_run)

    validate = sub.add_parser("validate", help="check pipeline files without running them", parents=common,
                              description="Check pipeline files: YAML syntax, keys, types, environment "
                                          "variables, the settings the engine would refuse. Exit 0 when every "
                                          "file is valid, 1 otherwise.")
    validate.add_argument("pipelines", type=Path, nargs="+", metavar="pipeline",
                          help="pipeline YAML files, or quoted glob patterns ('pipelines/*.yaml')")
    _set_option(validate)
    validate.set_defaults(handler=_validate)

    from sluice.operator.reload.command import add_parser as add_reload

    add_reload(sub, common)
    try:
        from sluice.models.cli import add_parser as add_models
    except ImportError:  # models support not installed
        pass
    else:
        add_models(sub, common)
    return parser


def _set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", type=_override, default=[],
                        metavar="PATH=VALUE", help="set a pipeline setting over the file's, by its dotted path "
                        "(--set telemetry.metrics.enabled=true); repeatable, the last one wins")


def _override(text: str) -> tuple[str, object]:
    from sluice.config.overrides import OverrideError, parse_override

    try:
        return parse_override(text)
    except OverrideError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
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


def _load(path: Path, overrides: Sequence[tuple[str, object]] = ()) -> LoadedPipeline | None:
    try:
        return load_pipeline(path, overrides=overrides)
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return None


def _validate(args: argparse.Namespace) -> int:
    paths = _expand(args.pipelines)
    if not paths:
        print(f"sluice: error: no pipeline file matches {' '.join(map(str, args.pipelines))}", file=sys.stderr)
        return EXIT_FAILED
    failed = 0
    for path in paths:
        loaded = _load(path, args.overrides)
        if loaded is None:
            failed += 1
            continue
        p = loaded.pipeline
        for warning in (*loaded.warnings, *_model_warnings(loaded)):
            print(f"{path}: warning: {warning}", file=sys.stderr)
        print(f"{path}: ok ({p.source.describe()} -> {p.engine.type} -> {p.sink.destination})")
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


def _model_warnings(loaded: LoadedPipeline) -> list[str]:
    """``engine.model`` as ``sluice run`` would resolve it here (against the pipeline file's directory): a
    warning when it would not start, since the file may be validated on another machine than the one that runs
    it (a CI job linting pipelines), where the model is not fetched or the path differs."""
    model = getattr(loaded.engine_options, "model", None)
    if not isinstance(model, str):
        return []
    try:
        from sluice.models import ModelError, resolve_model
    except ImportError:  # models support not installed
        return []
    try:
        resolve_model(model, base_dir=loaded.base_dir)
    except ModelError as err:
        return [f"engine.model: {err}; 'sluice run' on this machine would stop at start"]
    return []


def _run(args: argparse.Namespace) -> int:
    loaded = _load(args.pipeline, args.overrides)
    if loaded is None:
        return EXIT_FAILED
    p = loaded.pipeline
    log.info("sluice %s: starting pipeline %s (%s -> %s -> %s)", __version__, p.name, p.source.describe(),
             p.engine.type, p.sink.destination)
    for warning in loaded.warnings:
        log.warning("%s: %s", args.pipeline, warning)
    from sluice.operator.build import StartError, build_runner

    try:
        runner, engine = build_runner(loaded, max_records=args.max_records, idle_exit_s=args.idle_exit,
                                      until_end=args.until_end)
    except StartError as err:
        _fail(args, f"sluice: cannot start: {err}", err.__cause__)
        return EXIT_FAILED
    except Interrupted as stop:
        raise Interrupted(stop.signum, " while starting; nothing was consumed") from None

    signals: list[int] = []

    def on_signal(signum: int, _: FrameType | None) -> None:
        signals.append(signum)
        if len(signals) == 1:
            log.info("%s received: draining and stopping (send it again to stop at once)",
                     signal.Signals(signum).name)
            runner.stop()
        else:
            runner.force()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, lambda _signum, _frame: runner.reload())  # no logging in a handler: the run logs
    announced = _announce(loaded)  # after the SIGHUP handler: `sluice reload` signals only what reloads
    try:
        summary = runner.run()
    finally:
        if not runner.abandoned_engine:  # a forced stop may leave the engine inside a call: the exit ends it
            runner.engine.close()  # the engine serving at the end (after a reload, not the one built first)
        if announced is not None:
            announced.release()
    log.info("stopped: %d in, %d out, %d dead-lettered, %d batches (mean size %.1f) in %.1f s",
             summary.num_in, summary.num_out, summary.num_dead_lettered, summary.num_batches,
             summary.mean_batch_size, summary.elapsed_s)
    if summary.error:
        print(f"sluice: stopped on error: {summary.error}", file=sys.stderr)
        return EXIT_FAILED
    if runner.forced:
        print(f"sluice: stopped by a second {signal.Signals(signals[-1]).name}: what was not delivered is "
              "uncommitted and will be processed again", file=sys.stderr)
        if runner.abandoned_engine:  # the engine thread cannot be joined: leave without the interpreter's teardown
            logging.shutdown()
            sys.stderr.flush()
            os._exit(128 + signals[-1])
        return 128 + signals[-1]
    return EXIT_OK


def _announce(loaded: LoadedPipeline) -> PidFile | None:
    """This run's PID file, for ``sluice reload`` to find it by (sluice/operator/reload/pid_file.py)."""
    from sluice.operator.reload.pid_file import announce

    p = loaded.pipeline
    try:
        return announce(p.name, p.source.group_id or "")
    except OSError as err:  # SIGHUP and --pid still work; the pipeline runs all the same
        log.warning("cannot write the PID file 'sluice reload' finds this process by: %s", err)
        return None


if __name__ == "__main__":
    sys.exit(main())
