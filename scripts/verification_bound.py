"""How cheap a 17-row verification forward can be on this CPU: the linear layers of 8 decoder layers of Qwen2.5-0.5B
and Llama-3.2-1B (random float32 weights, a fresh weight per layer so that every pass reads them from memory, as
decoding does) through the engine's direct kernel and torch's ``F.linear``, per row count, beside the CPU's float32
peak on a large square product (whose operands stay in cache). Best of 5 passes each. ``--dtype bfloat16``:
bfloat16 weights and activations, a bfloat16 model's products (AMX's tiles where the CPU has them); the floor
printed stays float32's.

The floor printed per shape: the 17-row pass at that peak, over the one-row pass as measured. A 16-node tree (17
rows) cannot cost less than that many one-token steps in its linear layers, whatever the kernel.

    python scripts/verification_bound.py --rows 1,9,13,17,33
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
import torch.nn.functional as F

from hf_speculative.engine.kernels.build import build_direct_gemm
from hf_speculative.engine.kernels.linear import available_kernels
from hf_speculative.perf_model import machine_description

SHAPES = {  # (in, out) of q+k+v, o, gate, up, down
    "qwen2.5-0.5b": [(896, 1152), (896, 896), (896, 4864), (896, 4864), (4864, 896)],
    "llama-3.2-1b": [(2048, 3072), (2048, 2048), (2048, 8192), (2048, 8192), (8192, 2048)],
}


def best_seconds(fn, calls: int = 3, rounds: int = 5) -> float:
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def one_pass(product, xs: dict, layers: list) -> None:
    """Every weight of ``layers`` against the input of its width."""
    for layer in layers:
        for w in layer:
            product(xs[w.shape[1]], w)


def square_peak() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / best_seconds(lambda: a @ b, calls=10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,17")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    rows = sorted({1, 17, *(int(r) for r in args.rows.split(","))})
    build_direct_gemm()
    direct = available_kernels(dtype).get("direct")  # built, loaded and checked against F.linear
    peak = square_peak()
    print(f"{machine_description()}; float32 peak on a 1024 x 1024 x 1024 product: {peak / 1e9:.0f} GFLOP/s")
    for name, shapes in SHAPES.items():
        layers = [[torch.randn(o, i).to(dtype) for i, o in shapes] for _ in range(args.layers)]
        params = sum(w.numel() for layer in layers for w in layer)
        width = layers[0][0].element_size()
        kernels = {"torch": lambda x, w: F.linear(x, w)}
        if direct is not None:
            kernels["direct"] = lambda x, w: direct.product(w, x, w.shape[0], None)
        one_row = {}
        for m in rows:
            xs = {i: torch.randn(m, i).to(dtype) for i, _ in shapes}
            for kernel, product in kernels.items():
                seconds = best_seconds(functools.partial(one_pass, product, xs, layers))
                one_row.setdefault(kernel, seconds)
                print(
                    f"{name} {kernel:6s} {m:3d} rows: {seconds * 1e3:7.1f} ms ({seconds / one_row[kernel]:.2f}x one row), "
                    f"{2 * m * params / seconds / 1e9:4.0f} GFLOP/s, {width * params / seconds / 1e9:5.1f} GB/s of weights"
                )
        fastest_row = min(one_row.values())
        floor = 2 * 17 * params / peak
        print(
            f"{name}: 17 rows at the peak take {floor * 1e3:.1f} ms = {floor / fastest_row:.2f}x the fastest one-row pass"
        )


if __name__ == "__main__":
    main()
