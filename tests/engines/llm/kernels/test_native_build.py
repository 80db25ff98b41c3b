"""How processes share one build of the native CPU kernels (sluice/engines/llm/cpu/native_build.py).

The compiler is replaced by a fake that takes a set time and writes a file, and importing by a stub, so the
protocol -- who builds, who waits and says on whom, when a waiter gives up, what a failure leaves behind --
runs in milliseconds. Threads stand in for processes: each opens the lock file on its own, and ``flock``
locks of two open files exclude each other within one process too. The real compiler and two real
environments are tests/deploy/test_installed_wheel.py's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from sluice.engines.llm.cpu import native_build, native_key


class FakeCompiler:
    """``cpp_extension.load`` taking ``seconds``, writing the module file, counting its calls."""

    def __init__(self, seconds: float, fail: str | None = None) -> None:
        self.seconds = seconds
        self.fail = fail
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, *, name: str, build_directory: str, **_: object) -> types.ModuleType:
        with self.lock:
            self.calls += 1
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError(self.fail)
        Path(build_directory, f"{name}.so").write_bytes(b"a module")
        return types.ModuleType(name)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(native_build, "_import",
                        lambda where: types.ModuleType(where.name) if where.module_file.is_file() else None)
    monkeypatch.setattr(native_build, "_POLL_S", 0.01)
    yield


def _in_threads(cache: Path, count: int, wait_s: float = 30.0) -> list[tuple[types.ModuleType | None, str]]:
    results: list[tuple[types.ModuleType | None, str]] = [(None, "")] * count

    def one(i: int) -> None:
        results[i] = native_build.load_or_build(cache, wait_s=wait_s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # the first one takes the lock
    for thread in threads:
        thread.join()
    return results


def test_one_process_builds_the_others_wait_for_it_and_say_on_whom(
        fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    compiler = FakeCompiler(0.5)
    monkeypatch.setattr(cpp_extension, "load", compiler)
    with caplog.at_level(logging.INFO, logger=native_build.log.name):
        results = _in_threads(tmp_path, 3)
    assert compiler.calls == 1
    assert sorted(how for _, how in results) == ["built", "waited", "waited"]
    assert all(module is not None for module, _ in results)
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(waits) == 2 and all(f"process {os.getpid()}" in line for line in waits), waits
    assert "compiling them for this CPU" in caplog.text and "compiled in" in caplog.text
    # a later start loads it without the lock, builder or wait
    assert native_build.load_or_build(tmp_path)[1] == "loaded"
    assert compiler.calls == 1


def test_a_waiter_that_comes_before_the_holder_says_who_it_is_still_names_it(
        fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Two starts at the same moment: the lock is taken a moment before the holder writes who it is."""
    import fcntl
    import json as json_module

    monkeypatch.setattr(cpp_extension, "load", FakeCompiler(0.0))
    where = native_build.place(tmp_path, native_key.build_key())
    where.directory.mkdir(parents=True)

    def slow_holder() -> None:
        with open(where.lock_file, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            time.sleep(0.5)
            where.owner_file.write_text(json_module.dumps({"pid": 4242, "command": "sluice run x.yaml",
                                                           "started": time.time()}))
            time.sleep(0.5)
            where.owner_file.unlink()

    holder = threading.Thread(target=slow_holder)
    holder.start()
    time.sleep(0.1)
    with caplog.at_level(logging.INFO, logger=native_build.log.name):
        native_build.load_or_build(tmp_path)
    holder.join()
    (line,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert "process 4242 (sluice run x.yaml" in line


def test_a_waiter_gives_up_after_its_bound_and_starts_without_the_kernels(
        fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cpp_extension, "load", FakeCompiler(1.5))
    builder = threading.Thread(target=native_build.load_or_build, args=(tmp_path,))
    builder.start()
    time.sleep(0.1)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger=native_build.log.name):
        module, why = native_build.load_or_build(tmp_path, wait_s=0.3)
    assert module is None and "gave up after" in why
    assert time.monotonic() - began < 1.2
    assert "starting without them" in caplog.text
    builder.join()
    assert native_build.load_or_build(tmp_path)[1] == "loaded"  # the next start has them


def test_a_failed_build_is_not_repeated_by_its_waiters_nor_by_starts_soon_after(
        fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = FakeCompiler(0.3, fail="c++: command not found")
    monkeypatch.setattr(cpp_extension, "load", compiler)
    results = _in_threads(tmp_path, 2)
    assert compiler.calls == 1
    assert all(module is None and "c++: command not found" in why for module, why in results)
    assert "c++: command not found" in native_build.load_or_build(tmp_path)[1]
    assert compiler.calls == 1
    where = native_build.place(tmp_path, native_key.build_key())
    failed = json.loads(where.failed_file.read_text())
    where.failed_file.write_text(json.dumps({**failed, "at": failed["at"] - native_build.FAILURE_TTL_S - 1}))
    compiler.fail = None
    assert native_build.load_or_build(tmp_path)[1] == "built"  # an old failure is tried again
    assert not where.failed_file.exists()


def test_an_interrupted_build_leaves_nothing_half_written_and_the_next_start_builds(
        fake: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*, build_directory: str, **_: object) -> None:
        Path(build_directory, "half.o").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(cpp_extension, "load", interrupted)
    with pytest.raises(KeyboardInterrupt):
        native_build.load_or_build(tmp_path)
    where = native_build.place(tmp_path, native_key.build_key())
    assert not where.module_file.exists() and not list(where.directory.glob("build-*"))
    assert not where.failed_file.exists()  # an interruption is not a failure
    monkeypatch.setattr(cpp_extension, "load", FakeCompiler(0.0))
    assert native_build.load_or_build(tmp_path)[1] == "built"


def test_the_key_covers_what_changes_the_binary_and_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    key = native_key.build_key()
    monkeypatch.setattr("sys.prefix", "/another/venv")
    monkeypatch.setattr("sys.executable", "/another/venv/bin/python")
    assert native_key.build_key() == key  # two environments with one torch share the build
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert native_key.build_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(native_key, "cpu_identity", lambda: "flags : fpu sse2")
    assert native_key.build_key() != key
    monkeypatch.undo()
    monkeypatch.setattr(native_key, "compiler_identity", lambda: "c++ (GCC) 99.0")
    assert native_key.build_key() != key
