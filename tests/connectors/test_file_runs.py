"""File pipelines end to end in-process, through the real runner (the same operator core as Kafka): one output
or dead letter per input row, resumable, refusing to mix outputs of different runs, progress shown."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sluice.config import load_pipeline
from sluice.operator.build import StartError, build_runner
from sluice.operator.state import RunSummary
from sluice.telemetry.telemetry_observer import TelemetryObserver


def pipeline(tmp_path: Path, source: dict[str, Any], sink: dict[str, Any], *, function: str = "tag",
             **extra: Any) -> Path:
    doc = {"source": {"file": source}, "engine": {"type": "python", "function": f"tests.integration.funcs:{function}"},
           "sink": {"file": sink, "output": {"field": "tagged"}},
           "batching": {"max_batch_size": 64, "max_queue_delay_ms": 2},
           "runtime": {"commit_interval_ms": 50}, "telemetry": {"status": "off"}, **extra}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(path: Path, observer: Any = None, **limits: Any) -> RunSummary:
    runner, engine = build_runner(load_pipeline(path), observer=observer, **limits)
    try:
        return runner.run()
    finally:
        engine.close()


def write_parquet(path: Path, n: int, start: int = 0) -> None:
    table = pa.table({"id": pa.array(range(start, start + n), pa.int32()),
                      "text": [f"review {i}" for i in range(start, start + n)]})
    pq.write_table(table, path, row_group_size=700)


def test_json_lines_get_one_output_line_each_and_bad_lines_go_to_the_dead_letter_file(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "text": f"t{i}"}) for i in range(300)]
    lines[10], lines[20], lines[30] = "{broken", json.dumps({"no_text": 1}), ""
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    summary = run(pipeline(tmp_path, {"path": "in.jsonl"}, {"path": "out/tagged.jsonl"}))
    assert summary.error is None and summary.num_out == 297 and summary.num_dead_lettered == 2
    out = [json.loads(x) for x in (tmp_path / "out/tagged.jsonl").read_text().splitlines()]
    assert sorted(o["id"] for o in out) == sorted(set(range(300)) - {10, 20, 30})
    assert all(o["tagged"] == f"<T{o['id']}>" for o in out)
    dead = [json.loads(x) for x in (tmp_path / "out/tagged.dead-letters.jsonl").read_text().splitlines()]
    assert [(d["source"], d["error"]["stage"], d["record"]) for d in dead] == [
        ({"file": "in.jsonl", "row": 10}, "decode", "{broken"),
        ({"file": "in.jsonl", "row": 20}, "decode", {"no_text": 1})]
    assert "not valid JSON" in dead[0]["error"]["message"] and dead[0]["error"]["class"] == "CodecError"


def test_parquet_outputs_keep_the_input_columns_and_types_in_part_files(tmp_path: Path) -> None:
    write_parquet(tmp_path / "a.parquet", 1500)
    write_parquet(tmp_path / "b.parquet", 500, start=1500)
    summary = run(pipeline(tmp_path, {"path": "*.parquet", "batch_rows": 256},
                           {"path": "out.parquet", "rows_per_file": 800}))
    assert summary.error is None and summary.num_out == 2000
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.names == ["id", "text", "tagged"] and table.schema.field("id").type == pa.int32()
    assert sorted(table.column("id").to_pylist()) == list(range(2000))
    assert sorted(p.name for p in (tmp_path / "out.parquet").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert json.loads((tmp_path / "out.parquet.checkpoint").read_text())["complete"] is True


def test_a_stopped_run_resumes_from_its_checkpoint_and_a_finished_one_does_nothing(tmp_path: Path) -> None:
    write_parquet(tmp_path / "in.parquet", 5000)
    path = pipeline(tmp_path, {"path": "in.parquet"}, {"path": "out.parquet"})
    first = run(path, max_records=1800)
    state = json.loads((tmp_path / "out.parquet.checkpoint").read_text())
    assert first.num_in >= 1800 and state["complete"] is False
    done_before = state["inputs"]["in.parquet"]["row"]
    assert done_before == first.num_in  # a graceful stop commits everything it took
    second = run(path)
    assert second.num_in == 5000 - done_before
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert sorted(ids) == list(range(5000))  # every row once: the stop was clean
    assert run(path).num_in == 0  # complete: nothing to do, exit 0


def test_new_files_are_read_by_the_next_run_but_changed_inputs_or_settings_are_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in/1.jsonl").write_text("".join(json.dumps({"text": f"a{i}"}) + "\n" for i in range(50)))
    path = pipeline(tmp_path, {"path": "in/*.jsonl"}, {"path": "in/out.jsonl"})  # the output matches the glob
    assert run(path).num_out == 50
    (tmp_path / "in/2.jsonl").write_text("".join(json.dumps({"text": f"b{i}"}) + "\n" for i in range(20)))
    assert run(path).num_out == 20  # only the new file; the output itself is never read back
    assert len((tmp_path / "in/out.jsonl").read_text().splitlines()) == 70

    with open(tmp_path / "in/1.jsonl", "a") as f:
        f.write(json.dumps({"text": "late"}) + "\n")
    with pytest.raises(StartError, match="in/1.jsonl changed since"):
        run(path)
    other = pipeline(tmp_path, {"path": "in/*.jsonl"}, {"path": "in/out.jsonl"}, function="slow_tag")
    with pytest.raises(StartError, match="engine, codec or sink.output settings changed"):
        run(other)
    overwrite = pipeline(tmp_path, {"path": "in/*.jsonl"}, {"path": "in/out.jsonl", "overwrite": True})
    assert run(overwrite).num_out == 71  # starts over: the old output, dead letters and checkpoint removed
    assert len((tmp_path / "in/out.jsonl").read_text().splitlines()) == 71


def test_an_output_without_a_checkpoint_is_never_appended_to_or_overwritten_unasked(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    (tmp_path / "out.jsonl").write_text("someone's data\n")
    with pytest.raises(StartError, match="out.jsonl exists, and no checkpoint"):
        run(pipeline(tmp_path, {"path": "in.jsonl"}, {"path": "out.jsonl"}))
    assert (tmp_path / "out.jsonl").read_text() == "someone's data\n"
    with pytest.raises(StartError, match="no file matches"):
        run(pipeline(tmp_path, {"path": "missing/*.jsonl"}, {"path": "o.jsonl"}))


def test_a_second_run_on_the_same_outputs_is_refused_while_the_first_holds_them(tmp_path: Path) -> None:
    from sluice.connectors.files.run_lock import RunLock

    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    path = pipeline(tmp_path, {"path": "in.jsonl"}, {"path": "out.jsonl"})
    first = RunLock(tmp_path / "out.jsonl.checkpoint.lock")  # what a live run holds
    with pytest.raises(StartError, match="another run is writing these outputs"):
        run(path)
    first.release()
    assert run(path).num_out == 1  # free again (the kernel frees it too when a run dies)


def test_results_that_do_not_fit_the_parquet_schema_stop_the_run_without_checkpointing_them(tmp_path: Path) -> None:
    write_parquet(tmp_path / "in.parquet", 3000)
    summary = run(pipeline(tmp_path, {"path": "in.parquet"}, {"path": "out.parquet", "row_group_rows": 100},
                           function="type_flip"))
    assert summary.error is not None and "'tagged'" in summary.error and "one type per field" in summary.error
    state = json.loads((tmp_path / "out.parquet.checkpoint").read_text()) if (
        tmp_path / "out.parquet.checkpoint").exists() else None
    done = state["inputs"]["in.parquet"]["row"] if state else 0
    assert done < 2000  # the rows with a number result were never claimed


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_shows_a_progress_bar_with_an_eta_and_a_summary_at_the_end(tmp_path: Path) -> None:
    write_parquet(tmp_path / "in.parquet", 400)
    path = pipeline(tmp_path, {"path": "in.parquet"}, {"path": "out.parquet"}, function="slow_tag",
                    batching={"max_batch_size": 4, "max_queue_delay_ms": 1}, telemetry={"status": "auto"})
    loaded = load_pipeline(path)
    terminal = _Terminal()
    run(path, observer=TelemetryObserver(loaded.pipeline, status_stream=terminal))
    text = terminal.getvalue()
    assert "/400 | ETA " in text and "[#" in text and "% " in text
    assert text.rstrip().splitlines()[-1].strip().startswith("done: 400 records in")
