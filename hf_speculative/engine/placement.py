"""Where a drafter runs: the one rule for a drafter that meets a target of another dtype or device.

**Rule.** When a drafter is attached to a target (``target.generate(assistant_model=drafter)``,
``Drafter.from_pretrained(folder, base_model=target)``, ``drafter.attach_base_model(target)``), the drafter's own
floating-point parameters and buffers move to the dtype and device of the target's ``lm_head`` (the module every
drafter reads the target through), and one warning line says so. The target is never changed, and nothing else
is: a drafter already in the target's dtype and device is left as it is, and the modules it shares with the target
(embeddings, ``lm_head``) are the target's own.

So a drafter saved in bfloat16 (``AutoModel.from_pretrained(folder)`` loads the saved dtype) runs in float32 next to
a float32 target, and a float32 drafter runs in bfloat16 next to a bfloat16 target. Greedy outputs are the target's
either way (the target verifies every token); the drafter's dtype only changes what it proposes. To keep a drafter
in another dtype, give it a target of that dtype.
"""

from __future__ import annotations

import itertools

import torch
from transformers.utils import logging

__all__ = ["match_target", "target_placement"]

logger = logging.get_logger(__name__)


def target_placement(target: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The dtype and device a drafter of ``target`` runs in: those of its ``lm_head`` (else its first parameter)."""
    head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        weight = next(itertools.chain(target.parameters(), target.buffers()), None)
    if weight is None:
        raise TypeError(f"{type(target).__name__} has no parameters: a drafter needs a target model")
    return weight.dtype, weight.device


def match_target(drafter: torch.nn.Module, target: torch.nn.Module) -> torch.nn.Module:
    """Move ``drafter`` to ``target``'s dtype and device (see the module docstring); returns ``drafter``.

    Only the drafter's own tensors move (a drafter keeps the modules it shares with the target outside its
    submodules). A target whose ``lm_head`` is not floating point (quantized) sets the device only.
    """
    if drafter is target or not isinstance(drafter, torch.nn.Module):
        return drafter
    dtype, device = target_placement(target)
    tensors = list(itertools.chain(drafter.parameters(), drafter.buffers()))
    move_dtype = dtype.is_floating_point and any(t.is_floating_point() and t.dtype != dtype for t in tensors)
    move_device = any(t.device != device for t in tensors)
    if not (move_dtype or move_device):
        return drafter

    def name(x) -> str:
        return str(x).replace("torch.", "")

    was, now = [], []
    if move_dtype:
        was.append("/".join(sorted({name(t.dtype) for t in tensors if t.is_floating_point() and t.dtype != dtype})))
        now.append(name(dtype))
    if move_device:
        was.append("/".join(sorted({name(t.device) for t in tensors if t.device != device})))
        now.append(name(device))
    logger.warning(
        f"{type(drafter).__name__} moved from {' on '.join(was)} to {' on '.join(now)}, the target's: a drafter runs in "
        "the dtype and on the device of the target it is attached to"
    )
    return drafter.to(device=device, dtype=dtype) if move_dtype else drafter.to(device=device)
