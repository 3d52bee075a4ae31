"""Distillation losses shared by every drafter's training.

The target is labelled once (``hf_speculative.training.labelling``): at each position t it stores its
next-token distribution as the top-k token ids and log-probabilities. A drafter then trains against the
target's own distribution rather than against human text, which the target does not reproduce (Medusa-2's
self-distillation, Sec. 2.3.2; SPIRe's distillation term, Sec. 3.4; EAGLE's token loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["kd_loss", "teacher_probs"]


def teacher_probs(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """The teacher's top-k probabilities renormalized over the stored k (rows sum to 1)."""
    return torch.softmax(topk_logprobs.float(), dim=-1)


def kd_loss(
    student_logits: torch.Tensor,
    topk_ids: torch.LongTensor,
    topk_logprobs: torch.Tensor,
    valid: torch.Tensor | None = None,
    vocab_index: torch.LongTensor | None = None,
) -> torch.Tensor:
    """Forward KL ``KL(p_target || q_student)`` up to the teacher's entropy: ``-sum_j p_j log q(id_j)``, averaged
    over the valid rows.

    ``student_logits (M, V_s)``; ``topk_ids (M, k)`` target-vocabulary ids of the teacher's k most likely tokens;
    ``topk_logprobs (M, k)`` their log-probabilities (renormalized over the k here, so the loss is the
    cross-entropy to the teacher's top-k distribution); ``valid (M,)`` bool rows to use (None: all).
    ``vocab_index (V_target,)``: for a student over a truncated draft vocabulary, the draft index of every
    target id (-1 where the draft vocabulary lacks it); without it, ids of -1 mark tokens the student cannot score.
    Teacher mass on missing ids is dropped and the rest renormalized. Returns 0 (with a gradient path) when no row
    is valid.
    """
    logits = student_logits.float()
    ids = topk_ids.long()
    p = teacher_probs(topk_logprobs)
    if vocab_index is not None:
        ids = vocab_index.to(ids.device)[ids]
    if vocab_index is not None or bool((ids < 0).any()):
        present = ids >= 0
        p = p * present
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        ids = ids.clamp_min(0)
    if valid is not None:
        logits, ids, p = logits[valid], ids[valid], p[valid]
    if logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    logq = F.log_softmax(logits, dim=-1).gather(-1, ids)
    return -(p * logq).sum(-1).mean()
