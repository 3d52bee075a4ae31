"""Medusa-2: joint training of the Medusa heads and the backbone (Cai et al., 2024, Sec. 2.2.2 and 2.3.2).

The backbone gets LoRA adapters (PEFT); the loss is

    L = L_LM + lambda_0(step) * L_Medusa,      L_Medusa = sum_k 0.8**k CE(head_k(h_t), x_{t+k+2})

where ``h_t`` is now the *adapted* backbone's final hidden state, so the backbone learns to serve the heads
while ``L_LM`` keeps its own next-token predictions in place. Three ingredients of the paper:

* **Combined loss** with ``lambda_0`` weighting the heads against the backbone's own loss (`medusa2_loss`).
* **Different learning rates**: the heads train at ``heads_lr_ratio`` (default 4) times the LoRA learning rate,
  through two optimizer parameter groups (`Medusa2Trainer.create_optimizer`).
* **Heads warm-up**: start from trained Medusa-1 heads (``init_heads``), and/or let ``lambda_0`` rise from 0
  to its final value over the first ``warmup`` share of the steps (`lambda0_schedule`: ``"linear"`` or
  ``"sine"`` (``lambda_0 * sin(pi/2 * s)``, ``s = step / warmup_steps`` clipped to 1), or ``"constant"``),
  so random heads do not pull the backbone around at the start.

**Self-distillation** (Sec. 2.3.2): on self-distilled data the backbone's loss is
``KL(p_original || p)``, with ``p_original`` the same network with its LoRA adapter disabled (peft's
``disable_adapter()``), so no second model is held in memory. ``lm_loss="kl"`` replaces the cross entropy by
it, ``"ce+kl"`` adds it, ``"ce"`` is plain next-token cross entropy. With the LoRA ``B`` matrices at their
zero init the adapted model *is* the original one and the KL term starts at exactly 0.

The result is a CHANGED model: greedy decoding with the heads reproduces the *fine-tuned* model's greedy output
(base + adapter, kept or merged with ``merge_and_unload``), not the base model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ...paths import write_atomically
from ...training.trainer import DrafterTrainer, train_drafter, training_settings
from .training_medusa import IGNORE_INDEX, MEDUSA_DECAY, medusa_head_losses

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "lambda0_schedule",
    "Lambda0Schedule",
    "medusa2_head_labels",
    "next_token_loss",
    "self_distillation_kl",
    "Medusa2Loss",
    "Medusa2Model",
    "medusa2_loss",
    "Medusa2Dataset",
    "Medusa2Collator",
    "Medusa2Trainer",
    "evaluate_lm_loss",
    "add_lora",
    "train_medusa2",
    "Medusa2Run",
    "fit_medusa2",
    "calibrate_adapted_tree",
    "save_medusa2",
    "load_medusa2",
]

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
ADAPTER_SUBFOLDER = "adapter"
ADAPTER_README = """---
base_model: {base}
library_name: peft
tags:
- lora
- medusa-2
- hf_speculative
---

