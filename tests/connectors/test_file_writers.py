"""Output files: cut back to a checkpoint, torn lines dropped, Parquet parts invisible until closed, one schema
for every part (nulls promoted, the input's types kept), rows that do not fit refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.connectors.files.writers import JsonLinesWriter, ParquetPartsWriter, SchemaMismatch


def lines(*docs: object) -> list[bytes]:
    return [json.dumps(d).encode() for d in docs]


def test_json_lines_cut_back_to_the_checkpoint_or_after_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":2}\n{"a":3}\n')
    w = JsonLinesWriter(path, start_bytes=8)  # the checkpoint counted the first line only
    w.write(lines({"a": 9}))
    assert w.sync() == path.stat().st_size
    w.close()
    assert path.read_bytes() == b'{"a":1}\n{"a": 9}\n'
    path.write_bytes(b'{"a":1}\n{"a":2}\n{"a')  # a crash mid-line, no checkpoint (a Kafka source)
    w = JsonLinesWriter(path, start_bytes=None)
    w.write(lines({"a": 3}))
    w.close()
    assert path.read_bytes() == b'{"a":1}\n{"a":2}\n{"a": 3}\n'
    with pytest.raises(FileNotFoundError, match="checkpoint counts 999"):
        JsonLinesWriter(path, start_bytes=999)


def writer(directory: Path, kept: list[str] | None = None, clock: list[float] | None = None, **kw: object
           ) -> ParquetPartsWriter:
    now = clock if clock is not None else [0.0]
    options: dict[str, object] = {"rows_per_file": 100, "roll_interval_s": 60.0, "row_group_rows": 10,
                                  "input_schema": None}
    options.update(kw)
    return ParquetPartsWriter(directory, kept, clock=lambda: now[0], **options)  # type: ignore[arg-type]


def test_parts_roll_by_rows_and_by_time_and_are_hidden_until_closed(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    clock = [0.0]
    w = writer(out, clock=clock, rows_per_file=25)
    w.write(lines(*({"i": i} for i in range(30))))
    assert w.parts == ["part-00000.parquet"]  # 25 rows, then a new part
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == ["part-00000.parquet"]
    assert not w.roll_due()
    clock[0] = 61.0
    assert w.roll_due() and w.roll() and not w.is_open
    assert w.parts == ["part-00000.parquet", "part-00001.parquet"]
    assert pq.read_table(out).column("i").to_pylist() == list(range(30))  # the directory reads as one table
    assert not w.roll()  # nothing open


def test_reopened_from_a_checkpoint_it_removes_later_parts_and_temporaries_and_keeps_the_schema(
        tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    w = writer(out)
    for i in range(3):
        w.write(lines({"i": i, "f": 0.5}))
        w.roll()
    w.write(lines(*({"i": 3, "f": 0.5} for _ in range(10))))  # a row group of an open part: a crash leaves
    # its temporary file
    assert any(p.name.endswith(".tmp") for p in out.iterdir())
    w2 = writer(out, kept=["part-00000.parquet", "part-00001.parquet"])
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    w2.write(lines({"i": 7, "f": 1}))  # an integer where the file has doubles: cast to the file's type
    w2.close()
    assert w2.parts[-1] == "part-00002.parquet"
    table = pq.read_table(out)
    assert table.column("i").to_pylist() == [0, 1, 7] and table.schema.field("f").type == pa.float64()
    with pytest.raises(FileNotFoundError, match="part-00009"):
        writer(out, kept=["part-00009.parquet"])


def test_the_first_row_group_fixes_the_schema_with_nulls_promoted_and_the_input_types_kept(tmp_path: Path) -> None:
    input_schema = pa.schema([("id", pa.int16()), ("text", pa.string()), ("when", pa.timestamp("us"))])
    w = writer(tmp_path / "out.parquet", input_schema=input_schema, row_group_rows=4)
    w.write(lines({"id": 1, "text": "a", "when": "2024-05-01T10:00:00", "label": None}))
    w.write(lines({"id": 2, "text": "b", "when": "2024-05-01T11:00:00", "label": "pos"}))
    w.write(lines(*({"id": i, "text": "c", "when": "2024-05-02T00:00:00", "label": "neg"} for i in (3, 4))))
    assert w.schema is not None
    assert w.schema.field("id").type == pa.int16() and w.schema.field("when").type == pa.timestamp("us")
    assert w.schema.field("label").type == pa.string()  # null in the first write, text later: text
    w.write(lines({"id": 5, "text": "d", "when": "2024-05-03T00:00:00"}))  # a field left out: null
    with pytest.raises(SchemaMismatch, match="'extra'"):
        w.write(lines({"id": 6, "text": "e", "when": "2024-05-03T00:00:00", "label": "x", "extra": 1}))
    with pytest.raises(SchemaMismatch, match="'id'"):
        w.write(lines({"id": "seven", "text": "e", "when": "2024-05-03T00:00:00", "label": "x"}))
    w.close()
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column("label").to_pylist() == [None, "pos", "neg", "neg", None]
