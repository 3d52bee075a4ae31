"""What drafters share to read their target: its final hidden states, its embeddings, and the attention
implementations that take a custom mask. The engine's side of a drafter is `hf_speculative.engine.protocol`."""

from __future__ import annotations

import torch

__all__ = ["final_hidden_state", "output_embeddings", "input_embeddings", "require_mask_attention", "rope"]


def require_mask_attention(model, role: str, mask: str, fix: str) -> None:
    """A `ValueError` unless ``model`` runs eager or sdpa attention, the implementations that take a custom ``mask``."""
    impl = getattr(model.config, "_attn_implementation", "eager")
    if impl not in ("eager", "sdpa"):
        raise ValueError(
            f"{role} uses attn_implementation={impl!r}, which cannot take {mask}; call `{fix}.set_attn_implementation('sdpa')` "
            "(or 'eager') first"
        )


def final_hidden_state(outputs) -> torch.Tensor:
    """The state the target's ``lm_head`` consumes: in transformers 5 causal LMs the last element of
    ``outputs.hidden_states`` is the output of the final norm (tested: ``lm_head(h) == logits``)."""
    if getattr(outputs, "hidden_states", None) is None:
        raise ValueError("this drafter needs the target's hidden states (output_hidden_states=True)")
    return outputs.hidden_states[-1]


def output_embeddings(model, needed_by: str = "this drafter") -> torch.nn.Module:
    """``model``'s ``lm_head``; a `TypeError` naming ``needed_by`` when it has none."""
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if lm_head is None or getattr(lm_head, "weight", None) is None:
        raise TypeError(
            f"{type(model).__name__} has no output embeddings (lm_head): {needed_by} needs a causal LM target"
        )
    return lm_head


def input_embeddings(model, needed_by: str = "this drafter") -> torch.nn.Module:
    """``model``'s token embeddings; a `TypeError` naming ``needed_by`` when it has none."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is None:
        raise TypeError(f"{type(model).__name__} has no input embeddings: {needed_by} needs a causal LM target")
    return emb


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x (B, heads, T, d)`` with ``cos, sin (B, T, d)`` (transformers' ``apply_rotary_pos_emb`` for one
    tensor, when queries and keys take different positions)."""
    from transformers.models.llama.modeling_llama import rotate_half

    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)
