"""The LLM engine's core (requests, scheduler, KV-cache bookkeeping, speculation, outputs) and what
``sluice validate`` reads of the llm engine import without torch: each is imported in a fresh interpreter,
which fails when torch (or anything else heavy) came with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import sluice.engines.llm.core as core

CORE = sorted(f"sluice.engines.llm.core.{p.stem}" for p in Path(core.__file__).parent.glob("*.py")
              if p.name != "__init__.py")
LIGHT = ["sluice.engines.llm", "sluice.engines.llm.config", "sluice.engines.llm.operator_engine",
         "sluice.engines.llm.loading.checkpoint", "sluice.engines.llm.model.families.family_registry"]
HEAVY = ("torch", "triton", "transformers")


def loaded_heavy(module: str) -> list[str]:
    """The heavy packages importing ``module`` loads, in a fresh interpreter."""
    code = (f"import sys, {module}\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [m for m in done.stdout.strip().split(",") if m]


def test_the_core_is_the_whole_bookkeeping() -> None:
    names = {m.rsplit(".", 1)[1] for m in CORE}
    assert {"request", "scheduler", "kv_cache", "speculation", "output", "output_processor"} <= names


@pytest.mark.parametrize("module", CORE + LIGHT)
def test_imports_without_torch(module: str) -> None:
    assert loaded_heavy(module) == []


def test_the_check_sees_torch() -> None:
    assert "torch" in loaded_heavy("sluice.engines.llm.model.sampling")
