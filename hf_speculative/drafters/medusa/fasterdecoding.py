"""Medusa heads in the layout of the reference implementation (FasterDecoding/Medusa, the published
``medusa-vicuna-7b-v1.3`` and its many fine-tunes).

Such a folder holds a ``config.json`` with ``medusa_num_heads``, ``medusa_num_layers`` and
``base_model_name_or_path``, and the heads' weights in ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt``
(a state dict of ``nn.ModuleList([nn.Sequential(ResBlock x L, Linear(H, V, bias=False))] x K)``):

    {h}.{l}.linear.weight  (H, H)    {h}.{l}.linear.bias  (H,)     residual block l of head h: x + SiLU(W1 x + b1)
    {h}.{L}.weight         (V, H)                                  head h's own vocabulary projection W2

The reference builds a head's blocks as ``[ResBlock(H)] * L``, one block repeated, so for L > 1 the L entries
hold the same tensors; loading them into L independent blocks computes the same function. The heads become a
`MedusaHeadsModel` with ``share_lm_head=False`` (every head owns its W2) and the same maths.

A Medusa-2 checkpoint of the reference implementation is one causal LM folder: the base model's weights, trained
together with the heads, and the heads under ``medusa_head.{h}...`` in its safetensors files. Its heads load the
same way; the target to verify them with is that folder's own (changed) model,
``AutoModelForCausalLM.from_pretrained(folder)``, not the original base.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

__all__ = ["HEADS_FILES", "fasterdecoding_config", "read_fasterdecoding_heads", "fasterdecoding_state_dict"]

#: the heads' weight files, in the order they are looked for
HEADS_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
#: where a Medusa-2 full model (the reference's ``MedusaModel`` saved whole) keeps its heads
MEDUSA2_PREFIX = "medusa_head."
_KEY = re.compile(r"^(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)$")


def fasterdecoding_config(path) -> dict | None:
    """The folder's config.json when it is in the reference implementation's layout (it names
    ``medusa_num_heads``), else None."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    return config if "medusa_num_heads" in config else None


def _read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    for name in HEADS_FILES:
        file = folder / name
        if file.is_file():
            if file.suffix == ".safetensors":
                from safetensors.torch import load_file

                return load_file(str(file))
            return torch.load(file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} has no {' or '.join(HEADS_FILES)}")


def _medusa2_heads(folder: Path) -> dict[str, torch.Tensor]:
    """The ``medusa_head.*`` tensors of a Medusa-2 full-model folder's weight files (safetensors, or ``.bin`` read
    with ``weights_only=True``), prefix removed."""
    from safetensors import safe_open

    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            state.update({k[len(MEDUSA2_PREFIX) :]: f.get_tensor(k) for k in f.keys() if k.startswith(MEDUSA2_PREFIX)})
    if not state:
        for file in sorted(folder.glob("pytorch_model*.bin")):
            weights = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            state.update(
                {k[len(MEDUSA2_PREFIX) :]: v.clone() for k, v in weights.items() if k.startswith(MEDUSA2_PREFIX)}
            )
    return state


def _medusa2_error(folder: Path, config: dict) -> ValueError:
    return ValueError(
        f"{folder} names medusa_num_heads but holds no Medusa heads: no {' or '.join(HEADS_FILES)} and no "
        f"'{MEDUSA2_PREFIX}*' weights (model_type {config.get('model_type')!r}, architectures {config.get('architectures')}). "
        "Pass a Medusa-1 heads folder (medusa_lm_head.safetensors/.pt next to a config.json naming medusa_num_heads) or a "
        "Medusa-2 folder whose weights hold the heads; hf_speculative's own Medusa-2 checkpoints (hf-speculative train "
        "medusa --medusa2) load with load_medusa2."
    )


def read_fasterdecoding_heads(path, **config_kwargs):
    """``(MedusaConfig, state_dict)`` of a reference-layout heads folder, the state dict in `MedusaHeadsModel`'s key
    names (``share_lm_head=False``: every head owns its W2). Hidden and vocabulary sizes come from the weights;
    ``config_kwargs`` (e.g. ``medusa_choices``) go to `MedusaConfig`."""
    from .configuration_medusa import MedusaConfig

    folder = Path(path)
    config = fasterdecoding_config(folder)
    if config is None:
        raise ValueError(f"{folder} is not a reference-layout Medusa folder (no config.json with medusa_num_heads)")
    base_model = config.get("base_model_name_or_path")
    if any((folder / name).is_file() for name in HEADS_FILES):
        state = _read_state_dict(folder)
    else:  # Medusa-2: the heads inside the full model's weights; their target is this folder's (changed) model
        state = _medusa2_heads(folder)
        if not state:
            raise _medusa2_error(folder, config)
        base_model = str(folder)
        logger.warning(
            f"{folder} is a Medusa-2 checkpoint: verify its heads with the folder's own model as the target "
            "(AutoModelForCausalLM.from_pretrained(folder)), not the original base"
        )
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    projection = state.get(f"0.{num_layers}.weight")
    if projection is None:
        raise ValueError(
            f"{folder}: no key '0.{num_layers}.weight' (head 0's vocabulary projection) for medusa_num_layers={num_layers}"
        )
    vocab_size, hidden_size = projection.shape
    medusa_config = MedusaConfig(
        base_model_name_or_path=base_model,
        hidden_size=hidden_size,
        vocab_size=vocab_size,
        num_heads=num_heads,
        num_layers=num_layers,
        share_lm_head=False,
        **config_kwargs,
    )
    return medusa_config, fasterdecoding_state_dict(state, num_heads, num_layers, folder)


def fasterdecoding_state_dict(
    state: dict[str, torch.Tensor], num_heads: int, num_layers: int, source=""
) -> dict[str, torch.Tensor]:
    """The reference implementation's keys renamed to `MedusaHeadsModel`'s; any key left over, or missing, is
    an error naming it."""
    out, unused = {}, []
    for key, tensor in state.items():
        match = _KEY.match(key)
        if match is None:
            unused.append(key)
            continue
        h, l, kind = int(match.group(1)), int(match.group(2)), match.group(3)
        if h >= num_heads or l > num_layers:
            unused.append(key)
        elif l == num_layers and kind == "weight" and ".linear." not in key:
            out[f"heads.{h}.lm_head.weight"] = tensor
        elif l < num_layers and ".linear." in key:
            out[f"heads.{h}.blocks.{l}.{kind}"] = tensor
        else:
            unused.append(key)
    expected = {f"heads.{h}.lm_head.weight" for h in range(num_heads)}
    expected |= {
        f"heads.{h}.blocks.{l}.{k}" for h in range(num_heads) for l in range(num_layers) for k in ("weight", "bias")
    }
    missing = sorted(expected - set(out))
    if missing or unused:
        raise ValueError(
            f"{source}: weights do not match medusa_num_heads={num_heads}, medusa_num_layers={num_layers}: "
            f"missing {missing[:4]}{'...' if len(missing) > 4 else ''}, unexpected {unused[:4]}"
        )
    return out
