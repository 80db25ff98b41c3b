"""JSON-lines and Parquet files as a source and a sink, behind the same ports as Kafka.

============  ===============================================================================
module        what it holds
============  ===============================================================================
plan          where a run starts: inputs, checkpoint, outputs cut back to (read only)
source        the Source: files read one after another, the watermark offered as the checkpoint
readers       one file a chunk at a time (JSON lines by blocks, Parquet by record batches)
sink          the Sink: outputs and dead letters written, delivery reports served
writers       a JSON-lines file appended to; a directory of Parquet part files
dead_letters  dead letters as JSON lines
checkpoint    the state file, saved atomically once what it claims is durable
run_lock      one run at a time per output
============  ===============================================================================

:func:`open_files` builds them from a plan, for sluice/operator/build.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sluice.config import Pipeline
from sluice.connectors.files.dead_letters import DeadLetterLine, json_line
from sluice.connectors.files.file_sink import FileSink
from sluice.connectors.files.file_source import FileSource
from sluice.connectors.files.plan import FilePlan, FileSetupError, plan_files
from sluice.connectors.files.run_checkpoint import Checkpoint
from sluice.connectors.files.run_lock import RunLock, RunLocked
from sluice.connectors.files.writers import JsonLinesWriter, ParquetPartsWriter

__all__ = ["FilePlan", "FilePorts", "FileSetupError", "FileSink", "FileSource", "open_files", "plan_files"]

log = logging.getLogger(__name__)


@dataclass
class FilePorts:
    source: FileSource | None  # source.file
    sink: FileSink | None  # sink.file
    checkpoint: Checkpoint | None
    lock: RunLock  # held until the run ends: then release it (after the sink is closed)

    def close(self) -> None:
        """After the run: close the output files, then let another run have them."""
        try:
            if self.sink is not None:
                self.sink.close()
        finally:
            self.lock.release()


def open_files(p: Pipeline, plan: FilePlan, clock: Callable[[], float],
               dead_letter_line: DeadLetterLine | None = None) -> FilePorts:
    """Act on ``plan``: remove what starting over removes, cut the outputs back to the checkpoint, open the
    files. ``dead_letter_line``: how dead letters are written (default: :func:`json_line`). Raises
    FileSetupError."""
    lock_of = plan.checkpoint_path or plan.output
    assert lock_of is not None  # a file on one side at least
    try:
        lock = RunLock(Path(f"{lock_of}.lock"))
    except RunLocked as err:
        raise FileSetupError(str(err)) from None
    except OSError as err:
        raise FileSetupError(f"cannot create the run's lock file beside {lock_of}: {err}") from None
    try:
        if plan.start_over:
            _remove_outputs(plan)
        sink = _open_sink(p, plan, clock, dead_letter_line) if p.sink.file is not None else None
    except OSError as err:
        lock.release()
        raise FileSetupError(f"cannot open the outputs: {err}") from None
    except FileSetupError:
        lock.release()
        raise
    if p.source.file is None:
        return FilePorts(None, sink, None, lock)
    assert plan.checkpoint_path is not None and plan.state is not None and plan.input_format is not None
    checkpoint = Checkpoint(plan.checkpoint_path, plan.state, sink)
    source = FileSource(plan.inputs, plan.input_format, batch_rows=p.source.file.batch_rows,
                        max_line_bytes=p.codec.max_record_bytes, checkpoint=checkpoint, clock=clock)
    if plan.resumed:
        done = sum(f.state.row for f in plan.inputs)
        log.info("resuming from the checkpoint %s: %d rows done before", plan.checkpoint_path, done)
    return FilePorts(source, sink, checkpoint, lock)


def _open_sink(p: Pipeline, plan: FilePlan, clock: Callable[[], float],
               dead_letter_line: DeadLetterLine | None) -> FileSink:
    cfg = p.sink.file
    assert cfg is not None and plan.output is not None and plan.dead_letters is not None
    saved = plan.outputs_from_checkpoint
    from_files = p.source.file is not None
    # fed by files, a fresh output starts empty (bytes 0); fed by Kafka there is no checkpoint: append
    start = 0 if from_files else None
    output: JsonLinesWriter | ParquetPartsWriter
    try:
        if plan.output_format == "parquet":
            output = ParquetPartsWriter(plan.output, saved["output"]["parts"] if saved else [],
                                        rows_per_file=cfg.rows_per_file, roll_interval_s=cfg.roll_interval_s,
                                        row_group_rows=cfg.row_group_rows, input_schema=_input_schema(plan),
                                        clock=clock)
        else:
            output = JsonLinesWriter(plan.output, saved["output"]["bytes"] if saved else start)
        dead_letters = JsonLinesWriter(plan.dead_letters, saved["dead_letters"]["bytes"] if saved else start)
    except (KeyError, TypeError) as err:
        raise FileSetupError(f"the checkpoint {plan.checkpoint_path} does not say how long the outputs are "
                             f"({err}); remove it and the outputs to start over") from None
    except FileNotFoundError as err:
        raise FileSetupError(f"{err}: the outputs are shorter than the checkpoint says (removed or rewritten "
                             "since?); remove them and the checkpoint to start over") from None
    return FileSink(p.sink.destination, output, p.dead_letter_destination or "", dead_letters,
                    dead_letter_line or json_line(from_files), durable_acks=not from_files)


def _input_schema(plan: FilePlan) -> object:
    if plan.input_format != "parquet" or not plan.inputs:
        return None
    import pyarrow.parquet as pq

    return pq.read_schema(plan.inputs[0].path)


def _remove_outputs(plan: FilePlan) -> None:
    """``sink.file.overwrite``: the old outputs go -- the Parquet part files Sluice writes (never anything else
    in that directory), the JSON-lines output, the dead letters, the checkpoint."""
    log.warning("sink.file.overwrite: starting over; removing the old output %s", plan.output)
    out = plan.output
    if out is not None and out.is_dir():
        for part in out.iterdir():
            if part.name.startswith(("part-", ".part-")) and part.suffix in (".parquet", ".tmp"):
                part.unlink()
    elif out is not None and out.exists():
        out.unlink()
    for path in (plan.dead_letters, plan.checkpoint_path):
        if path is not None and path.exists():
            path.unlink()
