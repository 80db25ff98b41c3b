#!/usr/bin/env bash
# One GPU check for Sluice, bounded to 8 minutes: installs the GPU runtimes, runs the GPU-only tests and the
# GPU benchmarks (ONNX CUDA/TensorRT providers, native TensorRT, torch CUDA, Triton kernels, the LLM
# engine), prints one table and writes bench/results/gpu_check.json.  Usage: bash bench/gpu_check.sh
#
# Environment:
#   SLUICE_GPU_CHECK_BUDGET_S  whole run, default 480 (8 minutes)
#   SLUICE_VENV                the virtual environment (default .venv; ./dev setup makes it when missing)
#   SLUICE_PYTHON              use this interpreter instead (it needs the packages of sluice[all,dev])
#   SLUICE_WHEELS_DIR          install from this folder of wheels only (machines without network access)
#   SLUICE_CACHE_DIR           model and TensorRT engine cache (default: the platform's user cache dir)
set -uo pipefail

START_S=$SECONDS
BUDGET_S="${SLUICE_GPU_CHECK_BUDGET_S:-480}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'gpu_check: %s\n' "$*" >&2; }
left_s() { echo $(( BUDGET_S - (SECONDS - START_S) )); }
# A step's timeout: at most $1 seconds and never past the budget (at least 1: 'timeout 0' would mean none).
cap_s() { local left; left=$(left_s); left=$(( left < $1 ? left : $1 )); echo $(( left > 1 ? left : 1 )); }

# 1. No GPU: stop at once, before installing anything.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  say "no NVIDIA GPU on this machine (nvidia-smi is missing or lists no GPU); run this on a GPU machine"
  exit 2
fi
say "$(nvidia-smi -L | head -1)"

# 2. The project venv.
VENV="${SLUICE_VENV:-$ROOT/.venv}"
PY="${SLUICE_PYTHON:-$VENV/bin/python}"  # SLUICE_PYTHON: an interpreter that already has torch & co.
if [ ! -x "$PY" ]; then
  say "no venv at $VENV: running ./dev setup (first time: a few minutes)"
  timeout "$(cap_s 400)" ./dev setup || { say "./dev setup failed; cannot continue"; exit 1; }
fi

PIP=("$PY" -m pip install --quiet --disable-pip-version-check --progress-bar off)
if [ -n "${SLUICE_WHEELS_DIR:-}" ]; then PIP+=(--no-index --find-links "$SLUICE_WHEELS_DIR"); fi

# 3. onnxruntime-gpu replaces onnxruntime (both own the 'onnxruntime' module, so never both installed).
#    Download first, so a failed download leaves the CPU build in place.
if ! "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  say "installing onnxruntime-gpu"
  WHEELS="$(mktemp -d)"
  DOWNLOAD=("$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$WHEELS")
  if [ -n "${SLUICE_WHEELS_DIR:-}" ]; then DOWNLOAD+=(--no-index --find-links "$SLUICE_WHEELS_DIR"); fi
  if timeout "$(cap_s 150)" "${DOWNLOAD[@]}" onnxruntime-gpu; then
    "$PY" -m pip uninstall --quiet -y onnxruntime >/dev/null 2>&1
    "${PIP[@]}" --no-deps "$WHEELS"/onnxruntime_gpu-*.whl || say "onnxruntime-gpu did not install; ONNX GPU rows will say so"
  else
    say "cannot download onnxruntime-gpu (no network? set SLUICE_WHEELS_DIR); ONNX GPU rows will say so"
  fi
  rm -rf "$WHEELS"
fi

# 4. TensorRT (large wheels: bounded).
if ! "$PY" -c "import tensorrt" 2>/dev/null; then
  say "installing tensorrt"
  timeout "$(cap_s 200)" "${PIP[@]}" tensorrt || say "tensorrt did not install; TensorRT rows will say so"
fi
# The ONNX Runtime TensorRT provider loads libnvinfer by name: point the loader at the pip wheel's libraries.
TRT_LIBS="$("$PY" -c "import tensorrt_libs, os; print(os.path.dirname(tensorrt_libs.__file__))" 2>/dev/null || true)"
if [ -n "$TRT_LIBS" ]; then export LD_LIBRARY_PATH="$TRT_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi

# 5. The model (cached after the first fetch).
timeout "$(cap_s 120)" "$PY" -c "import sys; sys.path.insert(0, '.'); from sluice.models import fetch; fetch('minilm-l6')" || say "cannot fetch minilm-l6; the embedding rows will say so"

# 6. Tests and benchmarks, in what is left of the budget (15 s kept for the table).
DRIVER_S=$(( $(left_s) - 15 ))
if [ "$DRIVER_S" -lt 60 ]; then say "only ${DRIVER_S} s left after installing; nothing measured"; exit 1; fi
say "tests and benchmarks: ${DRIVER_S} s"
timeout "$(( DRIVER_S + 10 ))" "$PY" bench/gpu_check.py --budget-s "$DRIVER_S"
