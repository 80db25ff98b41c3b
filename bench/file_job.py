"""A Parquet embedding job keeps the engine busy: the whole file job against the raw engine on the same batches.

    .venv/bin/python bench/file_job.py [--num-rows 20000] [--repeats 3] [--threads 2] [--min-ratio 0.95]
    .venv/bin/python bench/file_job.py --quick          # 2,000 rows, one repeat: checks the script runs

The job is what a user runs as a bounded backfill: a Parquet file of review-like texts (``source.file``) ->
decode, tokenise, length buckets (``bucket_by: tokens``) -> MiniLM on ONNX Runtime -> a Parquet output
(``sink.file``), checkpoints included -- the real runner, in this process. Its ``records/s`` is rows over the
run's wall time (engine start not counted: a warm engine, as in a long job).

The baseline is the raw engine on *the same batches in the same run*: every batch the job's engine thread
ran is recorded (the prepared items, as the engine got them) and replayed afterwards through the same,
warm ``engine.infer``, back to back, with nothing else running. Tokenising is not in the baseline (the
operator tokenises on its intake thread, overlapped with inference), so a ratio of 1.0 means the file
path costs the engine nothing: reading, decoding, batching, encoding and writing all happen while the
engine runs. Each repeat runs the job then its replay; the ratio reported is the median over repeats.

Prints a table, writes ``bench/results/file_job.json``; exits 1 when the ratio is under ``--min-ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "bench")) if p not in sys.path]

from embed_engine import review_texts  # noqa: E402

from sluice.engines.engine_contract import BatchEngine  # noqa: E402


class RecordingEngine(BatchEngine):
    """The job's engine, recording every batch it is given, how long the engine took on it, and when the first
    one started; everything else is the wrapped engine's (the runner sees what it would see)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.batches: list[list[Any]] = []
        self.busy_s = 0.0
        self.first_batch_s: float | None = None  # perf_counter when the first infer began

    def start(self) -> None:  # started already
        pass

    def model_source(self) -> Any:
        return self.engine.model_source()

    def prepare(self, values: Sequence[Any]) -> list[Any]:
        return self.engine.prepare(values)  # type: ignore[no-any-return]

    def prepare_each(self, values: Sequence[Any]) -> list[Any]:
        return self.engine.prepare_each(values)  # type: ignore[no-any-return]

    def records_per_poll(self) -> int | None:
        return self.engine.records_per_poll()  # type: ignore[no-any-return]

    def takes_bytes(self) -> bool:
        return self.engine.takes_bytes()  # type: ignore[no-any-return]

    def item_length(self, item: Any) -> int:
        return self.engine.item_length(item)  # type: ignore[no-any-return]

    def infer(self, items: Sequence[Any]) -> list[Any]:
        start_s = time.perf_counter()
        if self.first_batch_s is None:
            self.first_batch_s = start_s
        results = self.engine.infer(items)
        self.busy_s += time.perf_counter() - start_s
        self.batches.append(list(items))
        return results  # type: ignore[no-any-return]

    def result_schema(self) -> dict[str, Any] | None:
        return self.engine.result_schema()  # type: ignore[no-any-return]

    def close(self) -> None:
        pass


