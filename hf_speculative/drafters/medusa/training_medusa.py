"""Medusa-1 training (frozen backbone, Medusa Sec. 2.2.1): loss, labels, data set, collator and `Trainer`.

The loss is ``sum_k lambda_k * CE(head_k(h_t), x_{t+k+2})`` with ``lambda_k = 0.8**k`` (k = 0..K-1; the
paper writes the same with 1-based heads). As the backbone is frozen, each position ``t`` is one independent
example ``(h_t, [x_{t+2}, ..., x_{t+K+1}])``: the backbone's final hidden states are computed once
(`hf_speculative.training.trainer.extract_hidden_states`, cached on disk) and the heads train on them alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...training.trainer import DrafterTrainer, train_drafter, training_settings

__all__ = [
    "MEDUSA_DECAY",
    "medusa_loss",
    "medusa_head_losses",
    "medusa_labels",
    "MedusaPositionDataset",
    "MedusaCollator",
    "teacher_rows",
    "medusa_kd_head_losses",
    "MedusaTrainer",
    "train_medusa",
]

MEDUSA_DECAY = 0.8
IGNORE_INDEX = -100


def medusa_head_losses(logits: torch.Tensor, labels: torch.LongTensor) -> torch.Tensor:
    """Per-head mean cross entropy ``(K,)`` of ``logits (..., K, V)`` against ``labels (..., K)`` (-100 ignored;
    a head with no valid label contributes 0)."""
    K, V = logits.shape[-2:]
    logits = logits.reshape(-1, K, V).float()
    labels = labels.reshape(-1, K)
    losses = []
    for k in range(K):
        valid = labels[:, k] != IGNORE_INDEX
        if bool(valid.any()):
            losses.append(F.cross_entropy(logits[valid, k], labels[valid, k]))
        else:
            losses.append(logits.new_zeros(()))
    return torch.stack(losses)


def medusa_loss(logits: torch.Tensor, labels: torch.LongTensor, decay: float = MEDUSA_DECAY) -> torch.Tensor:
    """Medusa-1 loss ``sum_k decay**k * CE_k`` (Medusa Eq. 1, ``lambda_k = 0.8**k``)."""
    per_head = medusa_head_losses(logits, labels)
    weights = decay ** torch.arange(per_head.shape[0], dtype=per_head.dtype, device=per_head.device)
    return (weights * per_head).sum()


def medusa_labels(
    token_labels: torch.LongTensor, num_heads: int, offsets: torch.Tensor | None = None
) -> torch.LongTensor:
    """``(N,)`` token labels (``-100`` outside answers) -> ``(N, K)`` head labels: ``[t, k] = labels[t + k + 2]``
    within the same sequence (``offsets`` delimit sequences; default one sequence), else ``-100``."""
    n = token_labels.shape[0]
    if offsets is None:
        offsets = torch.tensor([0, n])
    seq_end = torch.empty(n, dtype=torch.long)
    for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        seq_end[s:e] = e
    out = torch.full((n, num_heads), IGNORE_INDEX, dtype=torch.long)
    t = torch.arange(n)
    for k in range(num_heads):
        src = t + k + 2
        ok = src < seq_end
        out[ok, k] = token_labels[src[ok]]
    return out


def teacher_rows(offsets: torch.Tensor, positions: torch.Tensor, num_heads: int) -> torch.LongTensor:
    """``(P, K)`` row of the target's stored next-token distribution that head k at ``positions`` distils from:
    head k predicts the token at t + k + 2, which the target's distribution at row t + k + 1 predicts
    (-1 where that row lies past the position's sequence)."""
    seq_end = torch.empty(int(offsets[-1]), dtype=torch.long)
    for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        seq_end[s:e] = e
    rows = positions[:, None] + torch.arange(1, num_heads + 1)[None]
    return torch.where(rows < seq_end[positions][:, None], rows, torch.full_like(rows, -1))


class MedusaPositionDataset(Dataset):
    """One example per position with at least one head label: ``{"hidden_states": (H,), "labels": (K,)}``.

    With target-labelled states (``states.has_teacher``) each example also carries the target's distribution
    for every head (Medusa-2's self-distillation, Sec. 2.3.2, applied to the heads):
    ``teacher_ids`` / ``teacher_logprobs`` ``(K, k)`` and ``teacher_valid`` ``(K,)``."""

    def __init__(self, states, num_heads: int, max_positions: int | None = None, seed: int = 0):
        labels = medusa_labels(states.labels, num_heads, states.offsets)
        keep = (labels != IGNORE_INDEX).any(-1).nonzero().squeeze(-1)
        if max_positions is not None and keep.numel() > max_positions:
            g = torch.Generator().manual_seed(seed)
            keep = keep[torch.randperm(keep.numel(), generator=g)[:max_positions]].sort().values
        self.hidden = states.hidden[keep]
        self.labels = labels[keep]
        self.teacher = None
        if getattr(states, "has_teacher", False):
            rows = teacher_rows(states.offsets, keep, num_heads)
            self.teacher = (states.topk_ids, states.topk_logprobs, rows)

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def __getitem__(self, i: int) -> dict:
        item = {"hidden_states": self.hidden[i], "labels": self.labels[i]}
        if self.teacher is not None:
            ids, logprobs, rows = self.teacher
            r = rows[i]
            valid = r >= 0
            r = r.clamp_min(0)
            item.update(teacher_ids=ids[r].long(), teacher_logprobs=logprobs[r].float(), teacher_valid=valid)
        return item


@dataclass
class MedusaCollator:
    """Stacks positions into ``hidden_states (B, H)`` (float32, from the fp16 cache) and ``labels (B, K)`` (and the
    teacher's ``(B, K, k)`` top-k when the examples carry it)."""

    dtype: torch.dtype = torch.float32

    def __call__(self, features: Sequence[dict]) -> dict:
        batch = {
            "hidden_states": torch.stack([f["hidden_states"] for f in features]).to(self.dtype),
            "labels": torch.stack([f["labels"] for f in features]),
        }
        if "teacher_ids" in features[0]:
            for key in ("teacher_ids", "teacher_logprobs", "teacher_valid"):
                batch[key] = torch.stack([f[key] for f in features])
        return batch


def medusa_kd_head_losses(heads, hidden_states, teacher_ids, teacher_logprobs, teacher_valid) -> torch.Tensor:
    """Per-head KD loss ``(K,)``: ``KL(p_target || q_head)`` against the target's stored top-k (`kd_loss`). Heads with a
    draft vocabulary (FR-Spec) train on its logits only: teacher mass outside it is dropped."""
    from ...training.losses import kd_loss
    from ..draft_vocab import draft_vocab_weight

    states = heads.head_states(hidden_states)  # (B, K, H)
    d2t = getattr(heads, "draft_to_target", None)
    vocab_index = None
    if d2t is not None:
        vocab_index = torch.full((heads.config.vocab_size,), -1, dtype=torch.long, device=d2t.device)
        vocab_index[d2t] = torch.arange(d2t.numel(), device=d2t.device)
    losses = []
    for k in range(states.shape[-2]):
        if heads.config.share_lm_head:  # the frozen base lm_head: its rows of the draft vocabulary sliced once
            weight = heads.base_lm_head.weight.detach()
            weight = draft_vocab_weight(weight, d2t) if d2t is not None else weight
        else:  # each head's own trainable W2
            weight = heads.heads[k].lm_head.weight
            weight = weight[d2t] if d2t is not None else weight
        logits = F.linear(states[:, k], weight)
        losses.append(kd_loss(logits, teacher_ids[:, k], teacher_logprobs[:, k], teacher_valid[:, k], vocab_index))
    return torch.stack(losses)


class MedusaTrainer(DrafterTrainer):
    """Medusa-1: only the heads train (the base ``lm_head`` they share is frozen and not a parameter). The loss is
    ``sum_k decay**k * L_k`` with L_k the cross entropy against the text, or, on target-labelled data, the KD
    loss against the target's distribution."""

    def __init__(self, *args, decay: float = MEDUSA_DECAY, **kwargs):
        super().__init__(*args, **kwargs)
        self.decay = decay

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        if "teacher_ids" in inputs:  # distil the target's own distribution (target-labelled data)
            per_head = medusa_kd_head_losses(
                model,
                inputs["hidden_states"],
                inputs["teacher_ids"],
                inputs["teacher_logprobs"],
                inputs["teacher_valid"],
            )
            outputs = None
        else:
            outputs = model(hidden_states=inputs["hidden_states"])
            per_head = medusa_head_losses(outputs.logits, inputs["labels"])
        weights = self.decay ** torch.arange(per_head.shape[0], dtype=per_head.dtype, device=per_head.device)
        loss = (weights * per_head).sum()
        self.record_parts({f"loss_head{k}": v.detach() for k, v in enumerate(per_head)})
        return (loss, outputs) if return_outputs else loss


def train_medusa(heads, train_states, output_dir: str, max_positions: int | None = None, **training):
    """Train ``heads`` (a `MedusaHeadsModel` attached to its base) on cached hidden states; returns the Trainer.
    ``max_positions``: train on at most that many positions (sampled with the seed). ``training``: the schedule
    (`hf_speculative.training.trainer.TRAINING_DEFAULTS`; here learning rate 1e-3, batch 64 positions, logs every 20
    steps); ``time_budget`` (seconds) stops it, the learning rate annealed over the budget (`TimeBudgetCallback`)."""
    training = training_settings(training, learning_rate=1e-3, batch_size=64, logging_steps=20)
    dataset = MedusaPositionDataset(
        train_states, heads.config.num_heads, max_positions=max_positions, seed=training["seed"]
    )
    return train_drafter(MedusaTrainer, heads, dataset, MedusaCollator(), output_dir, **training)
