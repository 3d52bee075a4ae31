"""The kernel table of the reference model: milliseconds of all its linear layers (LM head included) per row count and
kernel, in float32 and bfloat16, on this machine; the table the engine would choose from.

    python scripts/kernel_table.py --threads 2 --output docs/results/<date>-step-cost-kernels.json
"""

from __future__ import annotations

import argparse

import torch

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.engine.kernels import measure_kernel_table
from hf_speculative.perf_model import machine_description


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_reference_model()
    hfs.enable(model)
    result = {"machine": machine_description("cpu"), "torch": torch.__version__, "tables": {}}
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        table = measure_kernel_table(model, repeats=args.repeats)
        result["tables"][str(dtype).replace("torch.", "")] = table.to_dict()
        print(
            f"\n{dtype} ({table.meta['linears']} linear layers, {table.meta['weight_megabytes']} MB), ms per forward:"
        )
        rows = sorted(table.choice)
        print("| kernel | " + " | ".join(f"{r} rows" for r in rows) + " |")
        print("|---|" + "---:|" * len(rows))
        for name, ms in table.milliseconds.items():
            print(f"| {name} | " + " | ".join(f"{ms[r]:.1f}" for r in rows) + " |")
        print("| chosen | " + " | ".join(table.choice[r] for r in rows) + " |")
    from hf_speculative.bench.report import write_json

    write_json(result, args.output)


if __name__ == "__main__":
    main()
