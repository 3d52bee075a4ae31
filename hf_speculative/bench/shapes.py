"""Random-weight targets of published shapes, built without a download: what a decoding step costs at real size.

A step's time does not depend on the weights' values, so the cost side of speculative decoding (a one-token step, a
tree verification forward, peak memory) can be measured at 0.5B-8B on random weights. `build_shape_model` builds a
named shape of `hf_speculative.perf_model.SHAPES` in its family's own class (``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``MistralForCausalLM``):

1. on the meta device (no memory);
2. then every parameter is allocated once with ``torch.empty`` on the CPU, directly in the target dtype, and filled by
   tiling a small random block (std 0.02; RMSNorm weights 1), so no float32 copy of the model and no second copy ever
   exists; tied weights stay one tensor; the rotary embedding is built again on the CPU.

An 8B model in bfloat16 takes its 16 GB and about a minute. `check_shape` refuses, before anything is allocated, an
unknown name (listing the known ones), a dtype other than float32 / bfloat16, float32 above
`FLOAT32_MAX_PARAMETERS`, and a shape whose weights with a margin (`required_memory`) exceed ``MemAvailable``.

``python -m hf_speculative.bench.shapes plain|speculative SHAPE DTYPE TOKENS PROMPT_TOKENS SEED`` measures one shape's
peak resident memory in a fresh process (`memory_main`): it builds the model, decodes ``TOKENS`` tokens with plain
``generate()`` or with ``hfs.enable`` (timed) and a model-free drafter (`PromptLookupDrafter`) twice (the first call's
extra time is the first-call overhead), and prints ``VmHWM`` from ``/proc/self/status`` as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from ..perf_model.shapes import ModelShape, check_shape_name, shape_config

__all__ = [
    "SHAPE_DTYPES",
    "FLOAT32_MAX_PARAMETERS",
    "available_memory",
    "required_memory",
    "check_shape",
    "build_shape_model",
    "random_prompt",
    "peak_resident_memory",
    "measure_memory",
]

#: the dtypes a shape is built in
SHAPE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: float32 is built up to this many parameters (a 3B model takes 12 GB in float32); bfloat16 for every shape
FLOAT32_MAX_PARAMETERS = 3.0e9
#: the memory kept free beside the weights: the engine may add up to 10% of the weights (DESIGN: within 1.10x of
#: the model's own), plus Python, torch and transformers themselves
WEIGHT_MARGIN = 0.10
RUNTIME_BYTES = 1 << 30
#: positions the KV cache holds at most in a measurement (the cost curve's 128-token prefix and 65-token forward, the
#: prompt and the new tokens, rounded up)
CACHE_POSITIONS = 512
#: the random block every parameter is tiled with: a prime length, so that no two rows of a matrix are equal
BLOCK = 65521
GiB = float(1 << 30)


def _proc_kilobytes(path: str, field: str) -> int | None:
    """The ``field:`` line of a ``/proc`` file (a count of kB) in bytes; None where it cannot be read."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # no such file (not Linux) or a line of another format: unknown
        pass
    return None


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where it cannot be read)."""
    return _proc_kilobytes("/proc/meminfo", "MemAvailable")


def required_memory(shape: ModelShape) -> dict[str, int]:
    """Bytes a measurement of ``shape`` needs: its weights (parameters x dtype bytes), the margin beside them
    (`WEIGHT_MARGIN`, `RUNTIME_BYTES`) and a KV cache of `CACHE_POSITIONS` positions; ``total`` is their sum."""
    weights = shape.num_parameters * shape.dtype_bytes
    margin = int(WEIGHT_MARGIN * weights) + RUNTIME_BYTES
    cache = CACHE_POSITIONS * shape.kv_bytes_per_token
    return {"weights": weights, "margin": margin, "kv_cache": cache, "total": weights + margin + cache}


def check_shape(name: str, dtype: str) -> ModelShape:
    """The `ModelShape` of ``name`` in ``dtype``, or a `ValueError` saying why it is not built here (unknown name or
    dtype, float32 above `FLOAT32_MAX_PARAMETERS`, more memory than ``MemAvailable``). Allocates nothing."""
    check_shape_name(name)
    if dtype not in SHAPE_DTYPES:
        raise ValueError(f"--dtype {dtype!r} for a shape: use one of {', '.join(SHAPE_DTYPES)}")
    shape = ModelShape.from_name(name, dtype_bytes=torch.finfo(SHAPE_DTYPES[dtype]).bits // 8)
    if dtype == "float32" and shape.num_parameters > FLOAT32_MAX_PARAMETERS:
        raise ValueError(
            f"{name} has {shape.num_parameters / 1e9:.2f}B parameters: float32 is built up to "
            f"{FLOAT32_MAX_PARAMETERS / 1e9:.0f}B parameters; measure it in bfloat16 (--dtype bfloat16)"
        )
    need, free = required_memory(shape), available_memory()
    if free is not None and need["total"] > free:
        raise ValueError(
            f"{name} in {dtype} needs {need['total'] / GiB:.1f} GiB ({shape.num_parameters / 1e9:.2f}B parameters x "
            f"{shape.dtype_bytes} bytes = {need['weights'] / GiB:.1f} GiB of weights, {need['margin'] / GiB:.1f} GiB "
            f"margin, {need['kv_cache'] / GiB:.2f} GiB KV cache) but this machine has {free / GiB:.1f} GiB available "
            "(MemAvailable); nothing was allocated"
        )
    return shape


def _random_block(dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (0.02 * torch.randn(BLOCK, generator=generator)).to(dtype)


def _tile(data: torch.Tensor, block: torch.Tensor) -> None:
    """Fill ``data`` in place with ``block`` repeated (one broadcast copy, no temporary of ``data``'s size)."""
    flat = data.view(-1)
    whole = flat.numel() // block.numel()
    if whole:
        flat[: whole * block.numel()].view(whole, block.numel()).copy_(block.expand(whole, -1))
    rest = flat.numel() - whole * block.numel()
    flat[flat.numel() - rest :].copy_(block[:rest])


def _materialize(model, dtype: torch.dtype, seed: int) -> None:
    """Every meta parameter allocated on the CPU in ``dtype`` and filled (tied parameters once, and still tied)."""
    block = _random_block(dtype, seed)
    made: dict[int, tuple[torch.Tensor, torch.nn.Parameter]] = {}  # id of the meta parameter -> (it, its CPU one)
    for module in model.modules():
        for key, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if id(param) not in made:
                data = torch.empty(param.shape, dtype=dtype, device="cpu")
                if "Norm" in type(module).__name__:
                    data.fill_(1.0)
                else:
                    _tile(data, block)
                made[id(param)] = (param, torch.nn.Parameter(data, requires_grad=False))
            module._parameters[key] = made[id(param)][1]
    _rebuild_meta_buffers(model)


def _rebuild_meta_buffers(model) -> None:
    """Modules whose buffers are still on the meta device built again on the CPU: the rotary embedding, whose
    frequencies the config decides."""
    for name, module in list(model.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        if not type(module).__name__.endswith("RotaryEmbedding"):
            raise RuntimeError(f"{name} ({type(module).__name__}) has buffers this builder cannot fill")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, type(module)(config=module.config))


def build_shape_model(name: str, dtype: str = "bfloat16", seed: int = 0):
    """A random-weight causal LM of the named shape in ``dtype`` on the CPU (sdpa attention, eval mode, no EOS so that
    every generate() makes its ``max_new_tokens``), after `check_shape`."""
    from transformers import AutoModelForCausalLM

    check_shape(name, dtype)
    config = shape_config(name)
    config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=SHAPE_DTYPES[dtype], attn_implementation="sdpa")
    with torch.inference_mode(False):  # ordinary tensors even when called under inference mode, as loaded weights are
        _materialize(model, SHAPE_DTYPES[dtype], seed)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id, gc.do_sample = None, None, 0, False
    return model.eval()


