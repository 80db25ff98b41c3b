"""Model identities (sluice/engines/identity.py): the header's format, names, and what each engine type says
its model is."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.engines import engine_types
from sluice.engines.engine_contract import EngineContext
from sluice.engines.identity import ModelIdentity, model_name, parse_label
from sluice.engines.model_source import identify


def test_the_label_is_name_short_digest_and_engine_and_parses_back() -> None:
    identity = ModelIdentity("minilm-l6", "1a2b3c4d5e6f" + "0" * 52, "onnx")
    assert identity.label == "minilm-l6@sha256:1a2b3c4d5e6f (onnx)"
    assert identity.header == b"minilm-l6@sha256:1a2b3c4d5e6f (onnx)"
    assert parse_label(identity.label) == ("minilm-l6", "1a2b3c4d5e6f", "onnx")
    odd = ModelIdentity("my model (v2)@prod", "f" * 64, "python")
    assert parse_label(odd.label) == ("my_model_v2_prod", "ffffffffffff", "python")
    with pytest.raises(ValueError, match="not a sluice.model header"):
        parse_label("minilm-l6 (onnx)")


@pytest.mark.parametrize(("reference", "name"), [
    ("minilm-l6", "minilm-l6"), ("models/v2/model.onnx", "v2"), ("/srv/bert-base.onnx", "bert-base"),
    ("./current", "current"), ("models/current/", "current"), ("qwen.Q4_K_M.gguf", "qwen.Q4_K_M"),
    ("bge-small-en-v1.5", "bge-small-en-v1.5")])
def test_a_name_comes_from_the_reference_the_pipeline_gives(reference: str, name: str) -> None:
    assert model_name(reference) == name


def test_each_engine_type_names_the_model_it_loads(tmp_path: Path) -> None:
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "model.onnx").write_bytes(b"not really onnx")
    context = EngineContext(max_batch_size=4, pipeline_dir=str(tmp_path))
    for engine, options in (("onnx", {"model": "v2/model.onnx"}), ("torch", {"model": "v2"}),
                            ("tensorrt", {"model": "v2"}), ("python", {"factory": "m:load", "model": "v2"})):
        kind = engine_types.lookup(engine)
        source = kind.factory(kind.options(**options), context).model_source()
        assert source.reloadable and source.path is not None and source.path.resolve().is_relative_to(tmp_path / "v2")
        assert source.name == "v2"
    kind = engine_types.lookup("python")
    source = kind.factory(kind.options(function="tests.integration.funcs:tag"), context).model_source()
    assert not source.reloadable and source.name == "tests.integration.funcs:tag"
    assert source.path is not None and source.path.name == "funcs.py"  # its code is what is hashed
    kind = engine_types.lookup("torch")
    source = kind.factory(kind.options(task="raw", factory="tests.integration.funcs:tag", inputs={"x": "x"}),
                          context).model_source()
    assert not source.reloadable and source.path is not None and source.path.name == "funcs.py"


def test_the_identity_hashes_the_content_and_a_missing_model_its_name(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "a.onnx").write_bytes(b"w")
    context = EngineContext(max_batch_size=4, pipeline_dir=str(tmp_path))
    kind = engine_types.lookup("onnx")
    one = identify(kind.factory(kind.options(model="a.onnx"), context).model_source(), "onnx")
    assert one.name == "a" and one.engine == "onnx" and len(one.digest) == 64
    (tmp_path / "b.onnx").write_bytes(b"w")
    other = identify(kind.factory(kind.options(model="b.onnx"), context).model_source(), "onnx", "renamed")
    assert other.digest == one.digest and other.label.startswith("renamed@sha256:")
    missing = identify(kind.factory(kind.options(model="gone.onnx"), context).model_source(), "onnx")
    assert missing.name == "gone" and len(missing.digest) == 64
