"""The products of one EAGLE-3 drafting forward (SmolLM2-135M shapes: fc, q/k/v/o, the MLP, a 2,048-row head) at 1-16
rows, the caches flushed before each pass as the target's forward flushes them between drafting steps: torch's
``F.linear`` on the float32 weights, the direct kernel on them in place, and its drafting variant on bfloat16 copies.

    python docs/results/2026-11-30-drafting-table/drafting_products.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from hf_speculative.engine.kernels.build import build_direct_gemm
from hf_speculative.engine.kernels.linear import available_kernels, drafting_kernel

SHAPES = [(576, 1728), (576, 1152), (192, 1152), (192, 1152), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
SHAPES.append((2048, 576))  # the head over the draft vocabulary


def main() -> None:
    torch.set_num_threads(2)
    build_direct_gemm()
    direct = available_kernels(torch.float32)["direct"]
    kernels = {"torch": None, "direct": direct, "direct-drafting": drafting_kernel(direct)}
    weights = [torch.randn(o, i).to(torch.bfloat16).float() for o, i in SHAPES]  # saved in bfloat16, run in float32
    prepared = {n: [k.prepare(w) if k else w for w in weights] for n, k in kernels.items()}
    flush = torch.randn(64 * 2**20 // 4)
    print("| rows | " + " | ".join(kernels) + " |")
    print("|---:|" + "---:|" * len(kernels))
    for rows in (1, 2, 4, 8, 16):
        xs = [torch.randn(rows, i) for _, i in SHAPES]
        times = {n: [] for n in kernels}
        for _ in range(30):
            for name, kernel in kernels.items():
                flush.add_(1.0)
                start = time.perf_counter()
                for (out, _), w, x in zip(SHAPES, prepared[name], xs):
                    F.linear(x, w) if kernel is None else kernel.product(w, x, out, None)
                times[name].append(time.perf_counter() - start)
        print(f"| {rows} | " + " | ".join(f"{1000 * statistics.median(t):.3f} ms" for t in times.values()) + " |")


if __name__ == "__main__":
    main()