def random_prompt(vocab_size: int, tokens: int, seed: int = 0) -> torch.LongTensor:
    """A fixed prompt of random token ids ``(1, tokens)``."""
    return torch.randint(vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))


def peak_resident_memory() -> int | None:
    """This process's peak resident memory (``VmHWM`` of ``/proc/self/status``) in bytes."""
    return _proc_kilobytes("/proc/self/status", "VmHWM")


def measure_memory(mode: str, name: str, dtype: str, tokens: int, prompt_tokens: int, seed: int = 0) -> dict:
    """Peak resident memory of decoding ``name`` in a fresh process (``mode``: ``plain`` or ``speculative``), and for
    ``speculative`` the first call's overhead (`memory_main`)."""
    import subprocess

    argv = [
        sys.executable,
        "-m",
        "hf_speculative.bench.shapes",
        mode,
        name,
        dtype,
        str(tokens),
        str(prompt_tokens),
        str(seed),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measuring the {mode} memory of {name} ({dtype}) failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


@torch.inference_mode()
def memory_main(argv: list[str]) -> dict:
    """The fresh process of `measure_memory`: build, decode (speculative: twice), report ``VmHWM``."""
    import transformers

    import hf_speculative as hfs

    mode, name, dtype, tokens, prompt_tokens, seed = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    model = build_shape_model(name, dtype, seed)
    ids = random_prompt(model.config.vocab_size, prompt_tokens, seed)
    kwargs = dict(max_new_tokens=tokens, do_sample=False, attention_mask=torch.ones_like(ids))
    if mode == "plain":
        transformers.GenerationMixin.generate(model, ids, **kwargs)
        return {"mode": mode, "peak_bytes": peak_resident_memory()}
    start = time.perf_counter()
    hfs.enable(model)
    seconds = [time.perf_counter() - start]
    for _ in range(2):  # the same call twice: what the first one costs more is the first-call overhead
        start = time.perf_counter()
        model.generate(ids, assistant_model=hfs.PromptLookupDrafter(), **kwargs)
        seconds.append(time.perf_counter() - start)
    return {
        "mode": mode,
        "peak_bytes": peak_resident_memory(),
        "enable_s": seconds[0],
        "first_call_s": seconds[1],
        "later_call_s": seconds[2],
        "first_call_overhead_s": seconds[1] - seconds[2],
    }


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    print(json.dumps(memory_main(sys.argv[1:])), flush=True)
