"""Instance slots: unique among live holders, freed by any kind of exit, reused lowest first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sluice.operator.instance import NoFreeSlot, claim_slot


def test_live_holders_get_distinct_slots_and_a_released_one_is_reused(tmp_path: Path) -> None:
    a, b, c = (claim_slot("group", tmp_path) for _ in range(3))
    assert [a.slot, b.slot, c.slot] == [0, 1, 2]
    b.release()
    b.release()  # idempotent
    assert claim_slot("group", tmp_path).slot == 1  # the lowest free one, not a new one
    assert claim_slot("other group", tmp_path).slot == 0  # groups count separately
    a.release()
    c.release()


def test_names_that_are_not_file_names_are_made_safe(tmp_path: Path) -> None:
    s = claim_slot("../etc/passwd group", tmp_path)
    assert s.path.parent == tmp_path and s.slot == 0
    s.release()


def test_a_process_killed_with_sigkill_frees_its_slot(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from sluice.operator.instance import claim_slot
            s = claim_slot("g", Path({str(tmp_path)!r}))
            print(s.slot, flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "0"
        mine = claim_slot("g", tmp_path)
        assert mine.slot == 1  # another process holds 0
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        assert claim_slot("g", tmp_path).slot == 0  # its replacement takes the dead one's slot
        mine.release()
    finally:
        holder.kill()
        holder.wait()


def test_an_unusable_lock_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(NoFreeSlot, match="SLUICE_RUN_DIR"):
        claim_slot("g", blocker / "sub")