LoRA adapter of a Medusa-2 model (trained jointly with the Medusa heads in the parent folder); see ../README.md.
"""


def lambda0_schedule(
    step: int, total_steps: int, lambda0: float = 0.2, warmup: float = 0.0, kind: str = "sine"
) -> float:
    """``lambda_0`` at optimizer step ``step`` (0-based) of ``total_steps``.

    ``warmup``: the share of ``total_steps`` (if < 1) or the number of steps (if >= 1) over which ``lambda_0``
    rises from 0 to its final value; ``kind``: ``"constant"`` (no warm-up), ``"linear"`` (``lambda0 * s``) or
    ``"sine"`` (``lambda0 * sin(pi/2 * s)``), ``s = min(1, step / warmup_steps)``.
    """
    if kind not in ("constant", "linear", "sine"):
        raise ValueError(f"lambda0 schedule must be constant, linear or sine, got {kind!r}")
    warmup_steps = warmup * total_steps if warmup < 1 else warmup
    if kind == "constant" or warmup_steps <= 0:
        return lambda0
    s = min(1.0, step / warmup_steps)
    return lambda0 * (s if kind == "linear" else math.sin(0.5 * math.pi * s))


@dataclass(frozen=True)
class Lambda0Schedule:
    """The ``lambda_0`` schedule of the joint loss (Medusa 2.2.2): ``lambda0`` reached after ``warmup`` with a
    ``kind`` rise (`lambda0_schedule`)."""

    lambda0: float = 0.2
    warmup: float = 0.0
    kind: str = "sine"

    def __call__(self, step: int, total_steps: int) -> float:
        return lambda0_schedule(step, total_steps, self.lambda0, self.warmup, self.kind)


def medusa2_head_labels(labels: torch.LongTensor, num_heads: int) -> torch.LongTensor:
    """``(B, T)`` token labels -> ``(B, T, K)`` head labels ``[b, t, k] = labels[b, t + k + 2]`` (``-100`` past
    the end). Rows are right-padded with ``-100``, so padding never becomes a target."""
    B, T = labels.shape
    out = labels.new_full((B, T, num_heads), IGNORE_INDEX)
    for k in range(num_heads):
        if T > k + 2:
            out[:, : T - k - 2, k] = labels[:, k + 2 :]
    return out


def _next_token_mask(labels: torch.LongTensor) -> torch.Tensor:
    """``(B, T-1)``: positions ``t`` whose next token ``labels[t+1]`` is a training target."""
    return labels[:, 1:] != IGNORE_INDEX


def next_token_loss(logits: torch.Tensor, labels: torch.LongTensor) -> torch.Tensor:
    """Mean next-token cross entropy ``CE(logits[t], labels[t+1])`` over the target positions (``L_LM``)."""
    mask = _next_token_mask(labels)
    if not bool(mask.any()):
        return logits.new_zeros(())
    return F.cross_entropy(logits[:, :-1][mask].float(), labels[:, 1:][mask])


def self_distillation_kl(logits: torch.Tensor, original_logits: torch.Tensor, labels: torch.LongTensor) -> torch.Tensor:
    """Mean over target positions of ``KL(p_original || p) = sum_v p_orig (log p_orig - log p)`` (Medusa 2.3.2)."""
    mask = _next_token_mask(labels)
    if not bool(mask.any()):
        return logits.new_zeros(())
    logp = F.log_softmax(logits[:, :-1][mask].float(), dim=-1)
    logq = F.log_softmax(original_logits[:, :-1][mask].float(), dim=-1)
    return (logq.exp() * (logq - logp)).sum(-1).mean()


@dataclass
class Medusa2Loss:
    """The total loss and its parts (``lm``: CE, ``kl``: self-distillation, ``medusa``: ``sum_k 0.8^k CE_k``)."""

    loss: torch.Tensor
    lm: torch.Tensor | None
    kl: torch.Tensor | None
    medusa: torch.Tensor
    per_head: torch.Tensor
    lambda0: float


class Medusa2Model(nn.Module):
    """A PEFT (LoRA) causal LM and its Medusa heads, trained together. The heads read the adapted backbone's
    final hidden state and share its frozen ``lm_head``."""

    def __init__(self, backbone, heads):
        super().__init__()
        self.backbone = backbone  # a peft.PeftModel around the causal LM
        self.heads = heads
        heads.attach_base_model(backbone.get_base_model())
        self.config = heads.config  # what Trainer looks at

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False
        )
        return out

    def original_logits(self, input_ids, attention_mask=None) -> torch.Tensor:
        """The logits of the same network with its adapter disabled: the original model (no gradient)."""
        with torch.no_grad(), self.backbone.disable_adapter():
            return self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def medusa2_loss(
    model: Medusa2Model,
    input_ids: torch.LongTensor,
    labels: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    lambda0: float = 0.2,
    lm_loss: str = "kl",
    decay: float = MEDUSA_DECAY,
    max_head_positions: int | None = None,
) -> Medusa2Loss:
    """``L = L_LM + lambda0 * L_Medusa`` on one batch (``labels``: ``-100`` outside the answers).

    ``lm_loss``: ``"ce"`` (``L_LM`` = next-token CE), ``"kl"`` (``L_LM`` = ``KL(p_original || p)``, Medusa 2.3.2)
    or ``"ce+kl"`` (their sum). The heads see only positions with at least one head target; with
    ``max_head_positions`` a random subset of that many per batch (the K vocabulary projections of every
    position cost ~K times the backbone's own ``lm_head``, the dominant cost of a CPU step).
    """
    if lm_loss not in ("ce", "kl", "ce+kl"):
        raise ValueError(f"lm_loss must be 'ce', 'kl' or 'ce+kl', got {lm_loss!r}")
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    lm = next_token_loss(out.logits, labels) if "ce" in lm_loss else None
    kl = None
    if "kl" in lm_loss:
        kl = self_distillation_kl(out.logits, model.original_logits(input_ids, attention_mask), labels)
    K = model.heads.config.num_heads
    head_labels = medusa2_head_labels(labels, K)
    keep = (head_labels != IGNORE_INDEX).any(-1).flatten().nonzero().squeeze(-1)
    if max_head_positions is not None and keep.numel() > max_head_positions:
        keep = keep[torch.randperm(keep.numel(), device=keep.device)[:max_head_positions]].sort().values
    hidden = out.hidden_states[-1].flatten(0, 1)[keep]  # (N, H): the final (post-norm) states the lm_head consumes
    per_head = medusa_head_losses(model.heads(hidden).logits, head_labels.flatten(0, 1)[keep])
    weights = decay ** torch.arange(K, dtype=per_head.dtype, device=per_head.device)
    medusa = (weights * per_head).sum()
    total = lambda0 * medusa
    for part in (lm, kl):
        if part is not None:
            total = total + part
    return Medusa2Loss(loss=total, lm=lm, kl=kl, medusa=medusa, per_head=per_head, lambda0=lambda0)


class Medusa2Dataset(Dataset):
    """Tokenized conversations ``{"input_ids", "labels"}`` (labels only on the assistant answer), the same
    encoding as the Medusa-1 hidden-state cache (`extract_hidden_states`)."""

    def __init__(self, tokenizer, records, max_length: int = 512):
        from ...training.data import tokenize_conversation

        self.examples = []
        for r in records:
            if not r.answers:
                continue
            msgs = r.conversation(num_turns=len(r.answers)) + [{"role": "assistant", "content": r.answers[-1]}]
            enc = tokenize_conversation(tokenizer, msgs, max_length=max_length)
            if len(enc["input_ids"]) < 3 or all(y == IGNORE_INDEX for y in enc["labels"]):
                continue
            self.examples.append({"input_ids": torch.tensor(enc["input_ids"]), "labels": torch.tensor(enc["labels"])})

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return self.examples[i]

    @property
    def num_answer_tokens(self) -> int:
        return sum(int((e["labels"] != IGNORE_INDEX).sum()) for e in self.examples)


@dataclass
class Medusa2Collator:
    """Right-pads ``input_ids`` (with ``pad_token_id``), ``labels`` (with -100) and builds ``attention_mask``."""

    pad_token_id: int = 0

    def __call__(self, features: Sequence[dict]) -> dict:
        T = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), T), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(features), T), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(features), T), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = f["input_ids"], f["labels"], 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class Medusa2Trainer(DrafterTrainer):
    """`Trainer` for a `Medusa2Model`: the combined loss with the scheduled ``lambda_0``, and two parameter
    groups, LoRA at ``learning_rate`` and the heads at ``heads_lr_ratio * learning_rate`` (Medusa 2.2.2)."""

    def __init__(
        self,
        *args,
        schedule: Lambda0Schedule | None = None,
        heads_lr_ratio: float = 4.0,
        lm_loss: str = "kl",
        decay: float = MEDUSA_DECAY,
        max_head_positions: int | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.schedule = schedule or Lambda0Schedule()
        self.heads_lr_ratio, self.lm_loss, self.decay = heads_lr_ratio, lm_loss, decay
        self.max_head_positions = max_head_positions

    def current_lambda0(self) -> float:
        return self.schedule(self.state.global_step, max(1, self.state.max_steps))

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            opt_model = self.model if model is None else model
            lora = [p for p in opt_model.backbone.parameters() if p.requires_grad]
            heads = [p for p in opt_model.heads.parameters() if p.requires_grad]
            optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            lr = kwargs.pop("lr", self.args.learning_rate)
            groups = [
                {"params": lora, "lr": lr, "weight_decay": self.args.weight_decay, "name": "backbone_lora"},
                {"params": heads, "lr": lr * self.heads_lr_ratio, "weight_decay": 0.0, "name": "medusa_heads"},
            ]
            self.optimizer = optimizer_cls(groups, lr=lr, **kwargs)
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        res = medusa2_loss(
            model,
            inputs["input_ids"],
            inputs["labels"],
            inputs.get("attention_mask"),
            lambda0=self.current_lambda0(),
            lm_loss=self.lm_loss,
            decay=self.decay,
            max_head_positions=self.max_head_positions,
        )
        parts = {"loss_medusa": res.medusa.detach(), "lambda0": torch.tensor(res.lambda0)}
        parts.update({f"loss_head{k}": v.detach() for k, v in enumerate(res.per_head)})
        if res.lm is not None:
            parts["loss_lm_ce"] = res.lm.detach()
        if res.kl is not None:
            parts["loss_lm_kl"] = res.kl.detach()
        self.record_parts(parts)
        return (res.loss, res) if return_outputs else res.loss


@torch.no_grad()
def evaluate_lm_loss(peft_model, dataset: Dataset, adapter: bool = True) -> float:
    """Token-weighted mean next-token cross entropy over ``dataset``'s answers, with the LoRA adapter on
    (the Medusa-2 model) or disabled (the base model)."""
    was_training = peft_model.training
    peft_model.eval()
    total, count = 0.0, 0
    ctx = peft_model.disable_adapter if not adapter else _no_context
    with ctx():
        for ex in dataset:
            ids, labels = ex["input_ids"][None], ex["labels"][None]
            n = int(_next_token_mask(labels).sum())
            if n:
                logits = peft_model(input_ids=ids.to(peft_model.device), use_cache=False).logits.cpu()
                total += float(next_token_loss(logits, labels)) * n
                count += n
    peft_model.train(was_training)
    return total / max(1, count)


def _no_context():
    from contextlib import nullcontext

    return nullcontext()


def add_lora(
    model, r: int = 8, alpha: int = 16, dropout: float = 0.0, target_modules: Sequence[str] = DEFAULT_LORA_TARGETS
):
    """Wrap ``model`` in a PEFT LoRA model (only the adapters train; ``B = 0`` at init)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)


