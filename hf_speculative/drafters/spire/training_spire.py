"""Training a `SpireDrafter` on target-labelled data (SPIRe Sec. 3.3-3.4): the target's activations at the drafter's
``target_layers`` and its top-k log-probabilities, computed once (`hf_speculative.training.labelling`).

A chunk of a conversation is trained with ``k`` passes (`SpireDrafter.forward`): row r of block ``[b k, b k + k)``
is drafted as depth ``r - b k`` of a step rooted at row ``b k``, with the target's activations as memory before its
block and the drafter's feedback memory inside it, exactly as `SpireTreeDrafter` drafts. A chunk cut from the middle
of a conversation gets the conversation's first S rows (the attention sinks) in front, as memory only.

The loss is SPIRe's MixedLoss (Sec. 3.4) against the target's next-token distribution p at every row:

    MixedLoss(omega) = omega * KD(p || q) + (1 - omega) * (-alpha),   alpha = sum_x min(p(x), q(x)),

alpha being the expected acceptance of one drafted token. p is known on the stored top-k (the labelling keeps the
target's k most likely tokens): KD is the cross-entropy to p renormalized over them (`kd_loss`), alpha sums over
them (a lower bound of the full sum, exact where p has no mass outside the top-k).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import Dataset

from ...training.losses import kd_loss
from ...training.trainer import DrafterTrainer, HiddenStates, train_drafter, training_settings
from .modeling_spire import SpireDrafter

__all__ = [
    "SpireDataset",
    "SpireCollator",
    "SpireTrainer",
    "mixed_loss",
    "spire_loss",
    "train_spire",
    "depth_accuracies",
]


def mixed_loss(
    student_logits: torch.Tensor,
    topk_ids: torch.LongTensor,
    topk_logprobs: torch.Tensor,
    omega: float = 0.5,
    vocab_index: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SPIRe's MixedLoss (Sec. 3.4) over rows ``(M, V_s)`` of student logits and the teacher's top-k ``(M, k)``:
    ``omega * KD - (1 - omega) * alpha``, averaged over rows. ``vocab_index (V,)``: a student over a draft
    vocabulary (the draft index of every target id, -1 where missing: q is 0 there). Returns the loss and its
    parts ``{"kd", "alpha"}`` (detached)."""
    kd = kd_loss(student_logits, topk_ids, topk_logprobs, vocab_index=vocab_index)
    q = torch.softmax(student_logits.float(), dim=-1)
    ids = topk_ids.long()
    p = topk_logprobs.float().exp()
    if vocab_index is not None:
        ids = vocab_index.to(ids.device)[ids]
        p = p * (ids >= 0)
        ids = ids.clamp_min(0)
    alpha = torch.minimum(p, q.gather(-1, ids)).sum(-1).mean() if q.shape[0] else q.sum() * 0.0
    loss = omega * kd - (1.0 - omega) * alpha
    return loss, {"kd": kd.detach(), "alpha": alpha.detach()}


class SpireDataset(Dataset):
    """Conversations of labelled states cut into chunks of at most ``max_length`` rows. An item: ``input_ids (T,)``,
    ``memory (n, T, H)`` (the target's activations at the drafter's ``target_layers``), ``position_ids (T,)`` (in
    the conversation), ``predict (T,)`` (row t's teacher predicts an answer token, and row t is not a sink prefix
    row), ``topk_ids`` / ``topk_logprobs (T, k)``. Every item starts with its conversation's first ``sinks`` rows."""

    def __init__(self, states: HiddenStates, target_layers: Sequence[int], sinks: int = 1, max_length: int = 512):
        if not states.has_teacher:
            raise ValueError("SPIRe training needs target-labelled states (topk_ids, topk_logprobs)")
        layers = states.layers or {}
        missing = [i for i in target_layers if i not in layers]
        if missing:
            raise KeyError(
                f"the labelled data lacks the target layers {missing} (it has {sorted(layers)}): label them "
                "with `hf-speculative label --layers ...` or build the drafter from layers the data has"
            )
        self.states, self.sinks = states, int(sinks)
        self.memory = [layers[int(i)] for i in target_layers]
        self.spans: list[
            tuple[int, int, int, int]
        ] = []  # (conversation start, chunk start, chunk end, conversation end)
        offsets = states.offsets.tolist()
        step = max(max_length - self.sinks, 1)
        for s, e in zip(offsets[:-1], offsets[1:]):
            first = s + self.sinks
            for a in range(first, e - 1, step):
                self.spans.append((s, a, min(a + step, e), e))

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> dict:
        s, a, b, e = self.spans[i]
        st = self.states
        rows = torch.cat([torch.arange(s, s + self.sinks), torch.arange(a, b)])
        labels = st.labels
        nxt = (rows + 1).clamp_max(labels.shape[0] - 1)
        predict = (labels[nxt] != -100) & (rows + 1 < e)
        predict[: self.sinks] = False
        return {
            "input_ids": st.input_ids[rows],
            "memory": torch.stack([m[rows] for m in self.memory]),
            "position_ids": rows - s,
            "predict": predict,
            "topk_ids": st.topk_ids[rows].long(),
            "topk_logprobs": st.topk_logprobs[rows],
        }


