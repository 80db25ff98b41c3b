"""Every ``sluice`` command fails in one line, on every model directory a user can get wrong.

The broken directories (tests/support/broken_models.py) go through ``sluice run`` with each model engine,
``sluice validate`` and ``sluice models export``, as a user types them (a process, ``--log-level error`` so
that only the error line is left): one line, no traceback. ``sluice validate`` refuses what the model's
files say before any weights (``<file>: engine.model: ...``), never a model that ``sluice run`` would
start. A directory with its own code is refused under a terminal without a prompt, its code not run; with
``trust_remote_code: true`` it runs. A signal during a model load stops it at once with one line and the
conventional exit code.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.broken_models import MARKER_ENV, build_all

SLUICE = [sys.executable, "-m", "sluice.cli"]
TASK_OF = {"wrong-head": "text-classification", "no-pad-token": "text-classification"}


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: Path) -> dict[str, Path]:
    from sluice.model_store import fetch

    return build_all(tmp_path_factory.mktemp("broken-models"), fetch("minilm-l6"), smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    from sluice.model_store import fetch

    return next(fetch("smollm2-135m").glob("*.gguf"))


def _pipeline(directory: Path, engine: str, model: Path, *, extra: str = "") -> Path:
    options = f", task: {TASK_OF.get(model.name, 'text-embedding')}" if engine != "llm" else ", max_tokens: 4"
    (directory / "in.jsonl").write_text('{"text": "a review"}\n')
    path = directory / f"{engine}-{model.name}{'-trusted' if extra else ''}.yaml"
    path.write_text(f"name: broken\nsource: {{file: {{path: in.jsonl}}}}\n"
                    f"engine: {{type: {engine}, model: {model}{options}{extra}}}\n"
                    f"sink: {{file: {{path: out-{path.stem}.jsonl, overwrite: true}}}}\n")
    return path


def _sluice(*args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SLUICE, "--log-level", "error", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout_s, env=env)


def _lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]


@pytest.mark.slow  # ./dev test fast leaves it out
def test_every_command_fails_in_one_line_on_every_broken_model_directory(broken: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    commands: list[tuple[str, tuple[str, ...]]] = []
    for name, model in broken.items():
        task = TASK_OF.get(name, "text-embedding")
        commands.append((name, ("models", "export", str(model), "--task", task, "--out", str(tmp_path / f"{name}.onnx"))))
        for engine in ("onnx", "torch", "llm"):
            pipeline = _pipeline(tmp_path, engine, model)
            commands += [(name, ("validate", str(pipeline))), (name, ("run", str(pipeline)))]
    env = dict(os.environ, **{MARKER_ENV: str(tmp_path / "marker")}, SLUICE_CACHE_DIR=str(tmp_path / "cache"))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: (job, _sluice(*job[1], env=env)), commands))
    problems = []
    runs = {args[1]: proc for (_, args), proc in results if args[0] == "run"}
    refused_by_validate = set()
    for (name, args), proc in results:
        lines = _lines(proc)
        if args[0] == "validate":  # ok, or one line refusing the model, when its run fails too
            errors = [line for line in lines if ": warning: " not in line]
            refused = proc.returncode == 1 and len(errors) == 1 and errors[0].startswith(f"{args[1]}: engine.model: ")
            if refused:
                refused_by_validate.add((name, Path(args[1]).name.partition("-")[0]))
            if "Traceback" in proc.stderr or not (proc.returncode == 0 or (refused and runs[args[1]].returncode)):
                problems.append(f"{name}: sluice validate -> rc {proc.returncode}:\n  " + "\n  ".join(lines[-5:]))
            continue
        exported_without_tokenizer = name == "no-tokenizer" and args[0] == "models"  # a graph needs no tokenizer
        expected_ok = exported_without_tokenizer
        if "Traceback" in proc.stderr or (proc.returncode == 0) != expected_ok or \
                (not expected_ok and (len(lines) != 1 or not lines[0].startswith(("sluice: error: ",
                                                                                 "sluice: cannot start: ")))):
            problems.append(f"{name}: sluice {' '.join(args[:2])} -> rc {proc.returncode}:\n  " + "\n  ".join(lines[-5:]))
    assert not problems, "\n".join(problems)
    assert not (tmp_path / "marker").exists(), "a model directory's own code ran"
    # validate reads what is cheap: an encoder is no LLM, nor a classifier without its head
    assert {("wrong-head", "llm"), ("wrong-head", "onnx"), ("wrong-head", "torch")} <= refused_by_validate
    # the refusal says what to do
    custom = next(proc for (name, args), proc in results if name == "custom-code" and args[0] == "run"
                  and "torch-" in args[1])
    assert "engine.trust_remote_code: true" in custom.stderr


def _under_a_terminal(args: list[str], env: dict[str, str], timeout_s: float = 120) -> tuple[int, str]:
    """Run ``args`` with a pseudo-terminal as stdin, stdout and stderr; its exit code and all it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    output = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the other side closed
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return code, output.decode(errors="replace")


@pytest.mark.slow  # ./dev test fast leaves it out
@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_a_model_with_its_own_code_is_refused_under_a_terminal_and_runs_when_trusted(
        broken: dict[str, Path], tmp_path: Path, engine: str) -> None:
    marker = tmp_path / "marker"
    env = dict(os.environ, **{MARKER_ENV: str(marker)}, SLUICE_CACHE_DIR=str(tmp_path / "cache"))
    pipeline = _pipeline(tmp_path, engine, broken["custom-code"])
    began = time.monotonic()
    code, output = _under_a_terminal([*SLUICE, "--log-level", "error", "run", str(pipeline)], env)
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1, output
    assert len(lines) == 1 and "engine.trust_remote_code: true" in lines[0], output
    assert "[y/N]" not in output and "Traceback" not in output
    assert not marker.exists()
    assert time.monotonic() - began < 60  # no prompt waited on

    trusted = _pipeline(tmp_path, engine, broken["custom-code"], extra=", trust_remote_code: true")
    code, output = _under_a_terminal([*SLUICE, "--log-level", "error", "run", str(trusted)], env)
    assert code == 0, output
    assert marker.exists()
    assert (tmp_path / f"out-{trusted.stem}.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_the_model_load_stops_at_once_in_one_line(tmp_path: Path, smollm2_gguf: Path,
                                                                   signum: int, code: int) -> None:
    """The LLM engine's first start compiles kernels into an empty cache: the signal lands in that phase."""
    pipeline = _pipeline(tmp_path, "llm", smollm2_gguf)
    env = dict(os.environ, SLUICE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([*SLUICE, "run", str(pipeline)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        _wait_for_line(proc, "native CPU kernels: compiling", timeout_s=120)
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        stopped_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert stopped_s < 10
    assert err.strip().splitlines()[-1] == \
        f"sluice: stopped by {signal.Signals(signum).name} while starting; nothing was consumed"
    assert "Traceback" not in err
    assert not list((tmp_path / "cache" / "kernels").glob("*/build-*")), "the interrupted build's files remain"


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout_s: float) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no line with {text!r} within {timeout_s} s:\n{''.join(seen)[-3000:]}")
