#!/usr/bin/env bash
# Sluice's GPU check: every GPU figure in one call of at most 8 minutes on a machine with no network.
#
# How to run it on the GPU machine (one H200; python3 with torch, triton, transformers; nothing installable):
#   1. here, once (needs the package index):   bash bench/gpu_wheels.sh
#      (fills bench/gpu_wheels/, about 3 MB, and prints its size and the size of what a call sends)
#   2. the device tool's `run`, from the repository root:
#        command:   bash bench/gpu_check.sh --out "$OUT"
#        carry:     ["bench/gpu_wheels"]
#        timeout_s: 560    (the check holds itself to 480 s; the rest is slack for python's start)
#      It writes gpu_check.json, gpu_check.md and gpu_check.log into $OUT (3 of the 8 files that come back);
#      copy the first two into bench/results/ and commit them.
#      A rerun of some steps only: add --only kernels,llm-qwen3-0.6b --budget-s 200 (names: --list).
#
# Here, on a CPU, the same script end to end (tiny shapes, TRITON_INTERPRET=1, device cpu, the same wheel
# install into a temporary target), in under 3 minutes; CI runs it (tests/bench/test_gpu_check.py):
#   bash bench/gpu_check.sh --dry-run [--out DIR]
#
# Options: --out DIR (default bench/results, dry run $TMPDIR/sluice-gpu-check-dry-run; files gpu_check.*),
#          --budget-s N (default 480; dry run 170),
#          --only STEP[,STEP], --list (the steps), --sizes (print the wheel folder's and the send size, stop).
# Environment: SLUICE_PYTHON (default python3: used as it is, never changed; torch and triton are never
#          installed), SLUICE_GPU_WHEELS (default bench/gpu_wheels).
# Exit status: 0 every row measured or given a one-line reason; 1 the check could not run or left a row
#          without either; 2 no GPU (without --dry-run).
set -uo pipefail

START_S=$SECONDS
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${SLUICE_PYTHON:-python3}"
WHEELS="${SLUICE_GPU_WHEELS:-$ROOT/bench/gpu_wheels}"
HOST_WHEELS="$ROOT/bench/.gpu_wheels_host"
PINS="$ROOT/bench/gpu_wheels.txt"
MAX_WHEELS_BYTES=$((20 * 1000 * 1000))  # the folder stays well under 20 MB
MAX_SEND_BYTES=$((64 * 1024 * 1024))    # what one device call may carry
DRY_RUN=0 OUT="" BUDGET_S="" DRIVER_ARGS=()

LOG=""  # once --out is known, everything said also goes to $OUT/gpu_check.log
say() { printf 'gpu_check: %s\n' "$*" >&2; if [ -n "$LOG" ]; then printf 'gpu_check: %s\n' "$*" >>"$LOG"; fi; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --out) OUT="$2"; shift ;;
    --budget-s) BUDGET_S="$2"; shift ;;
    --only) DRIVER_ARGS+=(--only "$2"); shift ;;
    --list) LIST=1 ;;
    --sizes) SIZES_ONLY=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown option $1 (see --help)"; exit 1 ;;
  esac
  shift
done
BUDGET_S="${BUDGET_S:-$([ "$DRY_RUN" = 1 ] && echo 170 || echo 480)}"
# A dry run's figures are the CPU's: they never land where the GPU results are committed.
OUT="${OUT:-$([ "$DRY_RUN" = 1 ] && echo "${TMPDIR:-/tmp}/sluice-gpu-check-dry-run" || echo "$ROOT/bench/results")}"
if [ "${LIST:-0}" = 1 ]; then
  if [ "$DRY_RUN" = 1 ]; then exec "$PY" bench/gpu_check.py --list --dry-run; fi
  exec "$PY" bench/gpu_check.py --list
fi