def train_medusa2(
    model: Medusa2Model,
    dataset: Dataset,
    output_dir: str,
    heads_lr_ratio: float = 4.0,
    schedule: Lambda0Schedule = Lambda0Schedule(),
    lm_loss: str = "kl",
    max_head_positions: int | None = None,
    pad_token_id: int = 0,
    **training,
) -> Medusa2Trainer:
    """Jointly train the LoRA backbone and the heads of ``model`` on ``dataset`` (`Medusa2Dataset`): the heads at
    ``heads_lr_ratio`` times the LoRA learning rate, ``lambda_0`` rising per ``schedule``, the backbone's loss
    ``lm_loss``. ``training``: the schedule (`hf_speculative.training.trainer.TRAINING_DEFAULTS`; here learning rate
    2e-4, batch 1 conversation); ``time_budget`` stops it (the cosine schedule kept); ``save_steps`` / ``resume``:
    resumable checkpoints in ``output_dir`` (`train_resumable`)."""
    training = training_settings(training, learning_rate=2e-4, batch_size=1)
    trainer_kwargs = {
        "schedule": schedule,
        "heads_lr_ratio": heads_lr_ratio,
        "lm_loss": lm_loss,
        "max_head_positions": max_head_positions,
    }
    return train_drafter(
        Medusa2Trainer,
        model,
        dataset,
        Medusa2Collator(pad_token_id),
        output_dir,
        anneal=False,
        trainer_kwargs=trainer_kwargs,
        **training,
    )


