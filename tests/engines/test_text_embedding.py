"""Padding, pooling, normalisation and output formats of the text-embedding task, against numpy references."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import numpy as np
import pytest

from sluice.engines.text_embedding import (
    TextEmbeddingTask,
    TokenizedText,
    check_pooling_config,
    decode_base64_vector,
    format_vectors,
    l2_normalize,
    mean_pool,
    pad_batch,
)


def _item(ids: list[int]) -> TokenizedText:
    return TokenizedText(ids=np.asarray(ids, dtype=np.int64), num_tokens=len(ids))


def test_pad_batch_pads_to_the_longest_item_on_the_right() -> None:
    batch = pad_batch([_item([101, 7, 102]), _item([101, 5, 6, 8, 102]), _item([101, 102])], pad_id=0)
    assert batch.input_ids.shape == (3, 5)
    assert batch.input_ids.tolist() == [[101, 7, 102, 0, 0], [101, 5, 6, 8, 102], [101, 102, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert not batch.token_type_ids.any()
    assert batch.input_ids.dtype == np.int64 and batch.attention_mask.dtype == np.int64


def test_pad_batch_uses_the_given_pad_id() -> None:
    batch = pad_batch([_item([1]), _item([1, 2, 3])], pad_id=9)
    assert batch.input_ids[0].tolist() == [1, 9, 9]


def test_mean_pool_matches_a_per_row_reference_and_ignores_padding() -> None:
    rng = np.random.default_rng(0)
    lengths = [3, 7, 1, 5]
    hidden = rng.normal(size=(4, 7, 16)).astype(np.float32)  # (batch, tokens, dim)
    mask = np.zeros((4, 7), dtype=np.int64)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        hidden[row, n:] = 1e6  # garbage on padding must not leak into the mean
    got = mean_pool(hidden, mask)
    expected = np.stack([hidden[row, :n].mean(axis=0) for row, n in enumerate(lengths)])
    assert got.shape == (4, 16)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_mean_pool_of_a_fully_masked_row_is_zero_not_nan() -> None:
    hidden = np.ones((1, 3, 4), dtype=np.float32)
    got = mean_pool(hidden, np.zeros((1, 3), dtype=np.int64))
    assert np.isfinite(got).all() and not got.any()


def test_l2_normalize_gives_unit_rows_in_the_same_direction() -> None:
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(5, 32)).astype(np.float32) * rng.uniform(0.01, 100, size=(5, 1))
    got = l2_normalize(vectors)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(got, vectors / np.linalg.norm(vectors, axis=1, keepdims=True), rtol=1e-5)


def test_l2_normalize_keeps_a_zero_row_zero() -> None:
    got = l2_normalize(np.zeros((2, 3), dtype=np.float32))
    assert np.isfinite(got).all() and not got.any()


def test_list_format_gives_plain_floats() -> None:
    vectors = np.array([[0.5, -1.25], [3.0, 0.0]], dtype=np.float32)
    got = format_vectors(vectors, "list")
    assert got == [[0.5, -1.25], [3.0, 0.0]]
    assert all(type(x) is float for row in got for x in row)


def test_base64_format_is_float32_little_endian() -> None:
    vectors = np.array([[0.5, -1.25, 3.0]], dtype=np.float32)
    (text,) = format_vectors(vectors, "base64")
    assert base64.b64decode(text) == struct.pack("<3f", 0.5, -1.25, 3.0)
    np.testing.assert_array_equal(decode_base64_vector(text), vectors[0])


def test_unknown_output_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="output format"):
        format_vectors(np.zeros((1, 2), dtype=np.float32), "csv")  # type: ignore[arg-type]


def test_tokenize_truncates_without_padding_and_keeps_special_tokens(minilm_dir: Path) -> None:
    task = TextEmbeddingTask(minilm_dir / "tokenizer.json", max_length=16)
    short, long = task.tokenize(["hello world", "word " * 100])
    assert short.num_tokens == len(short.ids) < 16  # no fixed padding from tokenizer.json
    assert long.num_tokens == 16
    cls_id, sep_id = short.ids[0], short.ids[-1]
    assert long.ids[0] == cls_id and long.ids[-1] == sep_id  # truncation keeps [CLS] ... [SEP]
    assert task.tokenize(["hello world"])[0].ids.tolist() == short.ids.tolist()  # single == batch path


def test_only_mean_pooling_configs_are_accepted(tmp_path: Path, minilm_dir: Path) -> None:
    check_pooling_config(minilm_dir)  # the real model: mean pooling
    check_pooling_config(tmp_path)  # no pooling metadata at all
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}')
    with pytest.raises(ValueError, match=r"pooling \['cls_token'\]"):
        check_pooling_config(tmp_path)
