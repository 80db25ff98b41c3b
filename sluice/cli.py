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
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from sluice import __version__, logs
from sluice.cli_args import EXIT_FAILED, EXIT_OK, EXIT_USAGE, load, positive, set_option
from sluice.config import LoadedPipeline
from sluice.engines.engine_contract import first_line

if TYPE_CHECKING:
    from sluice.operator.reload.pid_file import PidFile

log = logging.getLogger("sluice")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format, sys.stderr)
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
    """``--log-level``, ``--log-format`` and ``--debug``, accepted before the command and after it (a
    subcommand's copy has no default, so it never overwrites what was given before the command)."""
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        default="info" if top else argparse.SUPPRESS, help="what the log shows (default: info)")
    parser.add_argument("--log-format", choices=logs.FORMATS, default="text" if top else argparse.SUPPRESS,
                        help="json: one JSON object per line, for a log collector (default: text)")
    parser.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="on an error, print its traceback above the one line")


def common_parent() -> argparse.ArgumentParser:
    """A parent parser giving a subcommand :func:`_common_options` (``parents=[common_parent()]``)."""
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
    set_option(run)
    run.add_argument("--max-records", type=positive(int), metavar="N", help="stop after consuming N records")
    run.add_argument("--idle-exit", type=positive(float), metavar="SECONDS",
                     help="stop once no record has arrived for SECONDS while partitions are assigned, "
                          "and nothing is in flight")
    run.add_argument("--until-end", action="store_true",
                     help="a bounded run (a backfill, a Kubernetes Job): read each assigned partition up to the "
                          "end offset it has when assigned, then commit and exit 0; records produced later are "
                          "left for the next run. A file source always ends this way")
    run.set_defaults(handler=_run)

    from sluice.validate_command import add_parser as add_validate

    add_validate(sub, common)
    from sluice.operator.reload.command import add_parser as add_reload

    add_reload(sub, common)
    try:
        from sluice.model_store.store_cli import add_parser as add_models
    except ImportError:  # models support not installed
        pass
    else:
        add_models(sub, common)
    return parser


def _run(args: argparse.Namespace) -> int:
    loaded = load(args.pipeline, args.overrides)
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
    if not runner.observer.summarised:  # the status line's summary is the run's one (telemetry.status: off)
        from sluice.telemetry.status import format_summary, totals_of_summary

        log.info("done: %s", format_summary(totals_of_summary(summary)))
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
