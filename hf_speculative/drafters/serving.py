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
    """Write ``config`` as ``config.json`` and ``state`` as ``model.safetensors``
    into ``output`` (created if needed); returns the folder."""
    from safetensors.torch import save_file

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(cpu_tensors(state), str(out / SERVER_WEIGHTS), metadata={"format": "pt"})
    return out
