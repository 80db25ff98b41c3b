"""Provider names and per-provider options of the ONNX engine (no GPU needed)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sluice.engines.onnx.execution_providers import fallback_line, full_name, report_providers, with_options


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


CPU_BUILD = ["AzureExecutionProvider", "CPUExecutionProvider"]
TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


def test_falling_back_along_the_listed_providers_is_one_info_line() -> None:
    level, line = fallback_line([TRT, CUDA, CPU], CPU_BUILD, [CPU])
    assert level == logging.INFO
    assert line == ("onnx engine: runs on CPUExecutionProvider, the first listed one usable here; skipped "
                    "TensorrtExecutionProvider, CUDAExecutionProvider: not in this onnxruntime build "
                    "(onnxruntime-gpu has the GPU providers)")
    # in the build but no GPU: onnxruntime dropped CUDA from the session, CPU was listed after it
    level, line = fallback_line([CUDA, CPU], [CUDA, CPU], [CPU])
    assert level == logging.INFO and "CUDAExecutionProvider: failed to initialise" in line


def test_the_first_listed_provider_running_says_nothing() -> None:
    assert fallback_line([CPU], CPU_BUILD, [CPU]) is None
    assert fallback_line([CUDA, CPU], [CUDA, CPU], [CUDA, CPU]) is None


def test_a_warning_only_when_no_listed_provider_runs_and_onnxruntime_falls_back_further() -> None:
    level, line = fallback_line([TRT, CUDA], [TRT, CUDA, CPU], [CPU])
    assert level == logging.WARNING
    assert line.startswith("onnx engine: none of the listed providers could be used, onnxruntime fell back to "
                           "CPUExecutionProvider; skipped TensorrtExecutionProvider, CUDAExecutionProvider: "
                           "failed to initialise")


def test_report_providers_logs_the_line_at_its_level(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="sluice.engines.onnx.onnx_engine"):
        report_providers([TRT, CUDA, CPU], CPU_BUILD, [CPU])
        report_providers([CPU], CPU_BUILD, [CPU])
    assert [r.levelname for r in caplog.records] == ["INFO"]
