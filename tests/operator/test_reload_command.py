"""``sluice reload`` and the PID files it finds running pipelines by (sluice/operator/reload/pid_file.py,
command.py): only live, announced processes are signalled; everything else is a clear refusal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sluice.cli import main
from sluice.operator.reload import pid_file
from tests.integration.pipelines import ROOT

PIPELINE = """
name: %s
source: {kafka: {bootstrap_servers: "127.0.0.1:1", topics: [in], group_id: %s}}
engine: {type: python, function: "tests.integration.funcs:tag"}
sink: {kafka: {topic: out}}
"""

CHILD = textwrap.dedent("""
    import signal, sys, time
    from sluice.operator.reload.pid_file import announce
    got = []
    signal.signal(signal.SIGHUP, lambda *_: got.append(1))
    announce(sys.argv[1], sys.argv[2])
    print("ready", flush=True)
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    print("reloaded" if got else "no signal", flush=True)
""")


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_RUN_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


def test_only_live_announced_processes_are_found_and_stale_files_go(run_dir: Path) -> None:
    mine = pid_file.announce("it", "g")
    assert [(a.pid, a.pipeline, a.group) for a in pid_file.find("it", "g")] == [(os.getpid(), "it", "g")]
    assert pid_file.find("other", "g") == [] and pid_file.find("it", "other") == []
    stale = run_dir / "it.g.999999999.pid"  # a process killed with -9: its file stays, its lock is gone
    stale.write_text("999999999\n")
    assert [a.pid for a in pid_file.find()] == [os.getpid()] and not stale.exists()
    mine.release()
    mine.release()  # idempotent
    assert pid_file.find() == [] and list(run_dir.iterdir()) == []


def test_reload_refuses_a_process_that_is_not_an_announced_sluice_run(run_dir: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reload", "--pid", str(os.getppid())]) == 1  # a real process, but not ours to signal
    assert "not a running 'sluice run'" in capsys.readouterr().err
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE % ("enrich", "g1"))
    assert main(["reload", str(path)]) == 1
    err = capsys.readouterr().err
    assert "no running 'sluice run' of pipeline 'enrich' (group 'g1')" in err and "Traceback" not in err
    path.write_text("source: [")
    assert main(["reload", str(path)]) == 1 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("by", ["pipeline", "pid"])
def test_reload_signals_the_running_process_of_the_pipeline(run_dir: Path, tmp_path: Path, by: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE % ("enrich", "g1"))
    child = subprocess.Popen([sys.executable, "-c", CHILD, "enrich", "g1"], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "SLUICE_RUN_DIR": str(run_dir)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert main(["reload", str(path)] if by == "pipeline" else ["reload", "--pid", str(child.pid)]) == 0
        assert f"asked process {child.pid} (pipeline enrich, group g1) to reload" in capsys.readouterr().out
        assert child.stdout.readline().strip() == "reloaded"
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
    deadline = time.monotonic() + 5
    while pid_file.find() and time.monotonic() < deadline:  # the child died holding no lock: its file is stale
        time.sleep(0.05)
    assert pid_file.find() == []