class SpireCollator:
    """Right-pads a batch of `SpireDataset` items (padded rows never predict; their positions go on counting)."""

    def __call__(self, items: list[dict]) -> dict:
        T = max(x["input_ids"].shape[0] for x in items)
        out: dict[str, list] = {key: [] for key in items[0]}
        for x in items:
            pad = T - x["input_ids"].shape[0]
            for key, t in x.items():
                if pad:
                    if key == "memory":
                        t = torch.cat([t, t.new_zeros(t.shape[0], pad, t.shape[2])], 1)
                    elif key == "position_ids":
                        t = torch.cat([t, t[-1] + torch.arange(1, pad + 1)])
                    else:
                        t = torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])
                out[key].append(t)
        return {key: torch.stack(v) for key, v in out.items()}


def _vocab_index(drafter: SpireDrafter) -> torch.LongTensor | None:
    if drafter.draft_to_target is None:
        return None
    index = torch.full((drafter.config.vocab_size,), -1, dtype=torch.long)
    index[drafter.draft_to_target.cpu()] = torch.arange(drafter.draft_to_target.shape[0])
    return index


def _forward(drafter: SpireDrafter, batch: dict, sinks: int) -> torch.Tensor:
    dtype = drafter.norm.weight.dtype
    memory = [m.to(dtype) for m in batch["memory"].unbind(1)]
    return drafter(batch["input_ids"], memory, position_ids=batch["position_ids"], prefix_rows=sinks).hidden_states


def spire_loss(
    drafter: SpireDrafter,
    batch: dict,
    omega: float | None = None,
    vocab_index: torch.LongTensor | None = None,
    sinks: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MixedLoss of one `SpireCollator` batch through the k-pass training forward (logits over the draft vocabulary)."""
    omega = drafter.config.mixed_loss_omega if omega is None else omega
    sinks = drafter.config.num_sink_tokens if sinks is None else sinks
    hidden = _forward(drafter, batch, sinks)
    predict = batch["predict"]
    logits = drafter.compute_logits(hidden[predict], full_vocab=False)
    return mixed_loss(logits, batch["topk_ids"][predict], batch["topk_logprobs"][predict], omega, vocab_index)


@torch.no_grad()
def depth_accuracies(
    drafter: SpireDrafter, dataset: SpireDataset, top: int = 4, max_items: int = 64
) -> list[list[float]]:
    """Held-out acceptance of the training forward: per drafting depth d (row ``b k + d`` of a block), the share of
    rows whose target greedy token is among the drafter's top-1..top-``top`` (``[depth][i]``). With teacher forcing
    inside the block, this is the chance that depth d + 1 is accepted given the chain up to d was."""
    k, sinks = drafter.config.num_draft_tokens, dataset.sinks
    hits = torch.zeros(k, top)
    counts = torch.zeros(k)
    collate = SpireCollator()
    device = drafter.norm.weight.device  # the batches are built on the CPU; the counts stay there
    for i in range(min(len(dataset), max_items)):
        batch = collate([dataset[i]])
        inputs = {key: batch[key].to(device) for key in ("input_ids", "memory", "position_ids")}
        hidden = _forward(drafter, inputs, sinks)[0]
        logits = drafter.compute_logits(hidden, full_vocab=True)
        ranked = logits.topk(top, dim=-1).indices.cpu()
        target = batch["topk_ids"][0, :, 0]
        found = (ranked == target[:, None]).cumsum(-1).clamp_max(1).float()
        depth = (torch.arange(hidden.shape[0]) - sinks) % k
        rows = batch["predict"][0]
        for d in range(k):
            sel = rows & (depth == d)
            hits[d] += found[sel].sum(0)
            counts[d] += sel.sum()
    return (hits / counts.clamp_min(1)[:, None]).tolist()


class SpireTrainer(DrafterTrainer):
    """`DrafterTrainer` with `spire_loss` (MixedLoss over the draft vocabulary)."""

    def __init__(self, *args, omega: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.omega = omega
        self.vocab_index = _vocab_index(self.model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, parts = spire_loss(model, inputs, self.omega, self.vocab_index)
        self.record_parts(parts)
        return (loss, {"loss": loss}) if return_outputs else loss


def train_spire(
    drafter: SpireDrafter,
    states: HiddenStates,
    output_dir: str,
    max_length: int = 512,
    **training,
) -> SpireTrainer:
    """Train ``drafter`` (attached to its target) on labelled ``states`` with the `SpireTrainer` (MixedLoss with the
    config's ``mixed_loss_omega``). ``training``: the arguments of `train_eagle`'s ``training`` (``time_budget``
    seconds stop it early, with a cosine over the budget); defaults `TRAINING_DEFAULTS`, 10 warm-up steps. Returns
    the trainer."""
    drafter._require_base()
    for p in (drafter.base_embeddings.weight, drafter.base_lm_head.weight):
        p.requires_grad_(False)
    dataset = SpireDataset(states, drafter.config.target_layers, drafter.config.num_sink_tokens, max_length)
    return train_drafter(
        SpireTrainer,
        drafter,
        dataset,
        SpireCollator(),
        output_dir,
        **training_settings(training, warmup_steps=10),
    )
