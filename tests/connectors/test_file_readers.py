"""Reading input files a chunk at a time: every row once, in order, resumable at any handed-out position, never
past the size the file had at start, and an overlong line cut instead of read whole."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.connectors.files import readers
from sluice.connectors.files.readers import JsonLinesReader, ParquetReader


def read_all(reader: JsonLinesReader | ParquetReader, step: int) -> list[readers.Row]:
    out: list[readers.Row] = []
    while not reader.eof:
        rows = reader.read(step)
        out.extend(rows)
        if not rows:
            break
    return out


def test_json_lines_skip_blank_lines_keep_line_numbers_and_read_a_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n   \n{"a": 2}\r\n{"a": 3}')
    reader = JsonLinesReader(path, 0, 0, path.stat().st_size, max_line_bytes=1000)
    rows = read_all(reader, 10)
    assert [(r.offset, r.value) for r in rows] == [(0, b'{"a": 1}'), (3, b'{"a": 2}'), (4, b'{"a": 3}')]
    assert [r.byte for r in rows] == [0, 14, 24]  # where each line starts: a resume seeks there
    assert reader.next_position() == (5, path.stat().st_size)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(st.just(""), st.just("  "), st.text(st.characters(codec="utf-8",
                      exclude_characters="\n\r"), min_size=1, max_size=30)), max_size=40),
       block=st.integers(1, 64), step=st.integers(1, 7), resume_at=st.integers(0, 40),
       final_newline=st.booleans())
def test_a_resume_from_any_handed_out_position_reads_exactly_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[str], block: int, step: int,
        resume_at: int, final_newline: bool) -> None:
    monkeypatch.setattr(readers, "_BLOCK_BYTES", block)  # lines straddle blocks
    path = tmp_path / "prop.jsonl"
    path.write_bytes(("\n".join(lines) + ("\n" if final_newline and lines else "")).encode())
    size = path.stat().st_size
    expected = [(i, line.encode()) for i, line in enumerate(lines) if line.encode().strip()]  # ASCII blanks
    rows = read_all(JsonLinesReader(path, 0, 0, size, max_line_bytes=10_000), step)
    assert [(r.offset, r.value) for r in rows] == expected
    if not rows:
        return
    cut = rows[min(resume_at, len(rows) - 1)]
    rest = read_all(JsonLinesReader(path, cut.offset, cut.byte, size, max_line_bytes=10_000), step)
    assert [(r.offset, r.value) for r in rest] == [e for e in expected if e[0] >= cut.offset]


def test_lines_appended_after_the_start_are_left_for_the_next_run(tmp_path: Path) -> None:
    path = tmp_path / "grows.jsonl"
    path.write_bytes(b"1\n2\n")
    size_at_start = path.stat().st_size
    reader = JsonLinesReader(path, 0, 0, size_at_start, max_line_bytes=100)
    with open(path, "ab") as f:
        f.write(b"3\n4\n")
    assert [r.value for r in read_all(reader, 100)] == [b"1", b"2"]


def test_an_overlong_line_is_handed_out_cut_past_the_bound_and_the_lines_after_it_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "_BLOCK_BYTES", 1000)
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"x" * 50_000 + b'\n{"a": 2}\n' + b"y" * 30_000)
    rows = read_all(JsonLinesReader(path, 0, 0, path.stat().st_size, max_line_bytes=100), 10)
    assert [r.offset for r in rows] == [0, 1, 2, 3]
    assert rows[1].value == b"x" * 101 and rows[3].value == b"y" * 101  # the codec refuses it with its bound
    assert rows[2].value == b'{"a": 2}' and rows[2].byte == 9 + 50_001


def test_parquet_rows_become_json_objects_in_order_from_any_start_row(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    n = 1000
    table = pa.table({
        "id": pa.array(range(n), pa.int32()),
        "text": [None if i % 7 == 0 else f"row {i}" for i in range(n)],
        "score": [i / 8 for i in range(n)],
        "tags": [[f"t{i % 3}"] for i in range(n)],
        "at": [dt.datetime(2024, 1, 1) + dt.timedelta(minutes=i) for i in range(n)],
    })
    pq.write_table(table, path, row_group_size=128)  # the start row lands inside a row group
    expected = table.to_pylist()
    for start, batch_rows, step in ((0, 1000, 1000), (300, 64, 50), (999, 10, 3), (1000, 10, 3)):
        reader = ParquetReader(path, start, batch_rows)
        rows = read_all(reader, step)
        assert [r.offset for r in rows] == list(range(start, n))
        got = [json.loads(r.value) for r in rows]
        assert [g["id"] for g in got] == [e["id"] for e in expected[start:]]
        assert [g["text"] for g in got] == [e["text"] for e in expected[start:]]
        assert [g["tags"] for g in got] == [e["tags"] for e in expected[start:]]
        assert all(dt.datetime.fromisoformat(g["at"]) == e["at"] for g, e in zip(got, expected[start:], strict=True))
        assert reader.eof and reader.next_position() == (n, 0)
