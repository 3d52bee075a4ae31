"""Compile the project's C kernel once per machine and load it (``ctypes``), checked at every step.

The source ships with the package (``direct_gemm.c``); it is compiled with the machine's C compiler (``$CC``, else
``cc`` / ``gcc`` / ``clang``) for the machine that runs it (``-march=native``) into a per-user cache folder
(``$HF_SPECULATIVE_CACHE/kernels/``), named by a hash of the source, the compiler, the flags and the CPU, so a new
CPU or a changed source builds anew. What is checked, and what happens when a check fails (a warning once, then
torch's kernels; never an exception inside ``generate()``):

* the folder is created ``0700``; a folder or library owned by another user, or writable by group or others, is
  refused (anyone who can write there could run code in this process);
* the build runs with a timeout (`BUILD_TIMEOUT` seconds); a failed or hung build is remembered for the process
  and not retried;
* the library's SHA-256 is recorded beside it at build time and checked before loading (a truncated, replaced or
  foreign file is not loaded), and every exported symbol and the ABI version are checked after loading.

Before a kernel computes anything the engine uses, `hf_speculative.engine.kernels.linear` also compares it with
``F.linear`` (`verify_kernel`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from transformers.utils import logging

__all__ = [
    "ABI_VERSION",
    "BUILD_TIMEOUT",
    "SOURCE",
    "source_digest",
    "build_direct_gemm",
    "built_direct_gemm",
    "kernel_library_path",
    "load_direct_gemm",
]

logger = logging.get_logger(__name__)

SOURCE = Path(__file__).with_name("direct_gemm.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
ABI_VERSION = 2
#: seconds a compile may take before it counts as failed
BUILD_TIMEOUT = 120.0
SYMBOLS = (
    "hfs_direct_f32",
    "hfs_direct_bf16",
    "hfs_direct_bf16_amx",
    "hfs_direct_amx",
    "hfs_direct_abi_version",
    "hfs_direct_vector_width",
)

_FAILED: set[str] = set()  # library paths whose build failed in this process: not tried again


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


@lru_cache(maxsize=None)
def source_digest() -> str:
    """A short hash of the kernel's source: the cached kernel tables and cost curves name it, so that what was measured
    with another version of the kernel is measured again."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def kernel_library_path(compiler: str) -> Path:
    """Where the library built from `SOURCE` with ``compiler`` for this CPU lives."""
    from ...paths import cache_root

    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), compiler.encode(), " ".join(FLAGS).encode(), _cpu_signature().encode()):
        key.update(part)
    return cache_root() / "kernels" / f"direct_gemm-{key.hexdigest()[:16]}.so"


def _private(path: Path) -> str | None:
    """Why ``path`` may not hold code this process loads (None: it may): owned by another user, or writable by
    group or others."""
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.filemode(info.st_mode)})"
    return None


def _kernel_folder(target: Path) -> bool:
    """Create the library's folder ``0700`` if missing; True when it exists and is private."""
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    problem = _private(folder)
    if problem is not None:
        logger.warning_once(f"not using the kernel cache: {problem}; torch's kernels stay in use")
        return False
    return True


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compile(compiler: str, target: Path) -> None:
    """Compile into a unique temporary file, record its SHA-256, then move both into place atomically."""
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        command = [compiler, *FLAGS, "-o", str(partial), str(SOURCE)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-2000:] or f"{compiler} exited with status {result.returncode}")
        partial.chmod(0o700)
        digest = Path(tmp) / "digest"
        digest.write_text(_digest(partial))
        os.replace(digest, target.with_suffix(".sha256"))
        os.replace(partial, target)


def build_direct_gemm() -> Path | None:
    """The compiled library (built now if missing); None when there is no compiler, the cache is unusable, or the
    build fails or hangs (each said once, and not retried in this process)."""
    compiler = _compiler()
    if compiler is None:
        logger.info("no C compiler found: the verification forward keeps torch's kernels")
        return None
    target = kernel_library_path(compiler)
    if str(target) in _FAILED:
        return None
    try:
        if not _kernel_folder(target):
            _FAILED.add(str(target))
            return None
        if not target.exists():
            _compile(compiler, target)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        _FAILED.add(str(target))
        logger.warning_once(
            f"building the engine's matrix kernel failed ({type(error).__name__}: {error}); torch's kernels stay in use"
        )
        return None
    return target


def built_direct_gemm() -> Path | None:
    """The compiled library if it was built already (`build_direct_gemm`, run by ``hfs.enable``); never builds."""
    compiler = _compiler()
    target = kernel_library_path(compiler) if compiler is not None else None
    try:
        return target if target is not None and target.exists() else None
    except OSError:
        return None


def _checked(path: Path) -> str | None:
    """Why the library at ``path`` must not be loaded (None: it may)."""
    for place in (path.parent, path):
        problem = _private(place)
        if problem is not None:
            return problem
    record = path.with_suffix(".sha256")
    if not record.exists():
        return f"{path} has no recorded SHA-256 (not built here)"
    if record.read_text().strip() != _digest(path):
        return f"{path} does not match the SHA-256 recorded when it was built"
    return None


@lru_cache(maxsize=None)
def load_direct_gemm(path: str) -> ctypes.CDLL | None:
    """The library at ``path``, checked (owner, mode, SHA-256, symbols, ABI version), with its argument types
    declared; None (and a warning once) when any check fails."""
    import torch  # noqa: F401  (torch's OpenMP runtime is loaded first, so the library shares it)

    try:
        problem = _checked(Path(path))
        if problem is None:
            lib = ctypes.CDLL(path)
            missing = [name for name in SYMBOLS if not hasattr(lib, name)]
            if missing:
                problem = f"{path} lacks {missing}"
            elif lib.hfs_direct_abi_version() != ABI_VERSION:
                problem = f"{path} has ABI version {lib.hfs_direct_abi_version()}, not {ABI_VERSION}"
    except OSError as error:
        problem = f"loading {path} failed ({error})"
    if problem is not None:
        logger.warning_once(f"not loading the engine's matrix kernel: {problem}; torch's kernels stay in use")
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for name in ("hfs_direct_f32", "hfs_direct_bf16"):
        getattr(lib, name).argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
        getattr(lib, name).restype = None
    lib.hfs_direct_bf16_amx.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.hfs_direct_bf16_amx.restype = ctypes.c_int
    lib.hfs_direct_amx.restype = ctypes.c_int
    lib.hfs_direct_abi_version.restype = ctypes.c_int
    lib.hfs_direct_vector_width.restype = ctypes.c_int
    return lib
