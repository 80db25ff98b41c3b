"""Operator processes (``python -m sluice.cli run FILE``) that a test starts, crashes and stops.

stderr goes to a file, never a pipe: a crashed or paused reader must not block the operator's logging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Operator:
    """One ``sluice run`` process; the test owns it (``close`` kills it if it still runs)."""

    def __init__(self, pipeline: Path, log_path: Path, *, idle_exit_s: float | None = None,
                 env: Mapping[str, str] | None = None, launcher: Sequence[str] = ()) -> None:
        """``launcher``: words put before the command, which must exec it in place (the PID stays the
        operator's), e.g. ``ip netns exec NS`` to run it on a host of tests/support/network.py."""
        # RELIABILITY_LOG_LEVEL=debug: the operators' own logs in full, for chasing a failure
        level = os.environ.get("RELIABILITY_LOG_LEVEL", "info")
        args = [sys.executable, "-m", "sluice.cli", "--log-level", level, "run", str(pipeline)]
        if idle_exit_s is not None:
            args += ["--idle-exit", str(idle_exit_s)]
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen([*launcher, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._log,
                                     env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: a crash, nothing drained or committed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM: the graceful stop (drain, commit, leave the group). Returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"operator {self.pid} still running after {timeout_s}s; log tail:\n"
                               f"{self.log()[-3000:]}\n{self.stacks()}") from None

    def stacks(self) -> str:
        """Every thread's Python stack now (py-spy, a dev dependency), to show where a process is stuck."""
        spy = Path(sys.executable).with_name("py-spy")
        if not spy.exists():
            return "(no stacks: py-spy is not installed)"
        proc = subprocess.run([str(spy), "dump", "--pid", str(self.pid)], capture_output=True, text=True,
                              timeout=60, check=False)
        return f"py-spy dump of operator {self.pid}:\n{proc.stdout}{proc.stderr}"

    def peak_rss_bytes(self) -> int:
        """Peak resident set size so far (Linux VmHWM); the process must still run."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmHWM in /proc/{self.pid}/status")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS in /proc/{self.pid}/status")

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               operators: tuple[Operator, ...] = (), interval_s: float = 0.1) -> None:
    """Poll ``condition`` until true; raise naming ``what`` (with the operators' log tails) on timeout,
    or as soon as one of ``operators`` exits."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        for op in operators:
            if not op.alive():
                raise AssertionError(f"operator {op.pid} exited ({op.proc.returncode}) while waiting for {what}:\n"
                                     f"{op.log()[-3000:]}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- operator {op.pid}:\n{op.log()[-2000:]}" for op in operators)
            raise TimeoutError(f"waited {timeout_s}s for {what}\n{tails}")
        time.sleep(interval_s)


def copy_stops_the_first(pipeline: Path, tmp_path: Path, progress: Callable[[], int], env: Mapping[str, str],
                         head_start: int = 500) -> tuple[str, str]:
    """Run an operator; once ``progress()`` reaches ``head_start``, start a copy from the same pipeline file,
    which stops 3 s after the stream runs dry. The first must exit 1 (the copy made it stop: fenced, say) and
    the copy 0. Returns both logs (first, copy)."""
    first = copy = None
    try:
        first = Operator(pipeline, tmp_path / "first.log", env=env)
        wait_until(lambda: progress() >= head_start, 120, "the first process to produce", (first,))
        copy = Operator(pipeline, tmp_path / "copy.log", idle_exit_s=3, env=env)
        assert first.wait(60) == 1, first.log()[-3000:]
        assert copy.wait(240) == 0, copy.log()[-3000:]
        return first.log(), copy.log()
    finally:
        for op in (first, copy):
            if op is not None:
                op.close()



def run_until_idle(pipeline: Path, log_path: Path, idle_exit_s: float = 2, timeout_s: float = 180,
                   env: Mapping[str, str] | None = None) -> str:
    """Run an operator until it stops on its own (idle for ``idle_exit_s``); it must exit 0 without a
    traceback. Returns its log."""
    op = Operator(pipeline, log_path, idle_exit_s=idle_exit_s, env=env)
    try:
        assert op.wait(timeout_s) == 0, op.log()[-3000:]
    finally:
        op.close()
    assert "Traceback" not in op.log(), op.log()[-3000:]
    return op.log()
