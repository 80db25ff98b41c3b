"""``sluice reload``: ask running ``sluice run`` processes to load their model again (SIGHUP).

``sluice reload PIPELINE`` signals every live ``sluice run`` of that pipeline (its name and consumer group)
announced in this host's run dir (sluice/operator/reload/pid_file.py); ``sluice reload --pid N`` one of
them. Each then reloads as ``engine.reload.watch`` would on a change -- a version that failed before is
tried again, one identical to the serving model is not -- and says how it went in its own log and metrics.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sluice.operator.instance import default_lock_dir
from sluice.operator.reload import pid_file

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(sub: Any, parents: list[argparse.ArgumentParser] | None = None) -> None:
    """Add the ``reload`` command to the ``sluice`` command line's subparsers (``parents``: the options every
    command takes)."""
    reload = sub.add_parser("reload", help="make running pipelines load their model again", parents=parents or [],
                            description="Ask each running 'sluice run' of a pipeline on this host to load its "
                                        "model again, beside the serving one, and switch to it between two batches "
                                        "(the same as SIGHUP). Its log and metrics say how it went.")
    target = reload.add_mutually_exclusive_group(required=True)
    target.add_argument("pipeline", type=Path, nargs="?", help="pipeline YAML file of the running processes")
    target.add_argument("--pid", type=int, help="the process to signal (one announced in the run dir)")
    reload.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    run_dir = default_lock_dir()
    if args.pid is not None:
        targets = [a for a in pid_file.find(run_dir=run_dir) if a.pid == args.pid]
        if not targets:
            return _fail(f"process {args.pid} is not a running 'sluice run' announced in {run_dir} (a SIGHUP "
                         "would stop another program); check the PID, or that it runs with the same "
                         "SLUICE_RUN_DIR")
    else:
        from sluice.config import ConfigError, load_pipeline

        try:
            p = load_pipeline(args.pipeline).pipeline
        except ConfigError as err:
            return _fail(str(err))
        group = p.source.group_id or ""  # files: no consumer group
        targets = pid_file.find(p.name, group, run_dir)
        if not targets:
            return _fail(f"no running 'sluice run' of pipeline {p.name!r} (group {group!r}) in "
                         f"{run_dir}; is it running on this host, with the same SLUICE_RUN_DIR? (--pid N "
                         "names one)")
    for target in targets:
        try:
            os.kill(target.pid, signal.SIGHUP)
        except ProcessLookupError:  # it ended between the lookup and the signal
            print(f"sluice: process {target.pid} has just stopped", file=sys.stderr)
            continue
        except PermissionError:
            return _fail(f"not allowed to signal process {target.pid} (run as the user running it)")
        print(f"sluice: asked process {target.pid} (pipeline {target.pipeline}, group {target.group}) to "
              "reload its model; its log and metrics say how it went")
    return EXIT_OK


def _fail(message: str) -> int:
    print(f"sluice reload: {message}", file=sys.stderr)
    return EXIT_FAILED
