"""Medusa heads in the layout of a serving engine's loader.

vLLM (``vllm/model_executor/models/medusa.py`` and ``vllm/transformers_utils/configs/medusa.py``) builds
``blocks[h].layers[l]`` (``nn.Linear(H, H, bias=config.medusa_fc_bias)``, applied as ``x + SiLU(layer(x))``) and
``lm_heads[h]`` (``(truncated_vocab_size, H)``, no bias) from a folder with

    config.json         model_type "medusa", architectures ["MedusaModel"], hidden_size, vocab_size, num_heads,
                        num_hidden_layers, truncated_vocab_size, medusa_fc_bias
    model.safetensors   blocks.{h}.layers.{l}.weight|bias, lm_heads.{h}.weight

Our residual blocks carry a bias, so ``medusa_fc_bias`` is true. Heads that share the target's ``lm_head`` are
written with a copy of it per head (vLLM gives every head its own ``lm_heads[h]``). The full vocabulary is kept
(``truncated_vocab_size == vocab_size``, no ``token_map``).

SGLang has no Medusa loader (its speculative algorithms load EAGLE / EAGLE-3 drafters, plain draft models and
n-gram lookup), so Medusa heads cannot be exported for it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..serving import SERVER_WEIGHTS, cpu_tensors, save_server_folder

__all__ = ["VLLM_WEIGHTS", "vllm_medusa_config", "vllm_medusa_state_dict", "save_for_vllm"]

VLLM_WEIGHTS = SERVER_WEIGHTS


def vllm_medusa_config(heads) -> dict:
    """The config.json of vLLM's ``MedusaConfig`` for ``heads`` (a `MedusaHeadsModel`)."""
    c = heads.config
    return {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "num_heads": c.num_heads,
        "num_hidden_layers": c.num_layers,
        "truncated_vocab_size": c.vocab_size,
        "medusa_fc_bias": True,
        "base_model_name_or_path": c.base_model_name_or_path,
    }


def vllm_medusa_state_dict(heads) -> dict[str, torch.Tensor]:
    """vLLM's parameter names -> contiguous tensors; a shared base ``lm_head`` (attached with
    ``attach_base_model``) is copied into every ``lm_heads.{h}.weight``."""
    c = heads.config
    if c.share_lm_head and heads.base_lm_head is None:
        raise ValueError(
            "these Medusa heads share the target's lm_head, which vLLM needs as each head's own projection: load them "
            "with MedusaHeadsModel.from_pretrained(folder, base_model=target) (hf-speculative export --model TARGET)"
        )
    dtype = next((p.dtype for p in heads.parameters()), None)  # the heads' dtype (none when num_layers = 0 and shared)
    state = {}
    for h, head in enumerate(heads.heads):
        for l, block in enumerate(head.blocks):
            state[f"blocks.{h}.layers.{l}.weight"] = block.weight.detach()
            state[f"blocks.{h}.layers.{l}.bias"] = block.bias.detach()
        projection = heads.base_lm_head.weight if c.share_lm_head else head.lm_head.weight
        state[f"lm_heads.{h}.weight"] = projection.detach().to(dtype or projection.dtype)
    return cpu_tensors(state)


def save_for_vllm(heads, output) -> Path:
    """Write ``heads`` as a vLLM Medusa folder (config.json + model.safetensors); returns the folder."""
    return save_server_folder(output, vllm_medusa_config(heads), vllm_medusa_state_dict(heads))
