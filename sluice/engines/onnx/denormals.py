"""Denormal floats flushed to zero on the thread that runs a model on the CPU.

An attention softmax over a padded batch gives some keys probabilities below float32's smallest normal number
(~1.2e-38), and every vector instruction that reads or writes such a *denormal* takes a microcode assist
dozens of times slower than the plain instruction, in the softmax and again in the probabilities x values
matmul. A batch of texts padded to a long length (what a length-sorted window's last batch looks like) runs
markedly faster without them, in float32 and more so in int8 (``bench/denormals.py``). The error
of flushing them is below 1e-38 per value: no embedding or label changes. Only a model that takes the log of
such a value sees it: -inf where it would have got about -88 to -103 (``flush_denormals: false`` is for it).

Two parts make it hold: onnxruntime's ``session.set_denormal_as_zero`` covers the session's own worker
threads, but onnxruntime sets the calling thread's mode only for the first session of the process and on the
thread that created it, while ``run`` is called from the operator's inference thread and the calling thread
takes its share of every parallel loop (the loop waits for its slowest thread). :func:`flushing` sets the
calling thread's flush-to-zero and denormals-are-zero bits (MXCSR, Linux on x86-64, through the C library's
``fegetenv`` / ``fesetenv``) around each run and restores them after. Elsewhere it does nothing and says
so, once.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import platform
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

SESSION_CONFIG_KEY = "session.set_denormal_as_zero"  # onnxruntime: the session's worker threads
_FTZ_DAZ = 0x8040  # MXCSR bits 15 (flush to zero) and 6 (denormals are zero)
_FENV_BYTES = 32  # glibc and musl x86-64 fenv_t: the 28-byte x87 environment, then the 4-byte MXCSR
_MXCSR_AT = 28

_warned = threading.Event()


@contextlib.contextmanager
def flushing() -> Iterator[bool]:
    """Denormals flushed to zero on the calling thread inside the block, its own mode restored after (so the
    thread's other work -- decoding, encoding records -- keeps IEEE arithmetic). Yields whether the mode
    could be set. Costs a few microseconds."""
    libm, saved = _libm(), _environment()
    if libm is None or saved is None:
        _say_unsupported()
        yield False
        return
    flushed = ctypes.create_string_buffer(saved.raw, _FENV_BYTES)
    mxcsr = _mxcsr(saved) | _FTZ_DAZ
    ctypes.memmove(ctypes.addressof(flushed) + _MXCSR_AT, mxcsr.to_bytes(4, "little"), 4)
    with preserved():
        yield libm.fesetenv(flushed) == 0


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """The calling thread's floating-point mode as it was before the block, whatever the block set: for
    creating a session with :data:`SESSION_CONFIG_KEY`, which turns flushing on for good on the thread that
    creates the process's first session."""
    libm, saved = _libm(), _environment()
    try:
        yield
    finally:
        if libm is not None and saved is not None:
            libm.fesetenv(saved)


def thread_flushes() -> bool:
    """Whether the calling thread flushes denormals now (False where that cannot be read)."""
    env = _environment()
    return env is not None and _mxcsr(env) & _FTZ_DAZ == _FTZ_DAZ


def _environment() -> ctypes.Array[ctypes.c_char] | None:
    """The calling thread's floating-point environment (fenv_t bytes), or None where it cannot be read."""
    libm = _libm()
    env = ctypes.create_string_buffer(_FENV_BYTES)
    return env if libm is not None and libm.fegetenv(env) == 0 else None


def _mxcsr(env: ctypes.Array[ctypes.c_char]) -> int:
    return int.from_bytes(env.raw[_MXCSR_AT:], "little")


def _say_unsupported() -> None:
    if not _warned.is_set():
        _warned.set()
        log.info("denormal floats are not flushed on the inference thread on %s %s (Linux on x86-64 only); "
                 "padded batches may run slower", platform.system(), platform.machine())


@functools.cache
def _libm() -> ctypes.CDLL | None:
    """The C maths library where its fenv_t layout is known here (Linux on x86-64), else None."""
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        libm = ctypes.CDLL(name)
        return libm if hasattr(libm, "fegetenv") and hasattr(libm, "fesetenv") else None
    except OSError:
        return None
