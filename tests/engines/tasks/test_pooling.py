"""The pooler against sentence-transformers' Pooling module, on numpy and on torch, and its config reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sluice.engines.backends.arrays import NUMPY_OPS, TorchOps
from sluice.engines.engine_contract import EngineStartError
from sluice.engines.tasks.pooling import POOLING_MODES, PoolingSpec, pool, read_pooling_config
from sluice.engines.torch.placement import HostStaging

ST_NAMES = {"mean": "mean", "cls": "cls", "max": "max", "last-token": "lasttoken", "weighted-mean": "weightedmean",
            "mean-sqrt-len": "mean_sqrt_len_tokens"}


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded rows of lengths 5, 3, 4, 7 (one full): hidden (4, 7, 6), mask (4, 7); padding is garbage."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(4, 7, 6)).astype(np.float32)
    mask = np.zeros((4, 7), dtype=np.int64)
    for row, length in enumerate((5, 3, 4, 7)):
        mask[row, :length] = 1
        hidden[row, length:] = 1e4  # must never leak into any mode
    return hidden, mask


def _reference(hidden: np.ndarray, mask: np.ndarray, modes: tuple[str, ...], prompt_length: int = 0) -> np.ndarray:
    from sentence_transformers.sentence_transformer.modules import Pooling

    st_modes = tuple(ST_NAMES[m] for m in modes)
    module = Pooling(hidden.shape[-1], pooling_mode=st_modes[0] if len(st_modes) == 1 else st_modes,
                     include_prompt=prompt_length == 0)
    features = {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)}
    if prompt_length:
        features["prompt_length"] = prompt_length
    return module(features)["sentence_embedding"].numpy()


def _masked(mask: np.ndarray, prompt_length: int) -> np.ndarray:
    """What the task hands the pooler when the prompt is excluded."""
    out = mask.copy()
    out[:, :prompt_length] = 0
    return out


@pytest.mark.parametrize("modes", [(mode,) for mode in POOLING_MODES] + [("cls", "mean", "max")])
@pytest.mark.parametrize("prompt_length", [0, 2])
def test_every_mode_equals_sentence_transformers_on_numpy_and_torch(modes: tuple[str, ...],
                                                                    prompt_length: int) -> None:
    hidden, mask = _batch()
    want = _reference(hidden, mask, modes, prompt_length)
    pooling_mask = _masked(mask, prompt_length)
    on_numpy = pool(NUMPY_OPS, hidden, pooling_mask, modes)
    ops = TorchOps(torch, torch.device("cpu"), HostStaging(torch, torch.device("cpu")))
    on_torch = ops.to_host(pool(ops, torch.from_numpy(hidden), torch.from_numpy(pooling_mask), modes))
    assert on_numpy.dtype == np.float32 and on_numpy.shape == (4, 6 * len(modes))
    np.testing.assert_allclose(on_numpy, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(on_torch, want, rtol=1e-5, atol=1e-5)
    assert np.abs(on_numpy).max() < 100  # the 1e4 padding never leaked


def test_half_precision_states_are_pooled_in_float32() -> None:
    hidden, mask = _batch()
    got = pool(NUMPY_OPS, hidden.astype(np.float16), mask, ("mean",))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, pool(NUMPY_OPS, hidden, mask, ("mean",)), atol=1e-2)


def test_a_row_with_nothing_attended_is_finite() -> None:
    hidden = np.ones((1, 3, 4), dtype=np.float32)
    mask = np.zeros((1, 3), dtype=np.int64)
    for mode in ("mean", "weighted-mean", "last-token", "mean-sqrt-len"):
        got = pool(NUMPY_OPS, hidden, mask, (mode,))
        assert np.isfinite(got).all() and not got.any(), mode


def _config(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_the_config_reader_takes_the_new_and_the_legacy_format(tmp_path: Path) -> None:
    assert read_pooling_config(_config(tmp_path, {"pooling_mode": "lasttoken", "include_prompt": False})) == \
        PoolingSpec(modes=("last-token",), include_prompt=False)
    assert read_pooling_config(_config(tmp_path, {"pooling_mode": ["cls", "weightedmean"]})).modes == \
        ("cls", "weighted-mean")
    legacy = {"word_embedding_dimension": 8, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
              "pooling_mode_max_tokens": True}
    assert read_pooling_config(_config(tmp_path, legacy)).modes == ("max", "mean")  # sentence-transformers' order
    assert read_pooling_config(_config(tmp_path, {"word_embedding_dimension": 8})).modes == ("mean",)
    with pytest.raises(EngineStartError, match="unknown pooling_mode"):
        read_pooling_config(_config(tmp_path, {"pooling_mode": "median"}))
