"""``hf-speculative bench --shapes``: the cost side of speculative decoding at published shapes, on random weights.

Per shape and dtype (`measure_shape`; the models are built by `hf_speculative.bench.shapes`, one at a time):

* **plain**: tokens/s of plain greedy ``generate()`` over a fixed prompt of random ids;
* **one-token step**, timed directly (`measure_one_token_step`): one decoding forward after the prompt's cache, with
  torch's kernels (what plain ``generate()`` runs) and with the engine's, alternated, best of ``repeats``; the engine's
  step in ms and as x of plain's. The whole calls are timed too (plain, and the engine with nothing drafted,
  `hf_speculative.bench.root_only`, whose tokens must equal plain's in float32) and their step split out (a
  ``tokens``-token call less a one-token call, per further token) is kept in the JSON as ``call_split_step_ms``; at a
  few tokens of a large model the prefill's noise swamps that split, which is why the table shows the direct step;
* **tree cost** c(N + 1): a verification forward over an N-node tree (root + N tokens) in one-token engine forwards,
  for N = 4, 8, 16, 32, 64 (`hf_speculative.perf_model.measure_cost_curve`, the engine's own cost curve);
* **memory**: peak resident memory (``VmHWM``) of plain decoding and of speculative decoding (``hfs.enable`` and
  `PromptLookupDrafter`), each in its own fresh process, and the first speculative call's overhead there;
* **projected speedup** for tau = 1.5, 2, 3, 4 with 8-, 16- and 32-node trees: tau x plain step / tree step (the
  direct steps), the tree step being the engine's one-token step plus the tree's extra forward cost, (c(N + 1) - 1) one-token forwards. It
  leaves out the drafter's own time: an upper bound, labelled projected.

The machine's CPU and its flags (avx2, avx512f, avx512_bf16, amx_bf16) are named with every result: they decide what a
tree costs. `write_shape_outputs` writes the JSON, a markdown table and a PNG next to each other.
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import time
from pathlib import Path

import torch

from ..paths import write_atomically
from ..plotting import save_figure
from .root_only import ENGINE_CALL, RootOnlyDrafter
from .shapes import build_shape_model, check_shape, measure_memory, random_prompt

__all__ = [
    "TREE_NODES",
    "PROJECTED_TAUS",
    "PROJECTED_TREES",
    "CPU_FLAGS",
    "cpu_info",
    "measure_one_token_step",
    "measure_shape",
    "run_shape_bench",
    "shapes_markdown",
    "plot_shapes",
    "write_shape_outputs",
]

#: tree sizes (nodes besides the root) whose verification forward is priced
TREE_NODES = (4, 8, 16, 32, 64)
#: the projection's acceptance lengths and tree sizes
PROJECTED_TAUS = (1.5, 2.0, 3.0, 4.0)
PROJECTED_TREES = (8, 16, 32)
#: the CPU flags that decide a tree forward's cost
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
GiB = float(1 << 30)


def cpu_info() -> dict:
    """The CPU model, which of `CPU_FLAGS` it has, threads and library versions."""
    import transformers

    found = {}  # the first processor's "model name" and "flags"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            found.setdefault(key.strip(), value.strip())
    except OSError:  # no /proc/cpuinfo (not Linux): the platform module's processor name stands in, no flags
        pass
    flags = set(found.get("flags", "").split())
    return {
        "cpu": found.get("model name") or platform.processor() or platform.machine(),
        "flags": {f: f in flags for f in CPU_FLAGS},
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
    }


def _flags_text(machine: dict) -> str:
    return ", ".join(f"{flag} {'yes' if have else 'no'}" for flag, have in machine["flags"].items())


def _seconds(call, repeats: int):
    """Best of ``repeats`` timed calls, and the last call's result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = call()
        best = min(best, time.perf_counter() - start)
    return best, out


