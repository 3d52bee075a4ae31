"""Group-wise parallel training of the ParallelSpec drafter (Xiao et al., 2024, Sec. 4.1, Fig. 3).

After a context position ``t`` (the *anchor*) sits a *parallel group*: the k mask tokens that, at inference,
follow ``x_t`` when ``x_t`` is the last committed token. One training sequence holds the context tokens and
the groups of many anchors at once:

    ids        x_0 .. x_{N-1} | MASK_1 .. MASK_k (group t_1) | MASK_1 .. MASK_k (group t_2) | ...
    positions  0   .. N-1     | t_1+1  .. t_1+k              | t_2+1  .. t_2+k              | ...

with an attention mask by which a context token sees the context up to itself, mask j of group t sees the
context up to ``t`` and masks 1..j of its OWN group, and no token sees another group's masks. Each row then
computes exactly what the inference forward over ``[x_0 .. x_t, MASK_1 .. MASK_k]`` computes (tested).
Labels: the anchor row predicts ``y_{t+1}``, mask j of group t predicts ``y_{t+j+1}``.

Loss (ParallelSpec eq. 3): ``L = CE_0 + sum_{j=1..k} lambda_j CE_j`` where ``CE_j`` is the mean cross entropy of
the depth-j predictions; we use ``lambda_j = 0.8**j`` (`MASK_LOSS_DECAY`). With ``distill_weight = a > 0`` each
term is ``(1 - a) CE + a KL(p_target || q)`` against the target's own distribution at that position, read
from the cached final hidden states (``lm_head(h)`` is the target's exact next-token distribution, so no
online target forward and no stored top-k are needed).

Cost on CPU: the shared 49K-token ``lm_head`` over k + 1 rows per group dominates, so each sequence trains on
``groups_per_sequence`` randomly drawn anchors (fresh draws every epoch), and the first-token loss ``CE_0`` is
taken at those anchors only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...training.callbacks import LearningCurveCallback, TimeBudgetCallback
from ...training.trainer import DrafterTrainer, train_drafter, training_settings
from .configuration_parallel_drafter import MASK_LOSS_DECAY

__all__ = [
    "IGNORE_INDEX",
    "group_layout",
    "parallel_depth_losses",
    "parallel_loss",
    "ParallelGroupDataset",
    "ParallelGroupCollator",
    "ParallelDrafterTrainer",
    "ParallelCurveCallback",
    "depth_accuracies",
    "calibrate_tree",
    "TimeBudgetCallback",
    "train_parallel_drafter",
]

IGNORE_INDEX = -100


def group_layout(
    input_ids: torch.LongTensor,
    anchors: torch.LongTensor,
    num_mask_tokens: int,
    vocab_size: int,
    labels: torch.LongTensor | None = None,
) -> dict[str, torch.Tensor]:
    """The group-wise training layout of one sequence.

    ``input_ids`` ``(N,)``; ``anchors`` ``(G,)`` context positions that get a parallel group; ``labels`` ``(N,)``
    token labels (``-100`` outside answers; default: every token). Returns ``input_ids`` and ``position_ids``
    ``(Q,)`` with ``Q = N + G k`` (mask j, 0-based, written ``vocab_size + j``), ``visible`` ``(Q, Q)`` bool,
    ``prev_index`` ``(Q,)`` (the position whose target state a token is fused with: ``i - 1`` for context token
    i, -1 for none), and per predicting row (G groups x (k + 1) depths, group-major): ``rows`` (index into Q),
    ``depth``, ``row_labels`` and ``teacher_pos`` (the position whose target distribution is the teacher, -1 if
    out of range).
    """
    N, G, k = input_ids.shape[0], anchors.shape[0], num_mask_tokens
    if labels is None:
        labels = input_ids
    anchors = anchors.long()
    if G and (int(anchors.min()) < 0 or int(anchors.max()) >= N):
        raise ValueError("anchors must be positions of the sequence")
    j = torch.arange(k)
    mask_ids = (vocab_size + j).repeat(G)
    mask_pos = (anchors[:, None] + 1 + j).reshape(-1)
    ids = torch.cat([input_ids, mask_ids])
    positions = torch.cat([torch.arange(N), mask_pos])
    Q = N + G * k
    visible = torch.zeros(Q, Q, dtype=torch.bool)
    visible[:N, :N] = torch.ones(N, N, dtype=torch.bool).tril()
    group = torch.arange(G).repeat_interleave(k)
    rank = j.repeat(G)
    visible[N:, :N] = torch.arange(N)[None, :] <= anchors[group][:, None]
    visible[N:, N:] = (group[:, None] == group[None, :]) & (rank[None, :] <= rank[:, None])
    prev_index = torch.cat([torch.arange(N) - 1, torch.full((G * k,), -1)])

    depth = torch.arange(k + 1).repeat(G)
    anchor_of_row = anchors.repeat_interleave(k + 1)
    rows = torch.where(depth == 0, anchor_of_row, N + torch.arange(G).repeat_interleave(k + 1) * k + depth - 1)
    target_pos = anchor_of_row + 1 + depth
    ok = target_pos < N
    row_labels = torch.full_like(target_pos, IGNORE_INDEX)
    row_labels[ok] = labels[target_pos[ok]]
    teacher_pos = torch.where(ok, target_pos - 1, torch.full_like(target_pos, -1))
    return {
        "input_ids": ids,
        "position_ids": positions,
        "visible": visible,
        "prev_index": prev_index,
        "rows": rows,
        "depth": depth,
        "row_labels": row_labels,
        "teacher_pos": teacher_pos,
    }


def parallel_depth_losses(
    logits: torch.Tensor,
    labels: torch.LongTensor,
    depth: torch.LongTensor,
    num_depths: int,
    teacher_logits: torch.Tensor | None = None,
    distill_weight: float = 0.0,
) -> torch.Tensor:
    """``(k + 1,)`` per-depth losses: mean over the valid rows of each depth of ``(1 - a) CE + a KL(p || q)``
    (``a = distill_weight``; KL needs ``teacher_logits``). A depth with no valid row contributes 0."""
    V = logits.shape[-1]
    logits = logits.reshape(-1, V).float()
    labels, depth = labels.reshape(-1), depth.reshape(-1)
    valid = labels != IGNORE_INDEX
    ce = F.cross_entropy(logits, labels.clamp_min(0), reduction="none")
    per_row = ce
    if distill_weight > 0:
        if teacher_logits is None:
            raise ValueError("distillation needs the target's logits (teacher_logits)")
        logq = F.log_softmax(logits, -1)
        logp = F.log_softmax(teacher_logits.reshape(-1, V).float(), -1)
        kl = (logp.exp() * (logp - logq)).sum(-1)
        per_row = (1 - distill_weight) * ce + distill_weight * kl
    losses = []
    for d in range(num_depths):
        sel = valid & (depth == d)
        losses.append(per_row[sel].mean() if bool(sel.any()) else logits.new_zeros(()))
    return torch.stack(losses)


def parallel_loss(per_depth: torch.Tensor, decay: float = MASK_LOSS_DECAY) -> torch.Tensor:
    """ParallelSpec eq. 3: ``CE_0 + sum_j lambda_j CE_j`` with ``lambda_j = decay**j`` (``lambda_0 = 1``)."""
    weights = decay ** torch.arange(per_depth.shape[0], dtype=per_depth.dtype, device=per_depth.device)
    return (weights * per_depth).sum()


class ParallelGroupDataset(Dataset):
    """One example per training sequence: its tokens, labels and (optionally) the target's final hidden states;
    the collator draws the anchors. ``states``: `HiddenStates` (``hf_speculative.training.trainer``)."""

    def __init__(self, states, with_hidden: bool = True):
        self.items = []
        for i in range(len(states)):
            s, e = int(states.offsets[i]), int(states.offsets[i + 1])
            y = states.labels[s:e]
            if not bool((y[1:] != IGNORE_INDEX).any()):
                continue
            self.items.append(
                {"input_ids": states.input_ids[s:e], "labels": y, "hidden": states.hidden[s:e] if with_hidden else None}
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


@dataclass
class ParallelGroupCollator:
    """Draws up to ``groups_per_sequence`` anchors per sequence (positions whose next token is an answer token),
    builds each sequence's group-wise layout (truncated after its last group) and pads them into a batch:
    ``input_ids``, ``position_ids`` ``(B, Q)``, a 4D additive ``attention_mask`` ``(B, 1, Q, Q)``, ``logits_rows``,
    ``row_labels``, ``depth`` ``(B, R)``, and with hidden states ``target_hidden_states`` ``(B, Q, H)`` (the state
    each token is fused with) and ``teacher_hidden`` ``(B, R, H)`` (for distillation)."""

    num_mask_tokens: int
    vocab_size: int
    groups_per_sequence: int = 64
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)

    def _anchors(self, labels: torch.LongTensor) -> torch.LongTensor:
        cand = (labels[1:] != IGNORE_INDEX).nonzero().squeeze(-1)  # t such that y_{t+1} is an answer token
        if cand.numel() > self.groups_per_sequence:
            cand = (
                cand[torch.randperm(cand.numel(), generator=self.generator)[: self.groups_per_sequence]].sort().values
            )
        return cand

    def __call__(self, features: Sequence[dict]) -> dict:
        k = self.num_mask_tokens
        layouts, hiddens = [], []
        for f in features:
            anchors = self._anchors(f["labels"])
            n = min(int(anchors.max()) + k + 2, f["input_ids"].shape[0])  # nothing after the last label is needed
            lay = group_layout(f["input_ids"][:n], anchors, k, self.vocab_size, f["labels"][:n])
            layouts.append(lay)
            hiddens.append(None if f.get("hidden") is None else f["hidden"][:n])
        B = len(layouts)
        Q = max(l["input_ids"].shape[0] for l in layouts)
        R = max(l["rows"].shape[0] for l in layouts)
        ids = torch.zeros(B, Q, dtype=torch.long)
        pos = torch.zeros(B, Q, dtype=torch.long)
        visible = torch.eye(Q, dtype=torch.bool).repeat(B, 1, 1)  # padding rows see themselves (no NaN)
        rows = torch.zeros(B, R, dtype=torch.long)
        row_labels = torch.full((B, R), IGNORE_INDEX, dtype=torch.long)
        depth = torch.zeros(B, R, dtype=torch.long)
        with_hidden = hiddens[0] is not None
        if with_hidden:
            H = hiddens[0].shape[-1]
            prev_h = torch.zeros(B, Q, H, dtype=self.dtype)
            teacher = torch.zeros(B, R, H, dtype=self.dtype)
        for b, lay in enumerate(layouts):
            q, r = lay["input_ids"].shape[0], lay["rows"].shape[0]
            ids[b, :q], pos[b, :q] = lay["input_ids"], lay["position_ids"]
            visible[b, :q, :q] = lay["visible"]
            rows[b, :r], row_labels[b, :r], depth[b, :r] = lay["rows"], lay["row_labels"], lay["depth"]
            if with_hidden:
                h = hiddens[b].to(self.dtype)
                pi = lay["prev_index"]
                prev_h[b, :q][pi >= 0] = h[pi[pi >= 0]]
                tp = lay["teacher_pos"]
                teacher[b, :r][tp >= 0] = h[tp[tp >= 0]]
        mask = torch.zeros(B, 1, Q, Q, dtype=self.dtype).masked_fill_(~visible[:, None], torch.finfo(self.dtype).min)
        batch = {
            "input_ids": ids,
            "position_ids": pos,
            "attention_mask": mask,
            "logits_rows": rows,
            "row_labels": row_labels,
            "depth": depth,
        }
        if with_hidden:
            batch["target_hidden_states"] = prev_h
            batch["teacher_hidden"] = teacher
        return batch


class ParallelDrafterTrainer(DrafterTrainer):
    """Trains the drafter's layer, norm, [MASK] embeddings (and fusion layer); the shared target embeddings and
    ``lm_head`` are frozen and not parameters of the drafter."""

    def __init__(self, *args, decay: float = MASK_LOSS_DECAY, distill_weight: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.decay, self.distill_weight = decay, distill_weight

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "learning_rate" in logs and self.optimizer is not None:  # the rate in use (a TimeBudgetCallback may set it)
            logs["learning_rate"] = self.optimizer.param_groups[0]["lr"]
        super().log(logs, *args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        use_h = model.config.use_target_hidden_states
        outputs = model(
            inputs["input_ids"],
            position_ids=inputs["position_ids"],
            attention_mask=inputs["attention_mask"],
            target_hidden_states=inputs.get("target_hidden_states") if use_h else None,
            logits_rows=inputs["logits_rows"],
        )
        teacher = None
        if self.distill_weight > 0:
            with torch.no_grad():
                teacher = model.project(inputs["teacher_hidden"])
        per_depth = parallel_depth_losses(
            outputs.logits,
            inputs["row_labels"],
            inputs["depth"],
            model.config.num_mask_tokens + 1,
            teacher,
            self.distill_weight,
        )
        loss = parallel_loss(per_depth, self.decay)
        self.record_parts({f"loss_depth{d}": v.detach() for d, v in enumerate(per_depth)})
        return (loss, outputs) if return_outputs else loss


@torch.no_grad()
def depth_accuracies(
    drafter, states, top: int = 10, groups_per_sequence: int = 128, seed: int = 0
) -> list[list[float]]:
    """``acc[d][i]``: share of held-out groups where the i-th ranked token of distribution d (the token at depth
    d + 1 after the anchor) is the label; ``groups_per_sequence`` anchors per held-out sequence."""
    k = drafter.config.num_mask_tokens
    collate = ParallelGroupCollator(k, drafter.config.vocab_size, groups_per_sequence, seed)
    dataset = ParallelGroupDataset(states, with_hidden=drafter.config.use_target_hidden_states)
    hits = torch.zeros(k + 1, top, dtype=torch.float64)
    counts = torch.zeros(k + 1, dtype=torch.float64)
    was_training = drafter.training
    drafter.eval()
    device = drafter.mask_embeddings.weight.device  # the batches are built on the CPU; the counts stay there
    for i in range(len(dataset)):
        batch = collate([dataset[i]])
        hidden = batch.get("target_hidden_states")
        out = drafter(
            batch["input_ids"].to(device),
            position_ids=batch["position_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device=device, dtype=drafter.dtype),
            target_hidden_states=hidden.to(device) if hidden is not None else None,
            logits_rows=batch["logits_rows"].to(device),
        )
        ranked = torch.topk(out.logits[0].float(), top, dim=-1).indices.cpu()
        y, d = batch["row_labels"][0], batch["depth"][0]
        valid = y != IGNORE_INDEX
        match = (ranked == y[:, None]) & valid[:, None]
        hits.index_add_(0, d, match.double())
        counts.index_add_(0, d, valid.double())
    drafter.train(was_training)
    return (hits / counts.clamp_min(1)[:, None]).tolist()


def calibrate_tree(drafter, states, num_nodes: int = 12, top: int = 10):
    """Medusa Sec. 2.3.3 applied to the k + 1 distributions: measure held-out top-i accuracies, build the tree
    of ``num_nodes`` with the largest expected acceptance length and store it in ``drafter.config``
    (`TreeDrafterConfig.calibrate`)."""
    return drafter.config.calibrate(depth_accuracies(drafter, states, top=top), num_nodes, "depth_top_i_accuracy")


class ParallelCurveCallback(LearningCurveCallback):
    """The drafter's learning curve (`LearningCurveCallback`): per-depth top-1 accuracy against groups trained on
    (``tokens_per_step``)."""

    seen_key, top1_key = "train_groups", "depth_top1"
    per_step_key, default_num_nodes, default_num_points, default_per_step = "tokens_per_step", 12, 4, 0.0

    def accuracies(self) -> list[list[float]]:
        return depth_accuracies(self.model, self.held_out, groups_per_sequence=48)


def train_parallel_drafter(
    drafter,
    train_states,
    output_dir: str,
    groups_per_sequence: int = 64,
    distill_weight: float = 0.0,
    decay: float = MASK_LOSS_DECAY,
    **training,
):
    """Train ``drafter`` (a `ParallelDrafter` attached to its target) on cached target states; returns the Trainer.
    ``groups_per_sequence`` mask groups per sequence, ``decay`` the per-depth loss weight, ``distill_weight`` the
    hidden-state distillation term. ``training``: the schedule (`hf_speculative.training.trainer.TRAINING_DEFAULTS`;
    here learning rate 5e-4); ``time_budget`` (seconds) stops it, the learning rate annealed over the budget."""
    training = training_settings(training, learning_rate=5e-4)
    with_hidden = drafter.config.use_target_hidden_states or distill_weight > 0
    dataset = ParallelGroupDataset(train_states, with_hidden=with_hidden)
    collator = ParallelGroupCollator(
        drafter.config.num_mask_tokens, drafter.config.vocab_size, groups_per_sequence, training["seed"]
    )
    return train_drafter(
        ParallelDrafterTrainer,
        drafter,
        dataset,
        collator,
        output_dir,
        trainer_kwargs={"decay": decay, "distill_weight": distill_weight},
        **training,
    )
