"""Where a file run starts: its input files, its checkpoint, and what its outputs are cut back to.

Decided once, before the engine loads (a wrong path is found in milliseconds, not after a model load), by
reading only; :func:`sluice.connectors.files.open_files` then acts on it. The cases:

=====================================  ==================================================================
found                                  the run
=====================================  ==================================================================
no checkpoint, no output               starts at the first row of every input
a checkpoint for these inputs and      resumes: each input from its saved row, the outputs cut back to
this pipeline                          the saved lengths; new files matching the glob start at row 0; a
                                       checkpoint saying every input is done finishes at once
no checkpoint, but an output; or a     refused with what to do -- unless ``sink.file.overwrite``, which
checkpoint for other inputs (a file    starts over (the old output, dead letters and checkpoint are
changed or gone) or another pipeline   removed)
=====================================  ==================================================================

A file source feeding a Kafka topic keeps its checkpoint the same way (there are no output files to cut).
A Kafka source feeding a file sink has no checkpoint here (the group's offsets are its positions): the
output is appended to, after a torn last line is cut off.
"""

from __future__ import annotations

import glob
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sluice.connectors.files.run_checkpoint as cp
from sluice.config import Pipeline
from sluice.config.files import FileFormat, default_checkpoint_path
from sluice.connectors.files.file_source import InputFile
from sluice.operator.record import TopicPartition


class FileSetupError(Exception):
    """The files cannot be read or written as the pipeline asks; one line for the user."""


@dataclass
class FilePlan:
    base_dir: Path
    inputs: list[InputFile] = field(default_factory=list)  # source.file's files, in name order
    input_format: FileFormat | None = None
    checkpoint_path: Path | None = None
    state: cp.State | None = None  # the checkpoint to start from (a fresh one when starting over)
    output: Path | None = None  # sink.file's path
    output_format: FileFormat | None = None
    dead_letters: Path | None = None
    start_over: bool = False  # remove the old outputs (and checkpoint) first
    resumed: bool = False  # from a saved checkpoint

    @property
    def outputs_from_checkpoint(self) -> dict[str, Any] | None:
        """The durable positions to cut the outputs back to; None for a fresh output or no checkpoint."""
        return self.state.outputs if self.resumed and self.state is not None else None


def plan_files(p: Pipeline, base_dir: Path) -> FilePlan:
    """Raises FileSetupError (never touches a file)."""
    try:
        return _plan(p, base_dir)
    except OSError as err:  # an input or output that cannot be looked at (permissions, a broken mount)
        raise FileSetupError(f"cannot read {err.filename or 'a file'}: {err.strerror or err}") from None