@dataclass
class Medusa2Run:
    """What `fit_medusa2` trained: the joint model, its PEFT backbone, the training set, the Trainer, seconds."""

    joint: Medusa2Model
    peft_model: nn.Module
    dataset: "Medusa2Dataset"
    trainer: Medusa2Trainer
    seconds: float


def fit_medusa2(
    model,
    heads,
    tokenizer,
    records,
    output_dir: str,
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    lora_targets: Sequence[str] = DEFAULT_LORA_TARGETS,
    max_length: int = 1024,
    **training,
) -> Medusa2Run:
    """Medusa-2 end to end (Sec. 2.2.2): LoRA on ``model`` (`add_lora`), ``heads`` on the adapted backbone
    (`Medusa2Model`), the conversations ``records`` (`Medusa2Dataset`), `train_medusa2` with ``training`` (its
    keyword arguments; the tokenizer's pad id is the collator's)."""
    import time

    peft_model = add_lora(model, r=lora_r, alpha=lora_alpha, dropout=lora_dropout, target_modules=lora_targets)
    joint = Medusa2Model(peft_model, heads)
    dataset = Medusa2Dataset(tokenizer, records, max_length=max_length)
    t0 = time.perf_counter()
    trainer = train_medusa2(joint, dataset, output_dir, pad_token_id=tokenizer.pad_token_id or 0, **training)
    return Medusa2Run(joint, peft_model, dataset, trainer, time.perf_counter() - t0)


