#!/usr/bin/env bash
# Fill bench/gpu_wheels/ (git-ignored) from the package index with the wheels bench/gpu_check.sh installs on
# the GPU machine, which has no network: exactly the pins of bench/gpu_wheels.txt, built for that machine's
# python3 (CPython 3.12, manylinux x86-64). Send the folder along with the check (device tool: carry it).
#
#   bash bench/gpu_wheels.sh                   # then: bash bench/gpu_check.sh --sizes
#   bash bench/gpu_wheels.sh --provider-sizes  # also: how large the ONNX Runtime GPU / TensorRT wheels are
#
# When this interpreter is not CPython 3.12 on Linux x86-64, the same pins are also fetched for it into
# bench/.gpu_wheels_host/ (git-ignored, never sent), so the CPU dry run installs through the same path.
# A folder that already holds every pin is left as it is (no index access); pip's cache serves repeats.
# Environment: SLUICE_PYTHON (default python3) runs pip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${SLUICE_PYTHON:-python3}"
PINS="$ROOT/bench/gpu_wheels.txt"
DEST="$ROOT/bench/gpu_wheels"
HOST_DEST="$ROOT/bench/.gpu_wheels_host"
# The GPU machine's tags: manylinux2014 is glibc 2.17; 2_28 in case a later pin only ships that.
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
# --isolated: ignore pip's environment and user configuration (extra find-links, say), so a folder that
# "resolves" here resolves from its own files alone.
PIP=("$PY" -m pip --isolated --disable-pip-version-check)

say() { printf 'gpu_wheels: %s\n' "$*" >&2; }

# complete DIR [TAGS...]: every pin resolves offline from DIR alone, for those tags (default: this python)
complete() {
  local dir="$1" scratch; shift
  [ -d "$dir" ] || return 1
  scratch="$(mktemp -d)"
  "${PIP[@]}" download --quiet --no-index --find-links "$dir" --no-deps "$@" -d "$scratch" -r "$PINS" >/dev/null 2>&1
  local rc=$?
  rm -rf "$scratch"
  return $rc
}

fetch() {  # fetch DIR [TAGS...]
  local dir="$1"; shift
  if complete "$dir" "$@"; then
    say "$dir already holds every pin"
    return
  fi
  mkdir -p "$dir"
  say "downloading into $dir: $(grep -v '^#' "$PINS" | awk '{print $1}' | tr '\n' ' ')"
  "${PIP[@]}" download --quiet --no-deps "$@" -d "$dir" -r "$PINS"
  complete "$dir" "$@" || { say "$dir still misses a pin after downloading"; exit 1; }
}

# provider_size NAME: the wheel pip would fetch for the GPU machine, and its size, read off pip's
# "Downloading FILE (SIZE)" line; the download is cut short (these wheels are hundreds of MB).
provider_size() {
  local scratch line
  scratch="$(mktemp -d)"
  line="$(timeout 25 "${PIP[@]}" download --no-deps "${TARGET[@]}" --platform manylinux_2_27_x86_64 \
          -d "$scratch" "$1" 2>&1 | grep -m1 -E 'Downloading|ERROR' || true)"
  if [[ "$line" == *ERROR* ]]; then  # no wheel: is there a source stub (TensorRT's fetch from NVIDIA's index)?
    line="$(timeout 25 "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation -d "$scratch" "$1" 2>&1 \
            | grep -m1 -E 'Downloading' || true)"
    line="no wheel; only a source distribution: ${line:-none}"
  fi
  rm -rf "$scratch"
  printf '  %-24s %s\n' "$1" "${line:-no answer from the index within 25 s}"
}

fetch "$DEST" "${TARGET[@]}"
if ! "$PY" -c 'import sys, platform; sys.exit(sys.version_info[:2] != (3, 12) or platform.machine() != "x86_64" or sys.platform != "linux")'; then
  say "this python is not CPython 3.12 on Linux x86-64: the dry run's wheels go to $HOST_DEST"
  fetch "$HOST_DEST"
fi

if [ "${1:-}" = "--provider-sizes" ]; then
  say "wheels the ONNX Runtime GPU providers and native TensorRT would need (a call carries 64 MiB at most):"
  for name in onnxruntime-gpu tensorrt-cu13 tensorrt-cu13-libs tensorrt-cu13-bindings; do provider_size "$name"; done
fi
exec bash "$ROOT/bench/gpu_check.sh" --sizes
