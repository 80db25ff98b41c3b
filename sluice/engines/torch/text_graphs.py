"""Where the ``torch`` engine's module comes from: an HF model dir, a factory, TorchScript, or ``torch.export``.

Every loader returns a callable module in eval mode on the CPU (the engine moves it), or raises
:class:`EngineStartError` with one line. torch and transformers are imported inside the loaders.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

from sluice.engines.backends.backend_contract import ModelClass
from sluice.engines.engine_contract import EngineStartError, first_line

_ENGINE = "engine torch"


def load_hf_model(model_dir: Path, model_class: ModelClass, attn_implementation: str | None = None,
                  trust_remote_code: bool = False) -> Any:
    """The Hugging Face model in ``model_dir`` (``config.json`` + safetensors) with ``model_class``'s head.

    Offline only. A checkpoint that lacks weights of that head (an encoder loaded as a classifier, whose
    head transformers would fill with random numbers) is a start-up error, not a silently wrong model.

    The directory's own Python files (``auto_map`` in config.json) run only with ``trust_remote_code``; without
    it a model whose type transformers has built in loads with that class, and any other is refused in one
    line naming the option. transformers is never left to ask on a terminal.
    """
    if not (model_dir / "config.json").is_file():
        raise EngineStartError(f"{_ENGINE}: no config.json in {model_dir}; 'model' must be a known model name "
                               "or a Hugging Face model directory (config.json + model.safetensors)")
    try:
        import transformers
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise EngineStartError(f"{_ENGINE}: Hugging Face models need transformers (pip install 'sluice[torch]')") from None
    if not trust_remote_code:
        refusal = custom_code_refusal(model_dir)
        if refusal is not None:
            raise EngineStartError(refusal)
    auto_class = getattr(transformers, model_class.auto_class)
    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists keys this head ignores; we check what matters
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
            model, info = auto_class.from_pretrained(str(model_dir), local_files_only=True, output_loading_info=True,
                                                     trust_remote_code=trust_remote_code, **extra)
    except Exception as err:  # transformers raises OSError/ValueError/... with long messages
        raise EngineStartError(f"{_ENGINE}: cannot load the model in {model_dir}: {first_line(err)}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(set(info.get("missing_keys") or ()) | {str(k) for k in info.get("mismatched_keys") or ()})
    if missing:
        raise EngineStartError(f"{_ENGINE}: {model_dir} has no weights for {', '.join(missing[:3])}"
                               f"{' ...' if len(missing) > 3 else ''}: it is not a {model_class.value} model "
                               f"({model_class.auto_class} would fill them with random values)")
    if model_class is ModelClass.SEQUENCE_CLASSIFICATION and getattr(model.config, "pad_token_id", None) is None \
            and _finds_last_token_by_padding(model):
        raise EngineStartError(f"{_ENGINE}: {model_dir / 'config.json'} has no pad_token_id, by which a "
                               f"{type(model).__name__} finds each text's last token: it cannot classify a batch "
                               "of texts of different lengths; set pad_token_id there (the tokenizer's pad token id)")
    return model.eval()


def _finds_last_token_by_padding(model: Any) -> bool:
    """Whether the model's head reads the text's last token where ``input_ids`` stops being padding (decoder
    classifiers: Llama, Qwen, Mistral...), which transformers cannot do for a batch without ``pad_token_id``;
    encoder classifiers read a first token and never look at padding ids."""
    import inspect

    try:
        return "pad_token_id" in inspect.getsource(type(model).forward)
    except (OSError, TypeError):  # no source (a compiled or frozen class): assume it does not
        return False


def custom_code_refusal(model_dir: Path) -> str | None:
    """One line refusing ``model_dir`` when loading it would need its own Python files (config.json names them
    in ``auto_map``, and transformers has no built-in class for its ``model_type``); None otherwise."""
    from sluice.engines.tasks.model_config import read_json

    config = read_json(model_dir / "config.json")
    auto_map = config.get("auto_map")
    model_type = config.get("model_type")
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        built_in = isinstance(model_type, str) and model_type in CONFIG_MAPPING
    except ImportError:  # no transformers (an onnx-only install): only the directory's code could load it
        built_in = False
    if built_in:
        return None  # transformers' own class loads it; the directory's code is not run
    if not auto_map:
        return None  # transformers names the unknown model type itself
    files = sorted({str(ref).split("--")[-1].split(".")[0] + ".py"
                    for ref in (auto_map.values() if isinstance(auto_map, dict) else [])
                    if isinstance(ref, str)})  # fmt: skip
    return (f"{model_dir} is a model with its own code ({', '.join(files) or 'auto_map in config.json'}, model "
            f"type {model_type!r}), which Sluice does not run unless the pipeline says so: review that code, then "
            "set engine.trust_remote_code: true (sluice models export: --trust-remote-code)")


def load_factory(spec: str, kwargs: dict[str, Any]) -> Any:
    """Call ``package.module:function(**kwargs)``; it must return a ``torch.nn.Module``."""
    import torch

    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EngineStartError(f"{_ENGINE}: cannot import factory module {module_name!r}: "
                               f"{first_line(err)}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise EngineStartError(f"{_ENGINE}: module {module_name!r} has no callable {function_name!r}")
    try:
        built = function(**kwargs)
    except Exception as err:  # the user's code: any exception
        raise EngineStartError(f"{_ENGINE}: factory {spec} failed: {first_line(err)}") from None
    if not isinstance(built, torch.nn.Module):
        raise EngineStartError(f"{_ENGINE}: factory {spec} returned {type(built).__name__}, "
                               "not a torch.nn.Module")
    return built.eval()


def load_torchscript(path: Path) -> Any:
    """A TorchScript archive (``torch.jit.save``), loaded onto the CPU."""
    import torch

    _must_exist(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript is deprecated upstream; still loads fine
            module = torch.jit.load(str(path), map_location="cpu")
    except Exception as err:
        raise EngineStartError(f"{_ENGINE}: cannot load TorchScript file {path}: {first_line(err)}") from None
    return module.eval()


def load_exported(path: Path, device: Any) -> Any:
    """A ``torch.export`` program (``torch.export.save``, ``.pt2``) as a callable module on ``device``."""
    import torch

    _must_exist(path)
    try:
        program = torch.export.load(str(path))
        if device.type != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        return program.module()
    except Exception as err:
        raise EngineStartError(f"{_ENGINE}: cannot load exported program {path}: {first_line(err)}") from None


def _must_exist(path: Path) -> None:
    if not path.is_file():
        raise EngineStartError(f"{_ENGINE}: model file {path} does not exist")