def calibrate_adapted_tree(
    run: Medusa2Run, tokenizer, records, max_length: int = 1024, num_nodes: int = 32, progress: bool = False
):
    """The heads' tree calibrated on the *adapted* backbone's final states over held-out ``records``
    (`tree_calibration.calibrate_tree`: into ``heads.config``); returns the tree."""
    from ...training.trainer import extract_hidden_states
    from .tree_calibration import calibrate_tree

    states = extract_hidden_states(
        run.peft_model.get_base_model(), tokenizer, records, max_length=max_length, cache=False, progress=progress
    )
    return calibrate_tree(run.joint.heads, states, num_nodes=num_nodes)


def save_medusa2(model: Medusa2Model, folder) -> Path:
    """The heads (config.json + model.safetensors) and the LoRA adapter (``adapter/``, PEFT format) in one folder;
    the heads' config records that their base is the base model + this adapter (``base_adapter``)."""
    folder = Path(folder)
    base_name = model.heads.config.base_model_name_or_path
    if base_name:  # the Hub id rather than a local cache path
        for cfg in model.backbone.peft_config.values():
            cfg.base_model_name_or_path = base_name
    model.backbone.save_pretrained(folder / ADAPTER_SUBFOLDER)
    write_atomically(
        folder / ADAPTER_SUBFOLDER / "README.md", ADAPTER_README.format(base=base_name or "the base model")
    )
    model.heads.config.base_adapter = ADAPTER_SUBFOLDER
    model.heads.save_pretrained(folder)
    return folder


def load_medusa2(folder, base_model, merge: bool = True):
    """``(model, heads)`` from a `save_medusa2` folder: ``base_model`` with the folder's adapter (merged into the
    weights with ``merge_and_unload`` unless ``merge=False``, then a `PeftModel`) and the heads attached to it."""
    from peft import PeftModel

    from .modeling_medusa import MedusaHeadsModel

    folder = Path(folder)
    heads = MedusaHeadsModel.from_pretrained(folder)
    sub = getattr(heads.config, "base_adapter", None) or ADAPTER_SUBFOLDER
    model = PeftModel.from_pretrained(base_model, str(folder / sub))
    model = model.merge_and_unload() if merge else model
    target = model if merge else model.get_base_model()
    heads.attach_base_model(target)
    return model.eval(), heads.to(target.device).eval()
