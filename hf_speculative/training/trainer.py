"""What drafter training shares: the target's final hidden states, computed once and cached, and a
`Trainer` base that logs the components of a drafter's loss.

Drafters that read the target's hidden states (Medusa heads and the like) train on a frozen backbone, so the
backbone runs once over the training data; its final hidden states go to a safetensors file under
``$HF_SPECULATIVE_CACHE/hidden_states/`` (default ``~/.cache/hf_speculative``), keyed by the model, the data
and the settings (one file per conversation), and every later epoch or run reads them back in seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from transformers import Trainer
from transformers.utils import logging

from ..paths import atomic_path, cache_root, model_key
from .data import Record, tokenize_conversation

__all__ = [
    "HiddenStates",
    "encode_record",
    "cached_states",
    "extract_hidden_states",
    "hidden_state_cache_dir",
    "DrafterTrainer",
    "drafter_training_args",
    "planned_steps",
    "TRAINING_DEFAULTS",
    "training_settings",
    "train_drafter",
    "train_resumable",
]

logger = logging.get_logger(__name__)

TRAINABLE_CHECKPOINT = "trainable.safetensors"  # a DrafterTrainer checkpoint's weights: the trainable tensors only


@dataclass
class HiddenStates:
    """The final hidden states of a set of conversations, flattened.

    ``hidden`` ``(N, H)`` (fp16 on disk), ``input_ids`` and ``labels`` ``(N,)`` (``labels`` is ``-100`` outside
    assistant turns), sequence ``i`` spanning ``offsets[i]:offsets[i + 1]``; ``ids`` the record ids.

    Target-labelled data (``hf_speculative.training.labelling``) adds the teacher: ``topk_ids`` and
    ``topk_logprobs`` ``(N, k)``, row t being the target's next-token distribution after tokens ``..t`` (it
    predicts token t + 1, as ``logits[t]`` does), and ``layers``: other layers' states ``(N, H)`` keyed by their
    index in ``output_hidden_states`` (0 = embeddings, ``num_hidden_layers`` = the post-norm final state, which
    is ``hidden``).
    """

    hidden: torch.Tensor
    input_ids: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    ids: list[str]
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None
    layers: dict[int, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def select(self, indices: Sequence[int]) -> "HiddenStates":
        """The sequences ``indices`` (e.g. a held-out split)."""
        spans, offsets = [], [0]
        for i in indices:
            s, e = int(self.offsets[i]), int(self.offsets[i + 1])
            spans.append((s, e))
            offsets.append(offsets[-1] + e - s)

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or t.numel() == 0:
                return t
            return torch.cat([t[s:e] for s, e in spans]) if spans else t[:0]

        return HiddenStates(
            take(self.hidden),
            take(self.input_ids),
            take(self.labels),
            torch.tensor(offsets),
            [self.ids[i] for i in indices],
            take(self.topk_ids),
            take(self.topk_logprobs),
            None if self.layers is None else {k: take(v) for k, v in self.layers.items()},
        )

    @classmethod
    def concat(cls, parts: Sequence["HiddenStates"], release: bool = False) -> "HiddenStates":
        """One `HiddenStates` holding the sequences of ``parts`` in order (teacher and extra layers only when every
        part has them). ``release``: the parts give up each tensor once it is joined (they are emptied), so the
        peak is the states plus one tensor, not twice the states (millions of labelled tokens)."""
        if len(parts) == 1:
            return parts[0]
        offsets = [0]
        for part in parts:
            offsets.extend((offsets[-1] + part.offsets[1:]).tolist())

        def join(values):
            values = list(values)
            return None if any(v is None for v in values) else torch.cat(values)

        def cat(name):
            values = [getattr(p, name) for p in parts]
            if release:
                for p in parts:
                    setattr(p, name, None)
            return join(values)

        layers = None
        if all(p.layers for p in parts):
            common = set.intersection(*(set(p.layers) for p in parts))
            pick = (lambda p, k: p.layers.pop(k)) if release else (lambda p, k: p.layers[k])
            layers = {k: join(pick(p, k) for p in parts) for k in sorted(common)}
        return cls(
            cat("hidden"),
            cat("input_ids"),
            cat("labels"),
            torch.tensor(offsets),
            [i for p in parts for i in p.ids],
            cat("topk_ids"),
            cat("topk_logprobs"),
            layers,
        )

    @property
    def has_teacher(self) -> bool:
        return self.topk_ids is not None and self.topk_logprobs is not None

    def with_teacher_labels(self) -> "HiddenStates":
        """The same states with each answer token's label replaced by the target's greedy choice for it (the
        teacher's top-1 at the previous row): what greedy speculative decoding accepts against, so drafter
        accuracies measured on these labels are acceptance rates."""
        if not self.has_teacher:
            raise ValueError("with_teacher_labels needs target-labelled states (topk_ids)")
        labels = self.labels.clone()
        top1 = self.topk_ids[:, 0].long()
        starts = torch.zeros_like(labels, dtype=torch.bool)
        starts[self.offsets[:-1].long()] = True
        take = (labels != -100) & ~starts  # the first token of a sequence has no previous row
        prev = torch.arange(labels.shape[0]) - 1
        labels[take] = top1[prev[take]]
        return dataclasses.replace(self, labels=labels)

    @property
    def num_train_tokens(self) -> int:
        return int((self.labels != -100).sum())


def hidden_state_cache_dir(model, max_length: int) -> Path:
    """One folder per (model, max_length); one small safetensors file per conversation, so a growing
    data file only costs the backbone passes of its new conversations."""
    return cache_root() / "hidden_states" / model_key(model, max_length)


def _record_key(record: Record) -> str:
    return hashlib.sha256(json.dumps(record.to_dict(), sort_keys=True).encode()).hexdigest()[:24]


def encode_record(tokenizer, record: Record, max_length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(input_ids, labels)`` of a record's conversation with its last answer; None when nothing to learn."""
    msgs = record.conversation(num_turns=len(record.answers)) + [{"role": "assistant", "content": record.answers[-1]}]
    enc = tokenize_conversation(tokenizer, msgs, max_length=max_length)
    x, y = torch.tensor(enc["input_ids"]), torch.tensor(enc["labels"])
    if len(x) < 3 or bool((y == -100).all()):
        return None
    return x, y


def _read_cached_states(path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(hidden, input_ids, labels)`` of one cached conversation; None (with a warning) when the file is damaged
    (truncated, not safetensors, tensors missing or of disagreeing lengths): the caller computes it again."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        t = load_file(str(path))
        h, x, y = t["hidden"], t["input_ids"], t["labels"]
        if h.dim() != 2 or x.dim() != 1 or not len(h) == len(x) == len(y):
            raise ValueError(f"tensors of shapes {tuple(h.shape)}, {tuple(x.shape)}, {tuple(y.shape)}")
    except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as error:
        logger.warning_once(
            f"ignoring the damaged cached states {path} ({type(error).__name__}: {error}); they are computed again"
        )
        return None
    return h, x, y


def cached_states(
    records: Sequence[Record],
    tokenizer,
    folder: Path,
    compute,
    max_length: int = 1024,
    cache: bool = True,
    progress: bool = True,
    desc: str = "hidden states",
) -> HiddenStates:
    """The states ``compute(input_ids)`` gives (``(T, H)``, stored fp16 on the CPU) of each conversation of
    ``records`` that has an answer (`encode_record`), read from one safetensors file per conversation in ``folder``
    when ``cache`` holds it there, else computed and (with ``cache``) written."""
    from safetensors.torch import save_file

    if cache:
        folder.mkdir(parents=True, exist_ok=True)
    hs, xs, ys, offsets, ids = [], [], [], [0], []
    iterator = records
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(records, desc=desc, unit="conv")
    for r in iterator:
        if not r.answers:
            continue  # nothing to learn from a prompt without an answer
        path = folder / f"{_record_key(r)}.safetensors"
        cached = _read_cached_states(path) if cache and path.is_file() else None
        if cached is not None:
            h, x, y = cached
        else:
            encoded = encode_record(tokenizer, r, max_length)
            if encoded is None:
                continue
            x, y = encoded
            h = compute(x).to("cpu", torch.float16).contiguous()
            if cache:
                with atomic_path(path) as tmp:
                    save_file({"hidden": h, "input_ids": x, "labels": y}, str(tmp))
        hs.append(h)
        xs.append(x)
        ys.append(y)
        offsets.append(offsets[-1] + len(x))
        ids.append(r.id)
    if not ids:
        raise ValueError("no conversation with an assistant answer to compute hidden states for")
    return HiddenStates(torch.cat(hs), torch.cat(xs), torch.cat(ys), torch.tensor(offsets), ids)


@torch.no_grad()
def extract_hidden_states(
    model,
    tokenizer,
    records: Sequence[Record],
    max_length: int = 1024,
    cache: bool = True,
    progress: bool = True,
) -> HiddenStates:
    """Run the frozen backbone once over ``records`` (conversations with their assistant answers) and
    return (and cache) its final hidden states: the post-norm states that the ``lm_head`` consumes.
    Records without an answer are skipped."""
    backbone = getattr(model, model.base_model_prefix)

    def final_states(input_ids: torch.Tensor) -> torch.Tensor:
        return backbone(input_ids=input_ids[None].to(model.device), use_cache=False).last_hidden_state[0]

    folder = hidden_state_cache_dir(model, max_length)
    return cached_states(records, tokenizer, folder, final_states, max_length, cache, progress)


def drafter_training_args(
    output_dir: str,
    *,
    num_epochs: float,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int,
    max_steps: int = -1,
    time_budget: float | None = None,
    logging_steps: int = 10,
    seed: int = 0,
    progress: bool = True,
    save_steps: int | None = None,
    **extra,
):
    """The `TrainingArguments` every drafter trains with: no reporting, no checkpoints unless ``save_steps`` (then
    one resumable checkpoint every ``save_steps`` steps, the last kept: `train_resumable`; the train commands save
    the drafter itself), CPU unless CUDA is there, the collators' own columns kept, a cosine schedule, or a constant
    one under a ``time_budget`` (`TimeBudgetCallback` then anneals over the budget). ``extra``: further arguments
    (``weight_decay``, ``gradient_accumulation_steps``, ...)."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_epochs,
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        lr_scheduler_type="constant" if time_budget else "cosine",
        logging_steps=logging_steps,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        # two: a run killed while one checkpoint is written or the older one rotated out keeps a complete one
        save_total_limit=2 if save_steps else None,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=not progress,
        seed=seed,
        **extra,
    )


class DrafterTrainer(Trainer):
    """A `Trainer` whose model returns ``loss`` plus named loss components (``loss_parts: dict``), which it
    logs averaged over the logging interval next to the total loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parts: dict[str, list[float]] = {}

    def record_parts(self, parts: dict[str, torch.Tensor]) -> None:
        for name, value in parts.items():
            self._parts.setdefault(name, []).append(float(value))

    # ---- checkpoints hold the trainable tensors only (a drafter's base is frozen and never saved)
    @staticmethod
    def trainable_tensors(model) -> list[torch.nn.Parameter]:
        """What training updates, in a fixed order: ``model.trainable_parameters()`` where the model defines it
        (shared-mode Speculative Streaming: the streams and the base's LoRA weights, which are not submodules),
        else every parameter with ``requires_grad``."""
        if hasattr(model, "trainable_parameters"):
            return list(model.trainable_parameters())
        return [p for p in model.parameters() if p.requires_grad]

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        from safetensors.torch import save_file

        output_dir = Path(output_dir or self.args.output_dir)
        if not self.args.should_save:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        tensors = {str(i): p.detach().to("cpu").contiguous() for i, p in enumerate(self.trainable_tensors(self.model))}
        with atomic_path(output_dir / TRAINABLE_CHECKPOINT) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt"})

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        from safetensors.torch import load_file

        path = Path(resume_from_checkpoint) / TRAINABLE_CHECKPOINT
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not a checkpoint of this trainer (no {TRAINABLE_CHECKPOINT})")
        saved = load_file(str(path))
        params = self.trainable_tensors(self.model)
        if len(saved) != len(params) or any(saved[str(i)].shape != p.shape for i, p in enumerate(params)):
            raise ValueError(
                f"{path} does not hold this model's trainable weights ({len(saved)} tensors, model has {len(params)})"
            )
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(saved[str(i)].to(p.device, p.dtype))

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self._parts and "loss" in logs:
            for name, values in self._parts.items():
                logs[name] = round(sum(values) / len(values), 4)
            self._parts = {}
        super().log(logs, *args, **kwargs)


def train_resumable(trainer: Trainer, resume: bool = False):
    """``trainer.train()``, or with ``resume`` from the last checkpoint in its output folder when there is one (the
    trainable weights, optimizer, schedule, RNG and step; a `TimeBudgetCallback` counts the seconds already spent)."""
    from .callbacks import TimeBudgetCallback

    folder = Path(trainer.args.output_dir)
    budgeted = any(isinstance(cb, TimeBudgetCallback) for cb in trainer.callback_handler.callbacks)
    marker = TimeBudgetCallback.FILE if budgeted else None
    checkpoint = last_complete_checkpoint(folder, marker) if resume and folder.is_dir() else None
    if checkpoint is not None:
        spent = TimeBudgetCallback.spent_in(checkpoint)
        for cb in trainer.callback_handler.callbacks:
            if isinstance(cb, TimeBudgetCallback):
                cb.spent = spent
        print(
            f"resuming from {checkpoint} ({spent:.0f} s of training already spent; the steps after it are done again)",
            file=sys.stderr,
            flush=True,
        )
    return trainer.train(resume_from_checkpoint=checkpoint)


def last_complete_checkpoint(folder: str | Path, marker: str | None = None) -> str | None:
    """The newest ``checkpoint-N`` in ``folder`` that was written to the end (its trainable weights and a readable
    trainer state); a run killed while writing one leaves it incomplete, and the one before it is used. ``marker``: a
    file a callback writes into each checkpoint after the Trainer's own (the time budget's seconds); once any
    checkpoint has it, one without it was cut short between the two and counts as incomplete."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        suffix = path.name.removeprefix("checkpoint-")
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    marked = marker is not None and any((path / marker).is_file() for _, path in found)
    for _, path in sorted(found, reverse=True):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            print(f"skipping the incomplete checkpoint {path} (a run was stopped while writing it)", file=sys.stderr)
            continue
        if marked and not (path / marker).is_file():
            print(f"skipping the checkpoint {path}: the run was stopped before its {marker}", file=sys.stderr)
            continue
        if (path / TRAINABLE_CHECKPOINT).is_file():
            return str(path)
    return None


def planned_steps(num_examples: int, batch_size: int, num_epochs: float, max_steps: int = -1) -> int:
    """The optimizer steps a run plans: ``max_steps`` when set, else ``num_epochs`` over ``num_examples`` (at least 1)."""
    return max_steps if max_steps > 0 else max(1, math.ceil(num_examples / batch_size * num_epochs))


#: the schedule every drafter's ``train_*`` function takes as ``**training`` (forwarded to `train_drafter`), with the
#: defaults a method overrides in `training_settings`; ``warmup_steps`` (unset: ``warmup_ratio`` of the planned steps)
TRAINING_DEFAULTS = dict(
    num_epochs=1.0,
    max_steps=-1,
    batch_size=4,
    learning_rate=3e-4,
    weight_decay=0.0,
    warmup_ratio=0.05,
    gradient_accumulation_steps=1,
    logging_steps=10,
    seed=0,
    progress=True,
    time_budget=None,
    callbacks=None,
    save_steps=None,
    resume=False,
)


def training_settings(training: dict, **method_defaults) -> dict:
    """A ``train_*`` function's ``**training``: `TRAINING_DEFAULTS`, the method's own defaults over them, the caller's
    over both. A keyword that is not part of the schedule raises, as a wrong keyword argument does."""
    known = set(TRAINING_DEFAULTS) | {"warmup_steps"}
    unknown = sorted(set(training) - known)
    if unknown:
        raise TypeError(
            f"unexpected training argument(s) {', '.join(unknown)}; the schedule takes {', '.join(sorted(known))}"
        )
    return {**TRAINING_DEFAULTS, **method_defaults, **training}


def train_drafter(
    trainer_class: type[Trainer],
    model,
    dataset,
    collator,
    output_dir: str,
    *,
    callbacks: Sequence | None = None,
    time_budget: float | None = None,
    anneal: bool = True,
    resume: bool = False,
    trainer_kwargs: dict | None = None,
    warmup_ratio: float = 0.05,
    **training_args,
) -> Trainer:
    """Train ``model`` on ``dataset`` with ``trainer_class`` (a `DrafterTrainer`) and return the trainer, the model
    left in eval mode: the `drafter_training_args` of ``output_dir`` and ``training_args``, a `TimeBudgetCallback`
    stopping it after ``time_budget`` seconds (with ``anneal`` the learning rate follows a cosine over the budget,
    warmed up over ``warmup_steps``; without it the schedule stays the arguments' cosine) and `train_resumable`.
    Without ``warmup_steps``, ``warmup_ratio`` of the planned steps (`budget_warmup_steps`: capped under a budget).
    ``trainer_kwargs``: the trainer's own arguments (its loss settings, ``optimizers``)."""
    from .callbacks import LearningCurveCallback, TimeBudgetCallback, budget_warmup_steps
    from .curve_plot import TrainingCurveCallback

    if training_args.get("warmup_steps") is None:
        per_step = training_args["batch_size"] * training_args.get("gradient_accumulation_steps", 1)
        steps = planned_steps(len(dataset), per_step, training_args["num_epochs"], training_args.get("max_steps", -1))
        training_args["warmup_steps"] = budget_warmup_steps(steps, warmup_ratio, time_budget)
    args = drafter_training_args(output_dir, time_budget=time_budget if anneal else None, **training_args)
    callbacks = [*(callbacks or []), TrainingCurveCallback()]
    if time_budget:
        budget = TimeBudgetCallback(time_budget, anneal=anneal, warmup_steps=training_args["warmup_steps"])
        for cb in callbacks:
            if isinstance(cb, LearningCurveCallback):  # its points fall at shares of the budget
                cb.budget = budget
        callbacks.append(budget)
    model.train()
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=collator,
        callbacks=callbacks,
        **(trainer_kwargs or {}),
    )
    train_resumable(trainer, resume)
    model.eval()
    return trainer
