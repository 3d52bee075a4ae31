"""The EAGLE-3 drafter's linear layers at 1, 4 and 8 rows through each kernel: torch's ``F.linear`` in float32 and
bfloat16, the direct kernel in float32, its drafting variant (float32 products from a bfloat16 copy of the weight),
and oneDNN in bfloat16. Shapes of SmolLM2-135M's EAGLE-3 (hidden 576, q/k/v as one 576 x 960 product, MLP 1536,
a 2,048-token head, the 1,728 -> 576 feature fusion). Build the kernel first (``hf-speculative calibrate``).

    python docs/results/2026-12-01-e2e-names/linear_shapes.py
"""

from __future__ import annotations

import time

import torch

from hf_speculative.engine.kernels.linear import available_kernels, drafting_kernel

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 2048), (1728, 576)]  # (in, out)


def milliseconds(kernel, dtype: torch.dtype, rows: int, repeats: int = 500) -> float:
    """All the shapes' products once, in milliseconds (the mean over ``repeats`` runs after 50 warm-ups)."""
    weights = [(torch.randn(o, i) * 0.02).to(torch.bfloat16).to(dtype) for i, o in SHAPES]
    prepared = [kernel.prepare(w) for w in weights]
    inputs = [torch.randn(rows, i, dtype=dtype) for i, _ in SHAPES]

    def run():
        for p, x, w in zip(prepared, inputs, weights):
            kernel.product(p, x, w.shape[0], None)

    for _ in range(50):
        run()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    return 1000 * (time.perf_counter() - start) / repeats


def main() -> None:
    torch.set_num_threads(2)
    kernels = available_kernels(torch.float32)
    columns = [
        ("torch float32", kernels["torch"], torch.float32),
        ("direct float32", kernels.get("direct"), torch.float32),
        ("direct-drafting", drafting_kernel(kernels["direct"]) if "direct" in kernels else None, torch.float32),
        ("torch bfloat16", kernels["torch"], torch.bfloat16),
        ("onednn bfloat16", kernels.get("onednn"), torch.bfloat16),
    ]
    print("rows | " + " | ".join(name for name, _, _ in columns))
    for rows in (1, 4, 8):
        cells = [f"{milliseconds(k, dt, rows):.3f}" if k is not None else "-" for _, k, dt in columns]
        print(f"{rows} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
