"""The checkpoint: saved atomically, read back as written, refused when it is not one, and never ahead of the
outputs -- positions offered are saved only once the outputs written before the offer are durable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sluice.connectors.files import run_checkpoint as cp


def test_a_saved_state_reads_back_the_same_and_says_when_it_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "run.checkpoint"
    state = cp.State("abc", {"a.jsonl": cp.InputState(100, 5, row=3, byte=40, end=None),
                             "b.parquet": cp.InputState(900, 6, row=10, end=10)}, {"output": {"bytes": 77}})
    cp.save(path, state)
    assert cp.load(path) == state and not state.complete
    assert json.loads(path.read_text())["complete"] is False
    done = cp.State("abc", {"b.parquet": cp.InputState(900, 6, row=10, end=10)})
    cp.save(path, done)
    assert cp.load(path) == done and done.complete and json.loads(path.read_text())["complete"] is True
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert cp.load(tmp_path / "none") is None


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 99}', '{"version": 1, "fingerprint": "x"}',
                                  '{"version": 1, "fingerprint": "x", "inputs": {"a": {"rows": 1}}}'])
def test_a_file_that_is_not_a_checkpoint_is_refused_with_what_to_do(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.checkpoint"
    path.write_text(text)
    with pytest.raises(cp.CheckpointProblem, match="delete it"):
        cp.load(path)


class FakeOutputs:
    """Outputs whose durable point the test moves by hand."""

    def __init__(self) -> None:
        self.num_written = 0
        self.durable = 0
        self.num_syncs = 0

    def sync(self) -> tuple[int, dict[str, Any]]:
        self.num_syncs += 1
        return self.durable, {"output": {"durable": self.durable}}


def rows(n: int) -> dict[str, cp.InputState]:
    return {"in.parquet": cp.InputState(1, 1, row=n, end=100)}


def test_positions_are_saved_only_once_the_outputs_written_before_them_are_durable(tmp_path: Path) -> None:
    path = tmp_path / "run.checkpoint"
    outputs = FakeOutputs()
    keeper = cp.Checkpoint(path, cp.State("f", rows(0)), outputs)
    outputs.num_written = 10
    keeper.offer(rows(10))  # rows 0..9 written, not durable yet
    assert not path.exists()
    outputs.num_written = 20
    keeper.offer(rows(20))
    outputs.durable = 15  # a Parquet part closed after the first offer, before the second
    outputs.num_written = 25
    keeper.offer(rows(25))
    saved = cp.load(path)
    assert saved is not None and saved.inputs["in.parquet"].row == 10  # not 20: rows 15..19 may be lost
    assert saved.outputs == {"output": {"durable": 15}}
    outputs.durable = 25
    keeper.offer(rows(25))
    saved = cp.load(path)
    assert saved is not None and saved.inputs["in.parquet"].row == 25 and keeper.num_saved == 2


def test_without_file_outputs_every_offer_is_saved_at_once(tmp_path: Path) -> None:
    path = tmp_path / "run.checkpoint"
    keeper = cp.Checkpoint(path, cp.State("f", rows(0), {"kept": 1}))  # outputs on Kafka: durable when delivered
    keeper.offer(rows(7))
    saved = cp.load(path)
    assert saved is not None and saved.inputs["in.parquet"].row == 7 and saved.outputs == {"kept": 1}
    keeper.offer(rows(7))
    assert keeper.num_saved == 1  # nothing changed: not written again