def _decode_timing(generate, tokens: int, repeats: int) -> tuple[dict, torch.Tensor]:
    """tokens/s of a ``tokens``-token call and the step split out of whole calls (its time less a one-token call's, per
    further token); and the call's output."""
    generate(2)  # warm-up
    (full, out), (one, _) = _seconds(lambda: generate(tokens), repeats), _seconds(lambda: generate(1), repeats)
    split = 1000 * max(full - one, 1e-9) / (tokens - 1)
    return {"tokens_per_s": tokens / full, "call_split_step_ms": split, "call_s": full}, out


@torch.inference_mode()
def measure_one_token_step(model, ids: torch.Tensor, repeats: int = 5) -> dict:
    """The one-token decoding step of an enabled ``model``, timed directly: after a cache of ``ids[:, :-1]``, one
    forward of the last token (``logits_to_keep=1``, as ``generate()`` runs it) with torch's kernels and with the
    engine's one-row kernel (`SpeedPolicy.engine_kernels`), alternated (each first in every other round), best of
    ``repeats`` each after a warm-up round;
    the new cache column is cropped after every forward."""
    from transformers import DynamicCache

    from .._compat import cache_arg
    from ..engine.policy import speed_policy

    policy = speed_policy(model)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :-1], **cache_arg(cache), use_cache=True)
    best = {"torch": float("inf"), "engine": float("inf")}
    for round_ in range(repeats + 1):
        for name in ("torch", "engine") if round_ % 2 else ("engine", "torch"):
            start = time.perf_counter()
            if name == "engine":
                with policy.engine_kernels(model, rows=1):
                    model(input_ids=ids[:, -1:], **cache_arg(cache), use_cache=True, logits_to_keep=1)
            else:
                model(input_ids=ids[:, -1:], **cache_arg(cache), use_cache=True, logits_to_keep=1)
            best[name] = min(best[name], time.perf_counter() - start)
            cache.crop(-1)  # a negative count: drop the one new column
    return {
        "torch_ms": 1000 * best["torch"],
        "engine_ms": 1000 * best["engine"],
        "engine_over_torch": best["engine"] / best["torch"],
        "kernel_for_one_row": policy.table.kernel_for(1) if policy.table else "torch",
    }


@torch.inference_mode()
def _step_timings(model, ids, tokens: int, repeats: int) -> dict:
    """Plain ``generate()`` and the engine with nothing drafted on one prompt, whole calls (whether their tokens
    agree) and the one-token step timed directly (``step_ms``: torch's kernels for plain, the engine's for the
    engine)."""
    import transformers

    import hf_speculative as hfs

    common = dict(do_sample=False, attention_mask=torch.ones_like(ids))
    hfs.enable(model)

    def plain(n: int):
        return transformers.GenerationMixin.generate(model, ids, max_new_tokens=n, **common)

    def engine(n: int):
        return model.generate(ids, assistant_model=RootOnlyDrafter(), max_new_tokens=n, **ENGINE_CALL, **common)

    plain_timing, plain_ids = _decode_timing(plain, tokens, repeats)
    engine_timing, engine_ids = _decode_timing(engine, tokens, repeats)
    step = measure_one_token_step(model, ids, max(repeats, 3))
    plain_timing["step_ms"], engine_timing["step_ms"] = step["torch_ms"], step["engine_ms"]
    engine_timing["step_over_plain"] = step["engine_over_torch"]
    engine_timing["kernel_for_one_row"] = step["kernel_for_one_row"]
    engine_timing["call_split_step_over_plain"] = (
        engine_timing["call_split_step_ms"] / plain_timing["call_split_step_ms"]
    )
    engine_timing["tokens_equal_plain"] = bool(torch.equal(plain_ids, engine_ids))
    return {"plain": plain_timing, "engine": engine_timing}


def _projection(plain_step_ms: float, engine_step_ms: float, curve) -> dict:
    """``{nodes: {tau: projected speedup}}`` (see the module docstring)."""
    forward_ms = 1000 * curve.meta["step_seconds"]
    out = {}
    for nodes in PROJECTED_TREES:
        tree_step = engine_step_ms + (curve(nodes + 1) - 1) * forward_ms
        out[str(nodes)] = {str(tau): tau * plain_step_ms / tree_step for tau in PROJECTED_TAUS}
    return out


