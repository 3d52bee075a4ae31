"""Where hf_speculative caches what is expensive to compute, and the key naming the model it was computed from.

Everything lives under ``$HF_SPECULATIVE_CACHE`` (default ``~/.cache/hf_speculative``): the converted reference
model, cached hidden states, target-labelled shards, measured cost curves. No heavy imports: the inference path
(cost-aware trees) and the training path both use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

__all__ = ["atomic_path", "cache_root", "machine_description", "model_key", "speed_key", "write_atomically"]


def cache_root() -> Path:
    """``$HF_SPECULATIVE_CACHE`` or ``~/.cache/hf_speculative``."""
    return Path(os.environ.get("HF_SPECULATIVE_CACHE", Path.home() / ".cache" / "hf_speculative")).expanduser()


#: values sampled from each parameter for a key (evenly spaced along each dimension)
SAMPLE_ROWS, SAMPLE_COLUMNS = 16, 64


def _sample(param) -> bytes:
    """A few values of ``param`` (at most `SAMPLE_ROWS` x `SAMPLE_COLUMNS`, evenly spaced, in its own dtype, copied
    to the CPU): O(1) memory whatever its size; nothing for a tensor with no data (meta device)."""
    import torch

    if param.device.type == "meta" or param.numel() == 0:
        return b"meta" if param.device.type == "meta" else b""
    with torch.no_grad():
        t = param.detach()
        t = t.reshape(t.shape[0], -1) if t.dim() > 2 else t.reshape(1, -1) if t.dim() < 2 else t
        rows = torch.linspace(0, t.shape[0] - 1, min(SAMPLE_ROWS, t.shape[0]), device=t.device).long()
        cols = torch.linspace(0, t.shape[1] - 1, min(SAMPLE_COLUMNS, t.shape[1]), device=t.device).long()
        values = t[rows[:, None], cols[None, :]].cpu().contiguous()
    return values.view(torch.uint8).numpy().tobytes() if values.dtype != torch.bool else values.numpy().tobytes()


def _config_key(model, key) -> None:
    key.update(str(getattr(model.config, "_name_or_path", type(model).__name__)).encode())
    key.update(json.dumps(model.config.to_diff_dict(), sort_keys=True, default=str).encode())


def model_key(model, max_length: int) -> str:
    """A short hash naming a model and a length setting, the key of its data caches (hidden states, labelled
    shards): its config, and of every parameter its name, shape, dtype and a sample of its values (`_sample`), so
    that two fine-tunes of one model get different keys. O(1) memory per parameter, no float64 copy, exact bytes
    (no dependence on the thread count's summation order)."""
    key = hashlib.sha256()
    _config_key(model, key)
    for name, param in model.named_parameters():
        key.update(f"{name}|{tuple(param.shape)}|{param.dtype}".encode())
        key.update(_sample(param))
    key.update(f"{max_length}|{model.dtype}".encode())
    return key.hexdigest()[:16]


def speed_key(model) -> str:
    """A short hash naming what a model's speed depends on, the key of its speed caches (kernel tables, cost
    curves): its config, every parameter's shape, dtype and device, and a sample of the first three parameters'
    values. Nothing proportional to the model's size: cheap on the first ``generate()`` of an 8B model."""
    key = hashlib.sha256()
    _config_key(model, key)
    for i, (name, param) in enumerate(model.named_parameters()):
        key.update(f"{name}|{tuple(param.shape)}|{param.dtype}|{param.device.type}".encode())
        if i < 3:
            key.update(_sample(param))
    return key.hexdigest()[:16]


def _reserve_temporary(path: Path) -> Path:
    """A new empty file beside ``path`` with a name no other writer has (``.<name>.<random>.tmp``), created with the
    mode ``open(path, "w")`` would give (0o666 less the umask; ``mkstemp`` would give 0o600)."""
    import secrets

    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A unique temporary file in ``path``'s folder for the block to write (by name: ``save_file``, ``torch.save``),
    moved onto ``path`` with ``os.replace`` when the block ends, removed when it raises: a reader sees the old file or
    the new one, never a part (a killed run, or two processes writing at once)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _reserve_temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` through `atomic_path`."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")


def machine_description(device: "torch.device | str" = "cpu") -> str:
    """What a cost curve depends on besides the model: the CUDA device's name, or the CPU model, platform
    and torch's intra-op thread count."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:  # no /proc/cpuinfo (not Linux): the platform module's processor name stands in
        pass
    return f"{device.type}:{platform.system()}-{platform.machine()}:{cpu}:threads={torch.get_num_threads()}"
