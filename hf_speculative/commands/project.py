"""``hf-speculative project``: projected GPU speedup, a measured tau over the step overhead measured at real
shapes on CUDA (`hf_speculative.bench.projection`)."""

from __future__ import annotations

import json

SHAPE_NAMES = (
    "llama-2-7b, vicuna-7b, llama-2-13b, llama-3-8b, llama-3.1-8b, llama-3.2-1b, llama-3.2-3b, qwen2.5-0.5b, "
    "mistral-7b, smollm2-135m, tiny"
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "project", help="projected GPU speedup: measured tau / step overhead at real shapes (CUDA)"
    )
    p.add_argument("--shape", default="llama-2-7b", help=f"target shape: {SHAPE_NAMES} (default llama-2-7b)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tau", type=float, help="measured tau (tokens per target forward)")
    g.add_argument("--bench-json", help="take tau from an hf-speculative bench JSON (with --method)")
    p.add_argument("--method", default="tree-layercut", help="method of --bench-json")
    p.add_argument("--tree", default="cartesian:4,2,2,1", help="tree of the verification forward (as for bench --tree)")
    p.add_argument("--nodes", type=int, default=None, help="tokens in the verification forward (instead of --tree)")
    p.add_argument("--prefix-len", type=int, default=512, help="KV cache length before the step")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU runs)")
    p.add_argument("--draft-ms", type=float, default=0.0, help="drafter time per step to include (ms)")
    p.add_argument("--output", default=None, help="JSON record")
    p.set_defaults(func=run)


def _tau_from_bench(path: str, method: str) -> float:
    from ..bench.report import read_json

    data = read_json(path)
    tau = data["methods"][method]["tau"]
    if tau is None:
        raise ValueError(f"{path}: method {method!r} has no tau")
    return float(tau)


def run(args) -> int:
    import torch

    from ..bench.harness import parse_tree
    from ..bench.projection import SHAPES, measure_step_latency, project

    if args.shape not in SHAPES:
        raise ValueError(f"unknown shape {args.shape!r}; known: {sorted(SHAPES)}")
    if args.nodes is not None:
        args.tree = None
    tau = args.tau if args.tau is not None else _tau_from_bench(args.bench_json, args.method)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "hf-speculative project needs a CUDA GPU: it times a forward of a "
            f"{args.shape}-shaped model in {args.dtype}. No CUDA device is available here, so nothing was "
            "projected. (The arithmetic is hf_speculative.bench.projection.projected_speedup; "
            "'--device cpu --shape tiny' runs the code path on CPU for testing only.)"
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    tree = parse_tree(args.tree) if args.tree else None
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    timing = measure_step_latency(
        args.shape,
        tree=tree,
        n_tokens=args.nodes,
        prefix_len=args.prefix_len,
        dtype=dtype,
        device=args.device,
        iters=args.iters,
    )
    rec = project(tau, timing, draft_time=args.draft_ms / 1000)
    rec["tree"] = args.tree
    print(
        f"{args.shape} {rec['dtype']} on {torch.cuda.get_device_name() if args.device == 'cuda' else args.device}: "
        f"t_1 = {1000 * timing.t_one:.2f} ms, t_{timing.n_tokens} = {1000 * timing.t_tree:.2f} ms "
        f"(step overhead {timing.step_overhead:.2f}x, prefix {timing.prefix_len}); tau {tau:.2f} -> "
        f"projected speedup {rec['projected_speedup']:.2f}x (projected)"
    )
    if args.output:
        from ..paths import write_atomically

        write_atomically(args.output, json.dumps(rec, indent=2) + "\n")
    return 0
