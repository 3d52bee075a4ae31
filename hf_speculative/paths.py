"""Where hf_speculative caches what is expensive to compute, and the key naming the model it was computed from.

Everything lives under ``$HF_SPECULATIVE_CACHE`` (default ``~/.cache/hf_speculative``): the converted reference
model, cached hidden states, target-labelled shards, measured cost curves. No heavy imports: the inference path
(cost-aware trees) and the training path both use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["cache_root", "machine_description", "model_key"]


def cache_root() -> Path:
    """``$HF_SPECULATIVE_CACHE`` or ``~/.cache/hf_speculative``."""
    return Path(os.environ.get("HF_SPECULATIVE_CACHE", Path.home() / ".cache" / "hf_speculative")).expanduser()


def model_key(model, max_length: int) -> str:
    """A short hash naming a model (its config, a checksum of its first weights, the dtype) and a length setting:
    the key of every cache computed from the model (hidden states, labelled shards, cost curves)."""
    key = hashlib.sha256()
    key.update(str(getattr(model.config, "_name_or_path", type(model).__name__)).encode())
    key.update(json.dumps(model.config.to_diff_dict(), sort_keys=True, default=str).encode())
    # float64 and 9 significant digits: the checksum must not depend on the thread count's summation order
    checksum = sum(float(p.detach().double().abs().sum()) for p in list(model.parameters())[:3])
    key.update(f"{checksum:.9e}".encode())
    key.update(f"{max_length}|{model.dtype}".encode())
    return key.hexdigest()[:16]


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
    except OSError:
        pass
    return f"{device.type}:{platform.system()}-{platform.machine()}:{cpu}:threads={torch.get_num_threads()}"
