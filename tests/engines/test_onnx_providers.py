"""Provider names and per-provider options of the ONNX engine (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.engines.onnx_providers import full_name, with_options


def test_short_names_expand_and_full_names_pass() -> None:
    assert [full_name(n) for n in ("TensorRT", "cuda", "CPU")] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert full_name("OpenVINOExecutionProvider") == "OpenVINOExecutionProvider"
    with pytest.raises(ValueError, match="unknown provider 'gpu'"):
        full_name("gpu")


def test_tensorrt_gets_one_profile_from_one_token_to_the_full_batch(minilm_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))
    entries = with_options(["TensorrtExecutionProvider", "CPUExecutionProvider"], minilm_dir / "model.onnx",
                           max_batch_size=32, max_length=256, token_inputs=True)
    (name, options), cpu = entries
    assert (name, cpu) == ("TensorrtExecutionProvider", "CPUExecutionProvider")
    assert options["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1"
    assert options["trt_profile_max_shapes"] == "input_ids:32x256,attention_mask:32x256"
    assert options["trt_engine_cache_path"].startswith(str(tmp_path))


def test_other_providers_get_no_options(minilm_dir: Path) -> None:
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert with_options(providers, minilm_dir / "model.onnx", max_batch_size=8, max_length=64,
                        token_inputs=True) == providers
