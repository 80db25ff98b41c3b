#!/usr/bin/env bash
# Install Sluice into a virtual environment the way the images do: the pinned versions of its dependencies
# (constraints/main.txt), then Sluice itself from a built wheel (never the source tree, whose editable install
# hides files a wheel would leave out). One path for people, CI and both Dockerfiles.
#
#   deploy/install.sh --venv ~/.local/sluice                   # build the wheel from this checkout, install all
#   deploy/install.sh --venv /opt/sluice --deps-only            # image layer 1: dependencies (rarely changes)
#   deploy/install.sh --venv /opt/sluice --wheel dist/sluice-0.1.0-py3-none-any.whl --sluice-only   # layer 2
#
# deploy/install.sh --help lists the options.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
VENV="${SLUICE_VENV:-/opt/sluice}"
EXTRAS="onnx,torch,llm,export,telemetry,schema-registry,files,images"
CONSTRAINTS="$ROOT/constraints/main.txt"
PYTHON="${PYTHON:-python3}"
TORCH_INDEX=""
WHEEL=""
STEPS="deps sluice"

usage() {
  cat <<'EOF'
usage: deploy/install.sh [--venv DIR] [--extras LIST] [--wheel FILE] [--torch-index URL]
                         [--constraints FILE] [--python PY] [--deps-only | --sluice-only]

Installs Sluice into the virtual environment DIR (created when missing): first its dependencies at the versions
in the constraints file, then Sluice from a wheel. Without --wheel, the wheel is built from this checkout.

  --venv DIR          the environment (default: $SLUICE_VENV, else /opt/sluice)
  --extras LIST       Sluice's extras, comma-separated (default: onnx,torch,llm,export,telemetry,schema-registry,files,images)
  --wheel FILE        the Sluice wheel to install (pip wheel --no-deps -w dist .)
  --torch-index URL   take torch from this package index first, e.g. https://download.pytorch.org/whl/cpu for
                      the CPU-only build (a fraction of the default CUDA one); the pinned version still holds
  --constraints FILE  the pins (default: constraints/main.txt; they hold on the Python they were frozen with)
  --python PY         the Python that creates the environment (default: $PYTHON, else python3)
  --deps-only         install the dependencies only (an image's first layer: it changes when they change)
  --sluice-only       install Sluice only, over dependencies installed before (the image's second layer)
EOF
}

die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --venv) VENV="${2:?--venv needs a directory}"; shift 2 ;;
    --extras) EXTRAS="${2?--extras needs a list}"; shift 2 ;;
    --wheel) WHEEL="${2:?--wheel needs a file}"; shift 2 ;;
    --torch-index) TORCH_INDEX="${2:?--torch-index needs a URL}"; shift 2 ;;
    --constraints) CONSTRAINTS="${2:?--constraints needs a file}"; shift 2 ;;
    --python) PYTHON="${2:?--python needs an interpreter}"; shift 2 ;;
    --deps-only) STEPS="deps"; shift ;;
    --sluice-only) STEPS="sluice"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

[ -f "$CONSTRAINTS" ] || die "no constraints file at $CONSTRAINTS (--constraints FILE)"
[ -z "$WHEEL" ] || [ -f "$WHEEL" ] || die "no wheel at $WHEEL"
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null || die "$PYTHON is not installed (Sluice needs Python >= 3.10; --python PY)"
  say "creating the virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input)

# requirements NAMES: Sluice's dependencies and those of the extras NAMES, read from pyproject.toml (extras
# that name other extras, like all, are followed), one per line.
requirements() {
  "$VENV/bin/python" - "$ROOT/pyproject.toml" "$1" <<'PYEOF'
import re, sys
try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip carries
    from pip._vendor import tomli as tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = project.get("optional-dependencies", {})
wanted, seen, out = [e for e in sys.argv[2].split(",") if e], set(), list(project["dependencies"])
while wanted:
    extra = wanted.pop()
    if extra in seen:
        continue
    if extra not in extras:
        sys.exit(f"install.sh: unknown extra {extra!r}; pyproject.toml has {', '.join(sorted(extras))}")
    seen.add(extra)
    for req in extras[extra]:
        own = re.match(r"^\s*" + re.escape(project["name"]) + r"\[([^\]]+)\]", req)
        if own:
            wanted.extend(own.group(1).split(","))
        else:
            out.append(req)
print("\n".join(dict.fromkeys(out)))
PYEOF
}

install_deps() {
  say "installing pip, then Sluice's dependencies (extras: ${EXTRAS:-none}) at the versions in $CONSTRAINTS"
  "${PIP[@]}" install --quiet --upgrade pip
  if [ -n "$TORCH_INDEX" ] && grep -q '^torch\b' <(requirements "$EXTRAS"); then
    say "installing torch from $TORCH_INDEX"
    "${PIP[@]}" install --quiet --index-url "$TORCH_INDEX" -c "$CONSTRAINTS" torch
  fi
  local reqs
  mapfile -t reqs < <(requirements "$EXTRAS")
  "${PIP[@]}" install --quiet -c "$CONSTRAINTS" "${reqs[@]}"
}

install_sluice() {
  local wheel="$WHEEL"
  if [ -z "$wheel" ]; then
    # built from a copy of what the images copy (pyproject.toml, README.md, sluice/): a build/ folder left in
    # the checkout by an earlier build could otherwise put files that no longer exist into the wheel
    local work; work="$(mktemp -d)"
    trap 'rm -rf "'"$work"'"' EXIT
    say "building the Sluice wheel from $ROOT"
    mkdir "$work/src"
    cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$work/src/"
    cp -r "$ROOT/sluice" "$work/src/sluice"
    find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
    "${PIP[@]}" wheel --quiet --no-deps -w "$work/dist" "$work/src"
    wheel="$(ls "$work"/dist/sluice-*.whl)"
  fi
  say "installing $(basename "$wheel")"
  local target="$wheel"
  [ -z "$EXTRAS" ] || target="$wheel[$EXTRAS]"
  # --force-reinstall --no-deps first: a rebuilt wheel of the same version replaces the one installed
  "${PIP[@]}" install --quiet --force-reinstall --no-deps "$wheel"
  "${PIP[@]}" install --quiet -c "$CONSTRAINTS" "$target"
  "${PIP[@]}" check >&2 || die "the environment's dependencies do not fit together (pip check above)"
  say "installed: $("$VENV/bin/sluice" --version) in $VENV"
}

for step in $STEPS; do
  case "$step" in
    deps) install_deps ;;
    sluice) install_sluice ;;
  esac
done
