"""The direct kernel's variants side by side: each ``NAME=OLD=>NEW[@@OLD=>NEW...]`` argument compiles a copy of
``hf_speculative/engine/kernels/direct_gemm.c`` with those text substitutions (the engine's flags), beside the kernel
as it is ("base"). Every variant runs every linear layer of SmolLM2-135M's shape (30 layers x q, k, v, o, gate, up,
down, and the 49,152-row LM head; random float32 weights, a fresh one per layer) at each row count, the variants
alternated within each repeat; milliseconds per pass, the median of ``--repeats``.

    python docs/results/2026-12-01-kernel-small-rows/variants.py --rows 1,2,3,4 \
        "u2=DEFINE_STREAM(NAME, WT, 2, 4) DEFINE_STREAM(NAME, WT, 3, 4)=>DEFINE_STREAM(NAME, WT, 2, 2) DEFINE_STREAM(NAME, WT, 3, 2)"
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from hf_speculative.engine.kernels.build import FLAGS, SOURCE
from hf_speculative.perf_model import machine_description

H, I, V = 576, 1536, 49152
SHAPES = ((H, H), (192, H), (192, H), (H, H), (I, H), (I, H), (H, I))  # (out, in)
P = ctypes.c_void_p


def build(name: str, substitutions: list[tuple[str, str]], folder: Path):
    """The kernel's source with ``substitutions`` applied, compiled and loaded."""
    text = SOURCE.read_text()
    for old, new in substitutions:
        if old not in text:
            raise SystemExit(f"{name}: {old!r} is not in {SOURCE.name}")
        text = text.replace(old, new)
    source, library = folder / f"{name}.c", folder / f"{name}.so"
    source.write_text(text)
    subprocess.run(["gcc", *FLAGS, "-o", str(library), str(source)], check=True)
    lib = ctypes.CDLL(str(library))
    lib.hfs_direct_f32.argtypes = [P, ctypes.c_int64, ctypes.c_int64, P, ctypes.c_int64, P, P, ctypes.c_int]
    return lib


def one_pass(lib, rows: int, weights, head, threads: int):
    """A callable running every layer's product on ``rows`` rows through ``lib``."""
    xs = {k: torch.randn(rows, k) for k in (H, I)}
    ys = {n: torch.empty(rows, n) for n in (H, 192, I, V)}

    def run():
        for w in [*weights, head]:
            n, k = w.shape
            lib.hfs_direct_f32(xs[k].data_ptr(), rows, k, w.data_ptr(), n, None, ys[n].data_ptr(), threads)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*", help="NAME=OLD=>NEW[@@OLD=>NEW...]")
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,12,16")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.02 for _ in range(30) for n, k in SHAPES]
    head = torch.randn(V, H) * 0.02
    with tempfile.TemporaryDirectory() as tmp:
        specs = {"base": []}
        for arg in args.variants:
            name, subs = arg.split("=", 1)
            specs[name] = [tuple(p.split("=>", 1)) for p in subs.split("@@")]
        libs = {name: build(name, subs, Path(tmp)) for name, subs in specs.items()}
        print(f"{machine_description(torch.device('cpu'))}, {args.threads} threads; ms per pass over 211 layers")
        print("rows " + " ".join(f"{name:>9}" for name in libs))
        for rows in [int(r) for r in args.rows.split(",")]:
            runs = [one_pass(lib, rows, weights, head, args.threads) for lib in libs.values()]
            times = [[] for _ in runs]
            for run in runs:
                run()  # warm-up
            for _ in range(args.repeats):
                for run, t in zip(runs, times):
                    start = time.perf_counter()
                    run()
                    t.append(time.perf_counter() - start)
            print(f"{rows:4d} " + " ".join(f"{statistics.median(t) * 1e3:9.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