# Sizes: the wheel folder, and what a device call sends (tracked + untracked-not-ignored files, the
# folder shared/ when git ignores it, and the carried wheel folder). Over a limit: stop here.
sizes() {
  local wheels_b=0 tree_b=0 shared_b=0
  if [ -d "$WHEELS" ]; then wheels_b=$(du -sb "$WHEELS" | cut -f1); fi
  say "wheel folder ${WHEELS#"$ROOT"/}: $(mib "$wheels_b") ($(find "$WHEELS" -name '*.whl' 2>/dev/null | wc -l) wheels; limit 20 MB)"
  if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    tree_b=$(git -C "$ROOT" ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    if [ -d "$ROOT/shared" ] && git -C "$ROOT" check-ignore -q shared; then shared_b=$(du -sb "$ROOT/shared" | cut -f1); fi
    local send_b=$((tree_b + shared_b + wheels_b))
    say "sent to the GPU machine: $(mib "$send_b") (tree $(mib $((tree_b + shared_b))) + wheels $(mib "$wheels_b"); limit 64 MiB)"
    if [ "$send_b" -gt "$MAX_SEND_BYTES" ]; then say "over the 64 MiB a call carries"; return 1; fi
  else
    say "not a git checkout: the send size is not known here (the wheel folder's is above)"
  fi
  if [ "$wheels_b" -gt "$MAX_WHEELS_BYTES" ]; then say "the wheel folder is over 20 MB"; return 1; fi
}
if [ "${SIZES_ONLY:-0}" = 1 ]; then sizes; exit $?; fi
mkdir -p "$OUT" || { say "cannot create --out $OUT"; exit 1; }
LOG="$OUT/gpu_check.log"
: >"$LOG"

# 1. The machine's python3 as it is: torch and triton must be there already.
if ! VERSIONS="$("$PY" -c 'import sys, torch, triton; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}")' 2>&1)"; then
  say "$PY cannot import torch and triton (${VERSIONS##*$'\n'}); this script uses the machine's python as it is"
  exit 1
fi
say "$VERSIONS"

# 2. A GPU, unless this is the dry run: stop at once, before installing anything.
if [ "$DRY_RUN" = 0 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    say "no NVIDIA GPU on this machine (nvidia-smi is missing or lists no GPU); run this on a GPU machine, or use --dry-run"
    exit 2
  fi
  say "$(nvidia-smi -L | head -1)"
fi

sizes || exit 1

# 3. Sluice's missing pure-Python dependencies, from the wheel folder only, into a temporary target that
#    goes first on PYTHONPATH (the machine's site-packages are never touched).
if [ ! -d "$WHEELS" ]; then
  say "no wheel folder at $WHEELS: run bash bench/gpu_wheels.sh here first (on the GPU machine: carry it)"
  exit 1
fi
SITE="$(mktemp -d "${TMPDIR:-/tmp}/sluice-gpu-site.XXXXXX")"
trap 'rm -rf "$SITE"' EXIT
FIND_LINKS=(--find-links "$WHEELS")
if [ -d "$HOST_WHEELS" ]; then FIND_LINKS+=(--find-links "$HOST_WHEELS"); fi
if [ "$DRY_RUN" = 1 ]; then
  # What the GPU machine will resolve: every pin for CPython 3.12 manylinux, from the sent folder alone.
  if ! "$PY" -m pip --isolated --disable-pip-version-check download --quiet --no-index --find-links "$WHEELS" \
      --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$SITE/cp312" -r "$PINS" >/dev/null; then
    say "$WHEELS lacks a CPython 3.12 manylinux wheel of a pin in bench/gpu_wheels.txt; run bash bench/gpu_wheels.sh"
    exit 1
  fi
  rm -rf "$SITE/cp312"
fi
if ! timeout 120 "$PY" -m pip --isolated --disable-pip-version-check install --quiet --no-index --no-deps \
    --no-compile --no-cache-dir --target "$SITE" "${FIND_LINKS[@]}" -r "$PINS"; then
  say "installing bench/gpu_wheels.txt from $WHEELS failed (see above); run bash bench/gpu_wheels.sh again"
  exit 1
fi
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
say "installed $(grep -vc '^#' "$PINS") wheels into a temporary target: $("$PY" -c 'import pydantic; print("pydantic", pydantic.VERSION, "from", pydantic.__file__)')"
export PYTHONUNBUFFERED=1

# 4. The dry run: the CPU, Triton's interpreter, no GPU visible, and imports limited to what the GPU
#    machine has plus the wheels (bench/gpu_check_guard.py).
if [ "$DRY_RUN" = 1 ]; then
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES="" SLUICE_GPU_CHECK_GUARD=1
  DRIVER_ARGS+=(--dry-run)
fi

# 5. The steps, in what is left of the budget (10 s kept for the report).
LEFT_S=$(( BUDGET_S - (SECONDS - START_S) - 10 ))
if [ "$LEFT_S" -lt 30 ]; then say "only ${LEFT_S} s of the ${BUDGET_S} s budget left; nothing measured"; exit 1; fi
say "steps: ${LEFT_S} s; log in $OUT/gpu_check.log"
timeout -k 5 $(( LEFT_S + 8 )) "$PY" bench/gpu_check.py --budget-s "$LEFT_S" --out "$OUT" "${DRIVER_ARGS[@]}" 2>&1 \
  | tee -a "$LOG"
RC=${PIPESTATUS[0]}
say "done in $(( SECONDS - START_S )) s (exit $RC)"
exit "$RC"
