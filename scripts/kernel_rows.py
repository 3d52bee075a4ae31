"""The direct kernel against torch's ``F.linear`` and, optionally, the packed-copy kernel the engine ran before it
(``small_gemm.c`` from the repository's history), per row count, on the linear layers of SmolLM2-135M's shape (30
layers x q, k, v, o, gate, up, down; random float32 weights, a fresh weight per layer so that every pass reads the
weights from memory as decoding does). Milliseconds per pass over all 210 layers, the best of ``--repeats``, the
kernels interleaved. ``--variant NAME=OLD=>NEW[@@OLD=>NEW...]`` adds the direct kernel's source with those text
substitutions, compiled with the engine's flags, as one more kernel.

    git show 0c82f20:hf_speculative/engine/kernels/small_gemm.c > /tmp/small_gemm.c
    python scripts/kernel_rows.py --packed-source /tmp/small_gemm.c --rows 1,4,8,12,16,20,24,32,48,64
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hf_speculative.engine.kernels.build import FLAGS, SOURCE, build_direct_gemm, load_direct_gemm
from hf_speculative.perf_model import machine_description

SHAPES = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))  # (out, in)


def packed_kernel(source: str):
    """(pack, gemm, panel width) of the packed-copy kernel compiled from ``source`` with the engine's flags."""
    lib_path = Path(tempfile.mkdtemp()) / "packed.so"
    subprocess.run(["cc", *FLAGS, "-o", str(lib_path), source], check=True)
    lib = ctypes.CDLL(str(lib_path))
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.hfs_pack.argtypes = [p, p, i, i]
    lib.hfs_gemm.argtypes = [p, i, i, p, i, p, p, ctypes.c_int]
    return lib.hfs_pack, lib.hfs_gemm, lib.hfs_panel_width()


def variant_kernel(spec: str, folder: Path):
    """``(name, hfs_direct_f32)`` of the direct kernel's source with the substitutions of ``spec``
    (``NAME=OLD=>NEW[@@OLD=>NEW...]``), compiled into ``folder``."""
    name, substitutions = spec.split("=", 1)
    text = SOURCE.read_text()
    for pair in substitutions.split("@@"):
        old, new = pair.split("=>", 1)
        if old not in text:
            raise SystemExit(f"{name}: {old!r} is not in {SOURCE.name}")
        text = text.replace(old, new)
    source, library = folder / f"{name}.c", folder / f"{name}.so"
    source.write_text(text)
    subprocess.run(["cc", *FLAGS, "-o", str(library), str(source)], check=True)
    direct = ctypes.CDLL(str(library)).hfs_direct_f32
    p, i = ctypes.c_void_p, ctypes.c_int64
    direct.argtypes = [p, i, i, p, i, p, p, ctypes.c_int]
    return name, direct


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,12,13,16,17,20,24,28,32,40,48,64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--packed-source", default=None, help="small_gemm.c of the packed-copy kernel (history)")
    parser.add_argument("--variant", action="append", default=[], help="NAME=OLD=>NEW[@@OLD=>NEW...]: see above")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    direct = load_direct_gemm(str(build_direct_gemm())).hfs_direct_f32
    weights = [[torch.randn(n, k) * 0.02 for n, k in SHAPES] for _ in range(args.layers)]
    kernels = {"torch": None, "direct": None}
    if args.packed_source:
        pack, gemm, width = packed_kernel(args.packed_source)
        panels = []
        for w in (w for layer in weights for w in layer):
            n, k = w.shape
            panels.append(torch.empty(-(-n // width) * k * width))
            pack(w.data_ptr(), panels[-1].data_ptr(), n, k)
        kernels["packed copy"] = None
    variants = dict(variant_kernel(spec, Path(tempfile.mkdtemp())) for spec in args.variant)
    kernels.update(dict.fromkeys(variants))

    def one_pass(name: str, rows: int) -> float:
        xs = {k: torch.randn(rows, k) for k in (576, 1536)}
        ys = {n: torch.empty(rows, n) for n in (192, 576, 1536)}
        t = time.perf_counter()
        for i, w in enumerate(w for layer in weights for w in layer):
            (n, k), x, y = w.shape, xs[w.shape[1]], ys[w.shape[0]]
            if name == "torch":
                F.linear(x, w)
            elif name == "direct" or name in variants:
                kernel = variants.get(name, direct)
                kernel(x.data_ptr(), rows, k, w.data_ptr(), n, None, y.data_ptr(), args.threads)
            else:
                gemm(x.data_ptr(), rows, k, panels[i].data_ptr(), n, None, y.data_ptr(), args.threads)
        return time.perf_counter() - t

    print(f"{machine_description('cpu')}, {args.threads} threads, ms per pass over {len(SHAPES) * args.layers} layers")
    print("| rows | " + " | ".join(kernels) + " |")
    print("|---:|" + "---:|" * len(kernels))
    for rows in (int(r) for r in args.rows.split(",")):
        best = {name: one_pass(name, rows) for name in kernels}
        for _ in range(args.repeats - 1):
            for name in kernels:
                best[name] = min(best[name], one_pass(name, rows))
        print(f"| {rows} | " + " | ".join(f"{best[name] * 1e3:.1f}" for name in kernels) + " |")


if __name__ == "__main__":
    main()