def _plan(p: Pipeline, base_dir: Path) -> FilePlan:
    plan = FilePlan(base_dir=base_dir)
    if p.sink.file is not None:
        plan.output = _resolve(base_dir, p.sink.file.path)
        plan.output_format = p.sink.file.resolved_format(p.source.file.file_format if p.source.file else None)
        plan.dead_letters = _resolve(base_dir, p.dead_letter_destination or "")
        if plan.output.is_dir() and plan.output_format == "jsonl":
            raise FileSetupError(f"sink.file.path {plan.output} is a directory; a JSON-lines output is one file")
        if plan.output.exists() and not plan.output.is_dir() and plan.output_format == "parquet":
            raise FileSetupError(f"sink.file.path {plan.output} is a file; a Parquet output is a directory of "
                                 "part files: name a directory (it is created)")
    if "parquet" in (plan.output_format, p.source.file.file_format if p.source.file else None):
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise FileSetupError("Parquet files need pyarrow, which is not installed here; install it with: "
                                 "pip install 'sluice[files]'") from None
    if p.source.file is None:
        return plan
    src = p.source.file
    plan.input_format = src.file_format
    plan.checkpoint_path = _resolve(base_dir, src.checkpoint or default_checkpoint_path(p.sink.file.path
                                                                                        if p.sink.file else ""))
    # never read back what the run writes
    ours = {q.resolve() for q in (plan.output, plan.dead_letters, plan.checkpoint_path) if q is not None}
    files = [f for f in _matching(base_dir, src.path) if f.resolve() not in ours]
    if not files:
        raise FileSetupError(f"source.file.path {src.path!r} matches only this run's own outputs")
    fingerprint = _fingerprint(p)
    try:
        saved = cp.load(plan.checkpoint_path)
    except cp.CheckpointProblem as err:
        raise FileSetupError(str(err)) from None
    overwrite = p.sink.file is not None and p.sink.file.overwrite
    if saved is not None:
        mismatch = _mismatch(saved, fingerprint, files, base_dir)
        if mismatch is None:
            plan.state, plan.resumed = saved, True
        elif overwrite:
            plan.start_over = True
        elif p.sink.file is not None:
            raise FileSetupError(f"the checkpoint {plan.checkpoint_path} is for another run: {mismatch}. Its "
                                 "outputs would mix with this run's: remove the output, its dead letters and the "
                                 "checkpoint (or set sink.file.overwrite: true) to start over")
        else:
            raise FileSetupError(f"the checkpoint {plan.checkpoint_path} is for another run: {mismatch}; remove "
                                 "it to read every input again from its first row")
    elif plan.output is not None and _has_output(plan.output, plan.output_format):
        if not overwrite:
            raise FileSetupError(f"the output {plan.output} exists, and no checkpoint ({plan.checkpoint_path}) says "
                                 "how far it got: remove it, write elsewhere, or set sink.file.overwrite: true")
        plan.start_over = True
    state = plan.state or cp.State(fingerprint)
    for path in files:
        name = _name(base_dir, path)
        s = state.inputs.get(name) or _fresh(path, plan.input_format)
        plan.inputs.append(InputFile(path, TopicPartition(name, 0), s))
    plan.state = cp.State(state.fingerprint, {f.tp.topic: f.state for f in plan.inputs}, state.outputs)
    return plan


def _resolve(base_dir: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir / p


def _name(base_dir: Path, path: Path) -> str:
    """How checkpoints and dead letters name an input: relative to the pipeline's directory when inside it."""
    try:
        return str(path.relative_to(base_dir))
    except ValueError:
        return str(path)


def _matching(base_dir: Path, pattern: str) -> list[Path]:
    full = _resolve(base_dir, pattern)
    found = sorted(Path(m) for m in glob.glob(str(full), recursive=True) if Path(m).is_file())
    if not found:
        raise FileSetupError(f"source.file.path: no file matches {str(full)!r} (paths are relative to the pipeline "
                             f"file's directory, {base_dir})")
    return found


def _fresh(path: Path, fmt: FileFormat | None) -> cp.InputState:
    stat = path.stat()
    end = None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            end = pq.read_metadata(path).num_rows
        except Exception as err:  # not Parquet, or a torn file
            raise FileSetupError(f"{path} is not a readable Parquet file: {type(err).__name__}: {err}") from None
    return cp.InputState(size=stat.st_size, mtime_ns=stat.st_mtime_ns, end=end)


def _mismatch(saved: cp.State, fingerprint: str, files: list[Path], base_dir: Path) -> str | None:
    """Why ``saved`` cannot be resumed by this run, or None."""
    if saved.fingerprint != fingerprint:
        return "the engine, codec or sink.output settings changed since it was written"
    now = {_name(base_dir, f): f for f in files}
    for name, s in saved.inputs.items():
        path = now.get(name)
        if path is None:
            return f"its input {name} no longer matches source.file.path"
        stat = path.stat()
        if (stat.st_size, stat.st_mtime_ns) != (s.size, s.mtime_ns):
            return f"its input {name} changed since (size or modification time)"
    return None


def _has_output(path: Path, fmt: FileFormat | None) -> bool:
    if fmt == "parquet":
        return path.is_dir() and any(p.name.startswith("part-") for p in path.iterdir())
    return path.exists() and path.stat().st_size > 0


def _fingerprint(p: Pipeline) -> str:
    """Of what shapes the outputs: the engine and its options, the codec, sink.output, the file formats."""
    source_format = p.source.file.file_format if p.source.file else None
    shaping = {"engine": p.engine.model_dump(mode="json"), "codec": p.codec.model_dump(mode="json"),
               "output": p.sink.output.model_dump(mode="json"),
               "formats": [source_format, p.sink.file.resolved_format(source_format) if p.sink.file else None]}
    text = json.dumps(shaping, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
