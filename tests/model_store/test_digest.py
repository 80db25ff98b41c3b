"""Model content digests and fingerprints (sluice/model_store/digest.py): identical content, identical digest;
any byte changed, another digest; an unchanged file is never read twice; every kind of swap is seen."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.model_store import digest as digest_module
from sluice.model_store.digest import content_digest, fingerprint, model_files, size_bytes


def model_dir(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_a_file_hashes_to_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"weights" * 1000)
    assert content_digest(tmp_path / "m.onnx", tmp_path / "cache") == hashlib.sha256(b"weights" * 1000).hexdigest()


@settings(max_examples=40, deadline=None)
@given(files=st.dictionaries(st.sampled_from(["config.json", "model.onnx", "1_Pooling/config.json", "tok.json"]),
                             st.binary(max_size=300), min_size=1),
       flip=st.integers(min_value=0))
def test_identical_content_anywhere_has_one_digest_and_any_change_another(tmp_path_factory: pytest.TempPathFactory,
                                                                         files: dict[str, bytes], flip: int) -> None:
    root = tmp_path_factory.mktemp("digest")
    cache = root / "cache"
    a = model_dir(root / "a", files)
    b = root / "elsewhere" / "b"
    shutil.copytree(a, b)  # new inodes, new times, another place
    os.utime(b / next(iter(files)), (1, 1))
    assert content_digest(a, cache) == content_digest(b, cache) == content_digest(b, cache)
    name = sorted(files)[flip % len(files)]
    data = bytearray((b / name).read_bytes() or b"\0")
    data[flip % len(data)] ^= 0x01
    (b / name).write_bytes(bytes(data))
    assert content_digest(a, cache) != content_digest(b, cache)


def test_renaming_a_file_inside_the_model_changes_the_digest_hidden_files_do_not(tmp_path: Path) -> None:
    a = model_dir(tmp_path / "a", {"model.onnx": b"w", "tokenizer.json": b"t"})
    before = content_digest(a, tmp_path / "cache")
    model_dir(a, {".git/HEAD": b"ref", ".cache/x": b"y"})  # hidden: not part of the model
    assert content_digest(a, tmp_path / "cache") == before
    (a / "tokenizer.json").rename(a / "vocab.json")
    assert content_digest(a, tmp_path / "cache") != before


def test_symlinks_are_followed_and_a_kubernetes_style_data_link_counts_once(tmp_path: Path) -> None:
    real = model_dir(tmp_path / "real", {"model.onnx": b"w", "tokenizer.json": b"t"})
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    (mounted / "..2024_01_01").symlink_to(real)
    (mounted / "..data").symlink_to("..2024_01_01")
    for name in ("model.onnx", "tokenizer.json"):
        (mounted / name).symlink_to(f"..data/{name}")
    assert content_digest(mounted, tmp_path / "cache") == content_digest(real, tmp_path / "cache")
    assert [name for name, _, _ in model_files(mounted)] == ["model.onnx", "tokenizer.json"]


def test_a_symlink_loop_inside_a_model_directory_is_walked_once(tmp_path: Path) -> None:
    a = model_dir(tmp_path / "a", {"sub/model.onnx": b"w"})
    (a / "sub" / "again").symlink_to(a)
    assert [name for name, _, _ in model_files(a)] == ["sub/model.onnx"]


def test_an_unchanged_file_is_hashed_once_and_a_rewritten_one_again(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    a = model_dir(tmp_path / "a", {"model.onnx": b"w" * 100, "config.json": b"{}"})
    monkeypatch.setattr(digest_module, "_RACY_S", 0.0)  # as if written long ago
    hashed: list[str] = []
    real_hash = digest_module._hash_file
    monkeypatch.setattr(digest_module, "_hash_file", lambda p: hashed.append(p.name) or real_hash(p))
    first = content_digest(a, tmp_path / "cache")
    assert sorted(hashed) == ["config.json", "model.onnx"]
    hashed.clear()
    assert content_digest(a, tmp_path / "cache") == first and hashed == []  # from the cache, nothing read
    (a / "model.onnx").write_bytes(b"v" * 100)  # same size; mtime put back as `cp -p` or `touch -d` would
    os.utime(a / "model.onnx", (time.time() - 10, time.time() - 10))
    assert content_digest(a, tmp_path / "cache") != first and hashed == ["model.onnx"]  # ctime moved: re-read


def test_a_file_written_just_now_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.bin").write_bytes(b"fresh")
    hashed: list[str] = []
    real_hash = digest_module._hash_file
    monkeypatch.setattr(digest_module, "_hash_file", lambda p: hashed.append(p.name) or real_hash(p))
    content_digest(tmp_path / "m.bin", tmp_path / "cache")
    content_digest(tmp_path / "m.bin", tmp_path / "cache")
    assert hashed == ["m.bin", "m.bin"]  # a write within the same timestamp tick could go unnoticed


def test_an_unwritable_cache_costs_a_rehash_not_a_failure(tmp_path: Path) -> None:
    (tmp_path / "m.bin").write_bytes(b"x")
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory would be")
    assert content_digest(tmp_path / "m.bin", blocker) == hashlib.sha256(b"x").hexdigest()


def test_the_fingerprint_sees_every_kind_of_swap_and_a_missing_model_is_none(tmp_path: Path) -> None:
    v1 = model_dir(tmp_path / "v1", {"model.onnx": b"one"})
    v2 = model_dir(tmp_path / "v2", {"model.onnx": b"one"})  # identical content, other files
    current = tmp_path / "current"
    current.symlink_to(v1)
    seen = fingerprint(current)
    assert seen is not None and fingerprint(current) == seen  # stable while nothing changes
    tmp = tmp_path / "current.tmp"
    tmp.symlink_to(v2)
    os.replace(tmp, current)  # `ln -sfn v2 current.tmp && mv -T current.tmp current`
    swapped = fingerprint(current)
    assert swapped not in (None, seen)
    (v2 / "model.onnx.new").write_bytes(b"two")
    os.replace(v2 / "model.onnx.new", v2 / "model.onnx")  # a file replaced inside the directory
    assert fingerprint(current) not in (None, swapped)
    current.unlink()
    assert fingerprint(current) is None
    assert size_bytes(current) == 0 and size_bytes(v1) == 3
