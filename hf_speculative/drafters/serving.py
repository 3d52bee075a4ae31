"""What every export to a serving engine shares: a folder with the engine's ``config.json`` and one
``model.safetensors`` under the names its loader reads (`hf_speculative.drafters.medusa.serving`,
`hf_speculative.drafters.eagle.serving`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["SERVER_WEIGHTS", "cpu_tensors", "save_server_folder"]

SERVER_WEIGHTS = "model.safetensors"


def cpu_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies of ``state`` (what safetensors writes, sharing no storage)."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def save_server_folder(output, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """Write ``config`` as ``config.json`` and ``state`` as ``model.safetensors`` into ``output`` (created if
    needed), each through a unique temporary file and ``os.replace``; returns the folder."""
    from safetensors.torch import save_file

    from ..paths import atomic_path, write_atomically

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / SERVER_WEIGHTS) as tmp:
        save_file(cpu_tensors(state), str(tmp), metadata={"format": "pt"})
    write_atomically(out / "config.json", json.dumps(config, indent=2) + "\n")
    return out
