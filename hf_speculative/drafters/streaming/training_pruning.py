"""Training of the parallel-tree-pruning early exit (Speculative Streaming, Sec. 3.1.3): the rank-theta adapter
alone, with next-token CE on the base's cached layer-l states. The pruning itself is `pruning` (inference)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ...training.trainer import DrafterTrainer, HiddenStates, train_drafter, training_settings
from .pruning import early_exit_states
from .training_speculative_streaming import IGNORE_INDEX, StreamCollator, StreamSegmentDataset, stream_losses

__all__ = ["PruningHeadTrainer", "early_exit_accuracy", "pruning_states", "train_pruning_head", "fit_pruning_head"]


class PruningHeadTrainer(DrafterTrainer):
    """Trains the early-exit adapter alone with next-token CE on cached layer-l states (Sec. 3.1.3)."""

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        states = early_exit_states(model, inputs["hidden"])
        loss = stream_losses(model.lm_head, states[..., None, :], inputs["targets"])[0]
        return (loss, states) if return_outputs else loss


def pruning_states(ss, tokenizer, records, max_length: int = 1024, progress: bool = True) -> HiddenStates:
    """The main stream's states entering layer l = ``pruning_layer`` over ``records`` (what the early exit reads):
    the base's, cached per conversation in lossless mode; in shared mode the LoRA-adapted base's (the layers below
    l never see the streams), computed afresh, since that cache is keyed by the base alone."""
    from .training_speculative_streaming import extract_stream_inputs

    shared = ss.config.mode == "shared"
    return extract_stream_inputs(
        ss.base, tokenizer, records, ss.config.pruning_layer, max_length=max_length, cache=not shared, progress=progress
    )


def _next_token_segments(
    states: HiddenStates, segment_length: int, max_tokens: int | None = None
) -> StreamSegmentDataset:
    return StreamSegmentDataset(states, 0, segment_length, max_tokens, main=True)


@torch.no_grad()
def early_exit_accuracy(ss, states: HiddenStates, segment_length: int = 256) -> float:
    """Share of held-out answer positions where the early exit's top-1 token is the next token."""
    hits = total = 0
    for h, targets, *_ in _next_token_segments(states, segment_length).items:
        valid = targets[:, 0] != IGNORE_INDEX
        if bool(valid.any()):
            logits = F.linear(early_exit_states(ss, h[valid].to(ss.lm_head.weight.device)), ss.lm_head.weight)
            hits += int((logits.argmax(-1).cpu() == targets[valid, 0]).sum())
            total += int(valid.sum())
    return hits / max(total, 1)


def train_pruning_head(ss, train_states: HiddenStates, output_dir: str, segment_length: int = 256, **training):
    """Train ``ss.streams.pruning`` (the rank-theta early-exit adapter) on the base's states entering layer l
    (`pruning_states`) in segments of ``segment_length``; every other parameter (in shared mode the base's LoRA
    weights too) stays frozen. ``training``: the schedule (`hf_speculative.training.trainer.TRAINING_DEFAULTS`;
    here learning rate 1e-3); ``time_budget`` stops it (the cosine schedule kept)."""
    if ss.streams.pruning is None:
        raise ValueError(
            "the model has no pruning adapter: set config.pruning_layer (LlamaForSpeculativeStreaming.add_pruning_head)"
        )
    training = training_settings(training, learning_rate=1e-3)
    dataset = _next_token_segments(train_states, segment_length)
    trainable = set(ss.streams.pruning.parameters())  # tensors hash (and compare in a set) by identity
    frozen = [p for p in ss.trainable_parameters() if p.requires_grad and p not in trainable]
    for p in frozen:
        p.requires_grad_(False)
    try:
        return train_drafter(PruningHeadTrainer, ss, dataset, StreamCollator(), output_dir, anneal=False, **training)
    finally:
        for p in frozen:
            p.requires_grad_(True)
        ss.eval()


def fit_pruning_head(
    ss,
    tokenizer,
    train_records,
    held_out_records,
    output_dir: str,
    max_length: int = 1024,
    progress: bool = True,
    **training,
) -> dict:
    """Parallel tree pruning (Sec. 3.1.3) end to end on ``ss`` with its pruning head already added
    (`LlamaForSpeculativeStreaming.add_pruning_head`): the states entering layer l over the records (under several
    processes the main one first), the early exit's held-out top-1 before, `train_pruning_head` (``training``: its
    keyword arguments), top-1 after. Returns the run's record."""
    from ...training.distributed import main_process_first

    t0 = time.perf_counter()
    with main_process_first():
        states = pruning_states(ss, tokenizer, train_records, max_length=max_length, progress=progress)
        held_out = (
            pruning_states(ss, tokenizer, held_out_records, max_length=max_length, progress=False)
            if held_out_records
            else None
        )
    extract_seconds = time.perf_counter() - t0
    before = early_exit_accuracy(ss, held_out) if held_out is not None else None
    t0 = time.perf_counter()
    trainer = train_pruning_head(ss, states, output_dir, progress=progress, **training)
    seconds = time.perf_counter() - t0
    after = early_exit_accuracy(ss, held_out) if held_out is not None else None
    return {
        "layer": ss.config.pruning_layer,
        "threshold": ss.config.pruning_threshold,
        "train_examples": len(train_records),
        "train_answer_tokens": states.num_train_tokens,
        "steps": trainer.state.global_step,
        "extract_seconds": round(extract_seconds, 1),
        "train_seconds": round(seconds, 1),
        "held_out_top1_before": None if before is None else round(before, 4),
        "held_out_top1_after": None if after is None else round(after, 4),
        "adapter_parameters": sum(p.numel() for p in ss.streams.pruning.parameters()),
    }