def write_corpus(path: Path, num_rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = review_texts(num_rows)
    pq.write_table(pa.table({"id": pa.array(range(num_rows), pa.int32()), "text": texts}), path,
                   row_group_size=10_000)


def pipeline_yaml(threads: int, batch_size: int) -> str:
    return f"""
source: {{file: {{path: corpus.parquet}}}}
codec: {{format: json, input_field: text}}
batching: {{max_batch_size: {batch_size}, max_queue_delay_ms: 20, bucket_by: tokens, max_batch_tokens: 8192}}
engine: {{type: onnx, model: minilm-l6, providers: [cuda, cpu], intra_op_num_threads: {threads},
          inter_op_num_threads: 1, max_length: 256}}
sink: {{file: {{path: out.parquet, overwrite: true}}, output: {{mode: merge, field: embedding}}}}
runtime: {{commit_interval_ms: 1000}}
telemetry: {{status: "off"}}
"""


def run_recorded(loaded: Any, engine: Any, bench: str) -> tuple[Any, RecordingEngine]:
    """The pipeline's file job, in this process, with ``engine`` recorded: (the run's summary, the recorder).
    SystemExit naming ``bench`` when the job stops on an error."""
    from sluice.connectors.files import open_files, plan_files
    from sluice.operator.build import build_codec
    from sluice.operator.runner import Runner

    recorder = RecordingEngine(engine)
    p = loaded.pipeline
    files = open_files(p, plan_files(p, loaded.base_dir), time.monotonic)
    assert files.source is not None and files.sink is not None
    runner = Runner(loaded, files.source, files.sink, recorder, codec=build_codec(loaded, recorder),
                    on_close=[files.close])
    summary = runner.run()
    if summary.error:
        raise SystemExit(f"{bench}: the job stopped on an error: {summary.error}")
    return summary, recorder


def run_job(workdir: Path, loaded: Any, engine: Any) -> tuple[float, RecordingEngine, int]:
    """One job over the corpus with ``engine``: (wall seconds, the recorder, rows written)."""
    import pyarrow.parquet as pq

    summary, recorder = run_recorded(loaded, engine, "file_job")
    written = sum(pq.read_metadata(part).num_rows for part in (workdir / "out.parquet").glob("part-*.parquet"))
    return summary.elapsed_s, recorder, written


def replay(engine: Any, batches: list[list[Any]]) -> float:
    """The same batches through the raw engine, back to back: seconds."""
    start_s = time.perf_counter()
    for items in batches:
        engine.infer(items)
    return time.perf_counter() - start_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-ratio", type=float, default=0.95)
    parser.add_argument("--quick", action="store_true", help="2,000 rows, one repeat")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "file_job.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_rows, args.repeats = 2000, 1

    from sluice.config import load_pipeline
    from sluice.model_store import fetch
    from sluice.operator.build import build_engine

    fetch("minilm-l6")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sluice-file-job-") as tmp:
        workdir = Path(tmp)
        write_corpus(workdir / "corpus.parquet", args.num_rows)
        (workdir / "job.yaml").write_text(pipeline_yaml(args.threads, args.batch_size))
        loaded = load_pipeline(workdir / "job.yaml")
        engine = build_engine(loaded)  # loaded and warmed up once; every repeat runs warm
        try:
            for repeat in range(args.repeats):
                (workdir / "out.parquet.checkpoint").unlink(missing_ok=True)  # each repeat a fresh job
                job_s, recorder, num_written = run_job(workdir, loaded, engine)
                if num_written != args.num_rows:
                    raise SystemExit(f"file_job: {num_written} rows written for {args.num_rows}")
                raw_s = replay(engine, recorder.batches)
                row = {"repeat": repeat, "num_rows": args.num_rows, "num_batches": len(recorder.batches),
                       "mean_batch_size": args.num_rows / max(1, len(recorder.batches)),
                       "job_s": job_s, "job_records_per_s": args.num_rows / job_s,
                       "engine_busy_share": recorder.busy_s / job_s,
                       "raw_s": raw_s, "raw_records_per_s": args.num_rows / raw_s}
                row["ratio"] = row["job_records_per_s"] / row["raw_records_per_s"]
                rows.append(row)
                print(f"file_job: repeat {repeat + 1}/{args.repeats}: job {row['job_records_per_s']:.1f} rec/s, "
                      f"raw engine {row['raw_records_per_s']:.1f} rec/s, ratio {row['ratio']:.3f}, engine busy "
                      f"{100 * row['engine_busy_share']:.1f}% of the job", file=sys.stderr, flush=True)
        finally:
            engine.close()

    ratio = statistics.median(r["ratio"] for r in rows)
    print(f"{'rows':>7}  {'batches':>7}  {'job rec/s':>9}  {'raw rec/s':>9}  {'ratio':>6}  {'busy':>5}")
    for r in rows:
        print(f"{r['num_rows']:>7}  {r['num_batches']:>7}  {r['job_records_per_s']:>9.1f}  "
              f"{r['raw_records_per_s']:>9.1f}  {r['ratio']:>6.3f}  {100 * r['engine_busy_share']:>4.0f}%")
    print(f"median ratio {ratio:.3f} (needed >= {args.min_ratio})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                                    "settings": {k: str(v) for k, v in vars(args).items() if k != "out"},  # no local paths
                                    "rows": rows, "median_ratio": ratio}, indent=1))
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
