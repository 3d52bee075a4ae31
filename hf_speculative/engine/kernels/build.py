"""Compile the project's C kernels once per machine and load them (``ctypes``).

The source ships with the package (``small_gemm.c``); it is compiled with the machine's C compiler
(``$CC``, else ``cc`` / ``gcc`` / ``clang``) for the machine that runs it (``-march=native``) into the cache folder
(``$HF_SPECULATIVE_CACHE/kernels/``), named by a hash of the source, the compiler, the flags and the CPU, so a new
CPU or a changed source builds anew. Without a compiler, or when the build fails, `load_small_gemm` returns None and
the engine keeps torch's kernels. The library is linked against OpenMP and shares the runtime torch has loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from transformers.utils import logging

__all__ = ["SOURCE", "build_small_gemm", "built_small_gemm", "load_small_gemm", "kernel_library_path"]

logger = logging.get_logger(__name__)

SOURCE = Path(__file__).with_name("small_gemm.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@lru_cache(maxsize=None)
def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def kernel_library_path(compiler: str) -> Path:
    """Where the library built from `SOURCE` with ``compiler`` for this CPU lives."""
    from ...paths import cache_root

    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), compiler.encode(), " ".join(FLAGS).encode(), _cpu_signature().encode()):
        key.update(part)
    return cache_root() / "kernels" / f"small_gemm-{key.hexdigest()[:16]}.so"


def build_small_gemm() -> Path | None:
    """The compiled library (built now if missing); None when no compiler is found or the build fails."""
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found: the verification forward keeps torch's kernels")
        return None
    target = kernel_library_path(compiler)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
        if result.returncode != 0:
            logger.warning_once(f"building the small-row matrix kernel failed; torch's kernels stay in use:\n{result.stderr[-2000:]}")
            return None
        os.replace(partial, target)  # atomic: a concurrent build of the same file is harmless
    return target


def built_small_gemm() -> Path | None:
    """The compiled library if it was built already (`build_small_gemm`, run by ``hfs.enable``); never builds."""
    compiler = _compiler()
    target = kernel_library_path(compiler) if compiler is not None else None
    return target if target is not None and target.exists() else None


@lru_cache(maxsize=None)
def load_small_gemm(path: str) -> ctypes.CDLL | None:
    """The library at ``path`` with its argument types declared; None when it cannot be loaded."""
    import torch  # noqa: F401  (torch's OpenMP runtime is loaded first, so the library shares it)

    try:
        lib = ctypes.CDLL(path)
    except OSError as error:
        logger.warning_once(f"loading {path} failed ({error}); torch's kernels stay in use")
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.hfs_pack.argtypes = [ptr, ptr, i64, i64]
    lib.hfs_pack.restype = None
    lib.hfs_gemm.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.hfs_gemm.restype = None
    lib.hfs_panel_width.restype = ctypes.c_int
    return lib
