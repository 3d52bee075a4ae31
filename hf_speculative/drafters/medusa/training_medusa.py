"""Medusa-1 training (frozen backbone, Medusa Sec. 2.2.1): loss, labels, data set, collator and `Trainer`.

The loss is ``sum_k lambda_k * CE(head_k(h_t), x_{t+k+2})`` with ``lambda_k = 0.8**k`` (k = 0..K-1; the
paper writes the same with 1-based heads). As the backbone is frozen, each position ``t`` is one independent
example ``(h_t, [x_{t+2}, ..., x_{t+K+1}])``: the backbone's final hidden states are computed once
(`hf_speculative.training.trainer.extract_hidden_states`, cached on disk) and the heads train on them alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...training.trainer import DrafterTrainer

__all__ = [
    "MEDUSA_DECAY",
    "medusa_loss",
    "medusa_head_losses",
    "medusa_labels",
    "MedusaPositionDataset",
    "MedusaCollator",
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


def medusa_labels(token_labels: torch.LongTensor, num_heads: int, offsets: torch.Tensor | None = None) -> torch.LongTensor:
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


class MedusaPositionDataset(Dataset):
    """One example per position with at least one head label: ``{"hidden_states": (H,), "labels": (K,)}``."""

    def __init__(self, states, num_heads: int, max_positions: int | None = None, seed: int = 0):
        labels = medusa_labels(states.labels, num_heads, states.offsets)
        keep = (labels != IGNORE_INDEX).any(-1).nonzero().squeeze(-1)
        if max_positions is not None and keep.numel() > max_positions:
            g = torch.Generator().manual_seed(seed)
            keep = keep[torch.randperm(keep.numel(), generator=g)[:max_positions]].sort().values
        self.hidden = states.hidden[keep]
        self.labels = labels[keep]

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"hidden_states": self.hidden[i], "labels": self.labels[i]}


@dataclass
class MedusaCollator:
    """Stacks positions into ``hidden_states (B, H)`` (float32, from the fp16 cache) and ``labels (B, K)``."""

    dtype: torch.dtype = torch.float32

    def __call__(self, features: Sequence[dict]) -> dict:
        return {
            "hidden_states": torch.stack([f["hidden_states"] for f in features]).to(self.dtype),
            "labels": torch.stack([f["labels"] for f in features]),
        }


class MedusaTrainer(DrafterTrainer):
    """Medusa-1: only the heads train (the base ``lm_head`` they share is frozen and not a parameter)."""

    def __init__(self, *args, decay: float = MEDUSA_DECAY, **kwargs):
        super().__init__(*args, **kwargs)
        self.decay = decay

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        outputs = model(hidden_states=inputs["hidden_states"])
        per_head = medusa_head_losses(outputs.logits, inputs["labels"])
        weights = self.decay ** torch.arange(per_head.shape[0], dtype=per_head.dtype, device=per_head.device)
        loss = (weights * per_head).sum()
        self.record_parts({f"loss_head{k}": v.detach() for k, v in enumerate(per_head)})
        return (loss, outputs) if return_outputs else loss


def train_medusa(
    heads,
    train_states,
    output_dir: str,
    num_epochs: float = 1.0,
    learning_rate: float = 1e-3,
    batch_size: int = 64,
    weight_decay: float = 0.0,
    warmup_ratio: float = 0.05,
    max_positions: int | None = None,
    logging_steps: int = 20,
    seed: int = 0,
    progress: bool = True,
    callbacks: list | None = None,
):
    """Train ``heads`` (a `MedusaHeadsModel` attached to its base) on cached hidden states; returns the Trainer."""
    from transformers import TrainingArguments

    dataset = MedusaPositionDataset(train_states, heads.config.num_heads, max_positions=max_positions, seed=seed)
    steps = max(1, math.ceil(len(dataset) / batch_size * num_epochs))
    args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        weight_decay=weight_decay,
        warmup_steps=max(1, int(warmup_ratio * steps)),
        lr_scheduler_type="cosine",
        logging_steps=logging_steps,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=not progress,
        seed=seed,
    )
    heads.train()
    trainer = MedusaTrainer(model=heads, args=args, train_dataset=dataset, data_collator=MedusaCollator(), callbacks=callbacks)
    trainer.train()
    heads.eval()
    return trainer