def _memory(name: str, dtype: str, tokens: int, prompt_tokens: int, seed: int) -> dict:
    plain = measure_memory("plain", name, dtype, tokens, prompt_tokens, seed)
    spec = measure_memory("speculative", name, dtype, tokens, prompt_tokens, seed)
    return {
        "plain_peak_bytes": plain["peak_bytes"],
        "speculative_peak_bytes": spec["peak_bytes"],
        "speculative_over_plain": spec["peak_bytes"] / plain["peak_bytes"] if plain["peak_bytes"] else None,
        "first_call_overhead_s": spec["first_call_overhead_s"],
        "first_call_s": spec["first_call_s"],
        "enable_s": spec["enable_s"],
    }


def _check_tokens(tokens: int) -> None:
    if tokens < 2:
        raise ValueError(f"--shape-tokens must be at least 2 (a step is timed beyond the first token), got {tokens}")


def measure_shape(
    name: str,
    dtype: str,
    tokens: int = 16,
    prompt_tokens: int = 32,
    repeats: int = 2,
    seed: int = 0,
    memory: bool = True,
) -> dict:
    """One shape in one dtype (see the module docstring): the memory processes first, then the model in this process."""
    from ..perf_model import measure_cost_curve

    _check_tokens(tokens)
    shape = check_shape(name, dtype)
    record = {
        "shape": name,
        "dtype": dtype,
        "num_parameters": shape.num_parameters,
        "weights_bytes": shape.num_parameters * shape.dtype_bytes,
        "new_tokens": tokens,
        "prompt_tokens": prompt_tokens,
    }
    record["memory"] = _memory(name, dtype, tokens, prompt_tokens, seed) if memory else None
    start = time.perf_counter()
    model = build_shape_model(name, dtype, seed)
    record.update(
        config_class=type(model.config).__name__, model_class=type(model).__name__, build_s=time.perf_counter() - start
    )
    record.update(_step_timings(model, random_prompt(model.config.vocab_size, prompt_tokens, seed), tokens, repeats))
    curve = measure_cost_curve(model, nodes=[n + 1 for n in TREE_NODES], repeats=repeats, projection_rows=(), seed=seed)
    record["tree_cost"] = {
        "one_token_forward_ms": 1000 * curve.meta["step_seconds"],
        "prefix": curve.meta["prefix"],
        "c": {str(n): curve(n + 1) for n in TREE_NODES},
    }
    record["projected_speedup"] = _projection(record["plain"]["step_ms"], record["engine"]["step_ms"], curve)
    del model
    gc.collect()
    return record


def run_shape_bench(
    names: list[str],
    dtypes: list[str],
    tokens: int = 16,
    prompt_tokens: int = 32,
    repeats: int = 2,
    seed: int = 0,
    memory: bool = True,
    say=print,
) -> dict:
    """Every shape in every dtype, one after the other; every pair is checked before the first is built (a refusal
    allocates nothing)."""
    _check_tokens(tokens)
    pairs = [(name, dtype) for name in names for dtype in dtypes]
    for name, dtype in pairs:
        check_shape(name, dtype)
    records = []
    for name, dtype in pairs:
        say(f"measuring {name} in {dtype} ...")
        records.append(measure_shape(name, dtype, tokens, prompt_tokens, repeats, seed, memory))
    setting = {
        "machine": cpu_info(),
        "new_tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "repeats": repeats,
        "seed": seed,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "projection": "tau x plain step / (engine one-token step + (c(N+1) - 1) x one-token forward); drafting "
        "left out: projected, an upper bound",
    }
    return {"setting": setting, "shapes": records}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _gib(n) -> str:
    return "n/a" if n is None else f"{n / GiB:.2f}"


def _cost_row(r: dict) -> str:
    mem = r["memory"] or {}
    ratio = mem.get("speculative_over_plain")
    overhead = mem.get("first_call_overhead_s")
    costs = " | ".join(f"{r['tree_cost']['c'][str(n)]:.2f}" for n in TREE_NODES)
    return (
        f"| {r['shape']} | {r['dtype']} | {_count(r['num_parameters'])} | {r['plain']['tokens_per_s']:.2f} | "
        f"{r['plain']['step_ms']:.1f} | {r['engine']['step_ms']:.1f} ({r['engine']['step_over_plain']:.2f}x) | {costs} | "
        f"{_gib(mem.get('plain_peak_bytes'))} | {_gib(mem.get('speculative_peak_bytes'))}"
        f"{'' if ratio is None else f' ({ratio:.2f}x)'} | {'n/a' if overhead is None else f'{overhead:.2f}'} |"
    )


def shapes_markdown(result: dict) -> str:
    """The cost table (one row per shape and dtype) and the projected speedups, under a line naming the machine."""
    s, m = result["setting"], result["setting"]["machine"]
    lines = [
        f"CPU: {m['cpu']} ({_flags_text(m)}), {m['torch_threads']} torch threads, torch {m['torch']}, "
        f"transformers {m['transformers']}; random weights, greedy, a {s['prompt_tokens']}-token prompt of random "
        f"ids, {s['new_tokens']} new tokens; {s['date']}. The steps are one decoding forward after the prompt, timed "
        "directly: torch's kernels (what plain `generate()` runs) and the engine's.",
        "",
        "| shape | dtype | parameters | plain tok/s | plain step ms | engine step ms (x plain) | "
        + " | ".join(f"c({n}+1)" for n in TREE_NODES)
        + " | peak RSS plain GiB | peak RSS speculative GiB (x plain) | "
        "first-call overhead s |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(TREE_NODES) + "---:|---:|---:|",
    ]
    lines += [_cost_row(r) for r in result["shapes"]]
    lines += [
        "",
        "Projected speedup (tau x plain step / tree step; drafting left out, an upper bound):",
        "",
        "| shape | dtype | tree nodes | " + " | ".join(f"tau {t:g}" for t in PROJECTED_TAUS) + " |",
        "|---|---|---:|" + "---:|" * len(PROJECTED_TAUS),
    ]
    for r in result["shapes"]:
        for nodes, by_tau in r["projected_speedup"].items():
            lines.append(
                f"| {r['shape']} | {r['dtype']} | {nodes} | " + " | ".join(f"{v:.2f}x" for v in by_tau.values()) + " |"
            )
    return "\n".join(lines)


def plot_shapes(result: dict, path) -> Path:
    """Left: tree verification cost c(N+1) against N; right: projected speedup against tau with 16-node trees; one
    line per shape and dtype, the CPU named in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cost, gain) = plt.subplots(1, 2, figsize=(11, 4.5))
    for r in result["shapes"]:
        label = f"{r['shape']} {r['dtype']}"
        cost.plot(TREE_NODES, [r["tree_cost"]["c"][str(n)] for n in TREE_NODES], marker="o", label=label)
        gain.plot(PROJECTED_TAUS, list(r["projected_speedup"]["16"].values()), marker="o", label=label)
    cost.set_xscale("log", base=2)
    cost.set_xticks(TREE_NODES, [str(n) for n in TREE_NODES])
    cost.set(xlabel="tree nodes N", ylabel="verification forward, in one-token engine forwards")
    gain.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    gain.set(xlabel="tau (tokens per step)", ylabel="projected speedup over plain, 16-node tree (x)")
    for ax in (cost, gain):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    m = result["setting"]["machine"]
    fig.suptitle(f"{m['cpu']} ({_flags_text(m)}), {m['torch_threads']} threads; random weights", fontsize=9)
    return save_figure(fig, path)


def write_shape_outputs(result: dict, output) -> list[Path]:
    """``output`` (JSON) and, next to it, the markdown table (``.md``) and the plot (``.png``)."""
    from .report import beside_record, write_json

    path = write_json(result, output)
    table = beside_record(path, ".md")
    write_atomically(table, shapes_markdown(result) + "\n")
    return [path, table, plot_shapes(result, beside_record(path, ".png"))]
