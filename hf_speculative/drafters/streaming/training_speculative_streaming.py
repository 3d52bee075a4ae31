"""Speculative Streaming training (Sec. 3.1.4, Appendix D, H.1): loss, labels, data, `Trainer`.

Loss (Sec. 3.1.4): ``L = alpha_0 * CE(main_t, y_{t+1}) + sum_{j=1..gamma} alpha_j * CE(stream_tj, y_{t+1+j})``,
where ``main_t`` are the main stream's logits at position t (they predict the next token ``y_{t+1}``) and
``stream_tj`` stream j's logits at t, which predict the token j places further, ``y_{t+1+j}`` (0-based token
indices of the training sequence; positions whose target is not an answer token are ignored). Each CE is the
mean over its valid positions. On target-labelled shards (``hf-speculative label``) each stream CE becomes the KD
loss against the target's stored top-k distribution at row t + j, the one that predicts ``y_{t+1+j}``
(`stream_kd_losses`): the streams learn what the target will say, not the human text.

Lossless mode: alpha_0 = 0 and the base is frozen, so the main stream entering layer ``N - N_s`` never
changes: it is computed once over the data and cached in fp16 (`extract_stream_inputs`, like
`hf_speculative.training.trainer.extract_hidden_states`), and each training step runs only the top N_s
layers (main stream without gradients for its keys/values, plus the streams). Long conversations are cut
into segments of ``segment_length`` tokens (segment attention, Appendix D), each keeping its true positions.

Shared mode: alpha_0 = 1 and alpha_j = 0.1 (H.1); the base is fine-tuned with LoRA (PEFT) and the main stream
attends to the streams, so nothing can be cached: each step runs the joint forward of the whole model over
token segments (`tokenize_records`), and the main stream's next-token CE is column 0 of the same per-column
loss (`stream_rows`: main then streams; `stream_labels(..., main=True)`: next token then the stream targets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...paths import cache_root, model_key
from ...training.callbacks import LearningCurveCallback, TimeBudgetCallback
from ...training.distributed import average_gradients
from ...training.trainer import (
    DrafterTrainer,
    HiddenStates,
    cached_states,
    encode_record,
    train_drafter,
    training_settings,
)

__all__ = [
    "IGNORE_INDEX",
    "SHARED_STREAM_WEIGHT",
    "stream_labels",
    "stream_rows",
    "stream_losses",
    "stream_kd_losses",
    "streaming_loss",
    "extract_stream_inputs",
    "tokenize_records",
    "StreamSegmentDataset",
    "StreamCollator",
    "SpeculativeStreamingTrainer",
    "StreamCurveCallback",
    "stream_accuracies",
    "calibrate_stream_tree",
    "TimeBudgetCallback",
    "train_speculative_streaming",
]

IGNORE_INDEX = -100
SHARED_STREAM_WEIGHT = 0.1  # alpha_j of shared mode (H.1); alpha_0 = 1


def stream_labels(labels: torch.LongTensor, num_streams: int, main: bool = False) -> torch.LongTensor:
    """``(..., T)`` token labels (the token itself on answer tokens, ``-100`` elsewhere) -> ``(..., T, gamma)``
    stream targets: ``[t, j-1] = labels[t + 1 + j]`` for stream j = 1..gamma, ``-100`` past the end. With
    ``main`` (shared mode) column 0 is the main stream's next token ``labels[t + 1]`` (``(..., T, 1 + gamma)``)."""
    T = labels.shape[-1]
    first = 0 if main else 1
    out = torch.full((*labels.shape, num_streams + 1 - first), IGNORE_INDEX, dtype=torch.long, device=labels.device)
    for j in range(first, num_streams + 1):
        shift = 1 + j
        if shift < T:
            out[..., : T - shift, j - first] = labels[..., shift:]
    return out


def stream_losses(lm_head, states: torch.Tensor, targets: torch.LongTensor) -> torch.Tensor:
    """Per-stream mean CE ``(gamma,)`` of final-normed stream states ``(..., gamma, H)`` through ``lm_head``
    against ``targets`` ``(..., gamma)``; the vocabulary projection runs only on rows with a valid target."""
    G = states.shape[-2]
    states = states.reshape(-1, G, states.shape[-1])
    targets = targets.reshape(-1, G)
    losses = []
    for j in range(G):
        valid = targets[:, j] != IGNORE_INDEX
        if bool(valid.any()):
            logits = lm_head(states[valid, j].to(lm_head.weight.dtype)).float()
            losses.append(F.cross_entropy(logits, targets[valid, j]))
        else:
            losses.append(states.new_zeros((), dtype=torch.float32))
    return torch.stack(losses)


def stream_kd_losses(
    lm_head, states: torch.Tensor, targets: torch.LongTensor, teacher_ids, teacher_logprobs
) -> torch.Tensor:
    """Per-stream KD loss ``(gamma,)``: ``KL(p_target || q_stream)`` (`kd_loss`) of final-normed stream states
    ``(..., gamma, H)`` against the target's stored top-k ``(..., gamma, k)`` at the rows whose ``targets`` are
    valid; the vocabulary projection runs only on those rows."""
    from ...training.losses import kd_loss

    G = states.shape[-2]
    states = states.reshape(-1, G, states.shape[-1])
    targets = targets.reshape(-1, G)
    ids = teacher_ids.reshape(-1, G, teacher_ids.shape[-1])
    logp = teacher_logprobs.reshape(-1, G, teacher_logprobs.shape[-1])
    losses = []
    for j in range(G):
        valid = targets[:, j] != IGNORE_INDEX
        if bool(valid.any()):
            logits = lm_head(states[valid, j].to(lm_head.weight.dtype))
            losses.append(kd_loss(logits, ids[valid, j], logp[valid, j]))
        else:
            losses.append(states.new_zeros((), dtype=torch.float32))
    return torch.stack(losses)


def streaming_loss(
    per_stream: torch.Tensor,
    stream_weights: Sequence[float],
    main_loss: torch.Tensor | None = None,
    alpha_0: float = 0.0,
):
    """``alpha_0 * main_loss + sum_j alpha_j * per_stream[j]`` (Sec. 3.1.4)."""
    w = torch.tensor(list(stream_weights)[: per_stream.shape[0]], dtype=per_stream.dtype, device=per_stream.device)
    loss = (w * per_stream).sum()
    if alpha_0 and main_loss is not None:
        loss = loss + alpha_0 * main_loss
    return loss


class _StopForward(Exception):
    pass


def tokenize_records(tokenizer, records, max_length: int = 1024) -> HiddenStates:
    """Shared mode's training data: the tokens and labels of each record with an answer, as a `HiddenStates`
    with an empty ``hidden`` (the joint forward runs the whole model; nothing is cached)."""
    xs, ys, offsets, ids = [], [], [0], []
    for r in records:
        encoded = encode_record(tokenizer, r, max_length) if r.answers else None
        if encoded is None:
            continue
        xs.append(encoded[0])
        ys.append(encoded[1])
        offsets.append(offsets[-1] + len(encoded[0]))
        ids.append(r.id)
    if not ids:
        raise ValueError("no conversation with an assistant answer")
    return HiddenStates(torch.empty(0), torch.cat(xs), torch.cat(ys), torch.tensor(offsets), ids)


@torch.no_grad()
def extract_stream_inputs(
    model, tokenizer, records, layer: int, max_length: int = 1024, cache: bool = True, progress: bool = True
) -> HiddenStates:
    """The frozen base's hidden states entering decoder layer ``layer`` (= N - N_s) over ``records``, cached in
    fp16 per conversation under ``$HF_SPECULATIVE_CACHE/stream_inputs/``. The forward stops at that layer."""
    folder = cache_root() / "stream_inputs" / f"{model_key(model, max_length)}-layer{layer}"
    decoder = model.model
    captured = {}

    def stop(module, args, kw):
        captured["h"] = args[0] if args else kw["hidden_states"]
        raise _StopForward

    def layer_inputs(input_ids: torch.Tensor) -> torch.Tensor:
        try:
            decoder(input_ids=input_ids[None].to(model.device), use_cache=False)
        except _StopForward:  # raised by the pre-hook of layer ``layer``, its input captured: the rest is not run
            pass
        return captured.pop("h")[0]

    handle = decoder.layers[layer].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        return cached_states(
            records,
            tokenizer,
            folder,
            layer_inputs,
            max_length,
            cache,
            progress,
            desc=f"hidden states entering layer {layer}",
        )
    finally:
        handle.remove()


class StreamSegmentDataset(Dataset):
    """Segments of at most ``segment_length`` positions of each conversation: ``hidden (T, H)`` (fp16; with
    ``shared``: ``input_ids (T,)``, the joint forward runs the whole model), ``targets (T, gamma)`` (with
    ``shared``: ``(T, 1 + gamma)``, column 0 the next token; computed on the whole conversation, so a segment's
    last positions keep their targets), ``position_ids (T,)``. Segments without any target are dropped.
    ``main`` (default: ``shared``) adds the next-token column 0 (``num_streams=0, main=True``: next-token
    targets alone on hidden states, as for the pruning early exit)."""

    def __init__(
        self,
        states: HiddenStates,
        num_streams: int,
        segment_length: int = 256,
        max_tokens: int | None = None,
        shared: bool = False,
        main: bool | None = None,
    ):
        self.key = "input_ids" if shared else "hidden"
        inputs = states.input_ids if shared else states.hidden
        main = shared if main is None else main
        # target-labelled states: stream j at row t distils the target's distribution at row t + j (it predicts
        # token t + 1 + j, the stream's target), read lazily from the conversation's top-k arrays
        self.teacher = (
            (states.topk_ids, states.topk_logprobs) if getattr(states, "has_teacher", False) and not main else None
        )
        self.num_streams = num_streams
        self.items = []
        total = 0
        for i in range(len(states)):
            s, e = int(states.offsets[i]), int(states.offsets[i + 1])
            targets = stream_labels(states.labels[s:e], num_streams, main=main)
            for a in range(0, e - s, segment_length):
                b = min(a + segment_length, e - s)
                tg = targets[a:b]
                if not bool((tg != IGNORE_INDEX).any()):
                    continue
                self.items.append((inputs[s + a : s + b], tg, torch.arange(a, b), (s + a, s + b, e)))
                total += b - a
                if max_tokens is not None and total >= max_tokens:
                    return

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        x, t, p, (start, stop, end) = self.items[i]
        item = {self.key: x, "targets": t, "position_ids": p}
        if self.teacher is not None:
            rows = (torch.arange(start, stop)[:, None] + torch.arange(1, self.num_streams + 1)).clamp_max(end - 1)
            item["teacher_ids"], item["teacher_logprobs"] = self.teacher[0][rows], self.teacher[1][rows]
        return item


@dataclass
class StreamCollator:
    """Right-pads segments: ``hidden (B, T, H)`` float32 (or ``input_ids (B, T)``, padded with 0),
    ``targets (B, T, columns)`` (-100 on padding), ``position_ids (B, T)``. Right padding cannot leak into
    earlier positions under the causal mask."""

    dtype: torch.dtype = torch.float32

    def __call__(self, features: Sequence[dict]) -> dict:
        key = "hidden" if "hidden" in features[0] else "input_ids"
        T = max(f[key].shape[0] for f in features)
        B, G = len(features), features[0]["targets"].shape[-1]
        first = features[0][key]
        inputs = torch.zeros(B, T, *first.shape[1:], dtype=self.dtype if key == "hidden" else first.dtype)
        targets = torch.full((B, T, G), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(B, T, dtype=torch.long)
        teacher = "teacher_ids" in features[0]
        if teacher:
            K = features[0]["teacher_ids"].shape[-1]
            t_ids = torch.zeros(B, T, G, K, dtype=torch.long)
            t_logp = torch.zeros(B, T, G, K, dtype=torch.float32)
        for b, f in enumerate(features):
            n = f[key].shape[0]
            inputs[b, :n] = f[key].to(inputs.dtype)
            targets[b, :n] = f["targets"]
            positions[b, :n] = f["position_ids"]
            positions[b, n:] = f["position_ids"][-1] + 1 + torch.arange(T - n)
            if teacher:
                t_ids[b, :n], t_logp[b, :n] = f["teacher_ids"], f["teacher_logprobs"].float()
        batch = {key: inputs, "targets": targets, "position_ids": positions}
        if teacher:
            batch.update(teacher_ids=t_ids, teacher_logprobs=t_logp)
        return batch


def stream_rows(model, batch: dict) -> torch.Tensor:
    """The final-normed states ``(B, T, columns, H)`` that ``batch["targets"]`` score. Lossless: the gamma streams
    from the cached states entering layer N - N_s. Shared: the joint forward over ``input_ids``; column 0 is the
    main stream (its next-token CE is the alpha_0 term), then the streams. A plain causal LM gives column 0 only
    (next-token fine-tuning, the baseline shared mode is compared with)."""
    if "input_ids" in batch:
        out = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=1,
        )
        streams = getattr(out, "stream_states", None)
        main = out.hidden_states[-1][:, :, None]
        return main if streams is None else torch.cat([main, streams], dim=2)
    return model.streams_from_hidden(batch["hidden"].to(model.dtype), batch["position_ids"])


class SpeculativeStreamingTrainer(DrafterTrainer):
    """The loss is `streaming_loss`. Lossless mode: only the streams train, alpha_0 = 0, alpha_j = 1 by default.
    Shared mode (batches of ``input_ids``): the streams and the base's LoRA adapters train, alpha_0 = 1 and
    alpha_j = 0.1 by default (H.1)."""

    alpha_0: float = 1.0

    def __init__(self, *args, stream_weights: Sequence[float] | None = None, alpha_0: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.stream_weights = stream_weights
        self.alpha_0 = alpha_0

    def _clip_grad_norm(self, model):
        """Clip (and report) the gradient norm over everything that trains: in shared mode the base's LoRA
        weights too, which are not parameters of ``model`` (the `Trainer` would clip only the streams). Under
        several processes those weights are outside DistributedDataParallel's reach, so their gradients are
        averaged across the processes here first (the streams' are averaged by DDP)."""
        inner = self.model
        if not hasattr(inner, "trainable_parameters"):
            return super()._clip_grad_norm(model)
        params = inner.trainable_parameters()
        registered = set(inner.parameters())  # tensors hash (and compare in a set) by identity
        average_gradients([p for p in params if p not in registered])
        return torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        states = stream_rows(model, inputs)
        lm_head = getattr(model, "module", model).lm_head  # ``model`` may be the DistributedDataParallel wrapper
        if "teacher_ids" in inputs:  # target-labelled data: distil the target's own distribution
            per_column = stream_kd_losses(
                lm_head, states, inputs["targets"], inputs["teacher_ids"], inputs["teacher_logprobs"]
            )
        else:
            per_column = stream_losses(lm_head, states, inputs["targets"])
        parts = {}
        if "input_ids" in inputs:  # shared mode: column 0 is the main stream
            main_loss, per_stream = per_column[0], per_column[1:]
            weights = self.stream_weights or [SHARED_STREAM_WEIGHT] * per_stream.shape[0]
            loss = streaming_loss(per_stream, weights, main_loss=main_loss, alpha_0=self.alpha_0)
            parts["loss_main"] = main_loss.detach()
        else:
            per_stream = per_column
            loss = streaming_loss(per_stream, self.stream_weights or [1.0] * per_stream.shape[0])
        parts.update({f"loss_stream{j + 1}": v.detach() for j, v in enumerate(per_stream)})
        self.record_parts(parts)
        return (loss, states) if return_outputs else loss


@torch.no_grad()
def stream_accuracies(model, states: HiddenStates, top: int = 10, segment_length: int = 256) -> list[list[float]]:
    """``acc[j][i]``: share of held-out positions where stream j+1's i-th ranked token is its target (shared mode:
    ``states`` from `tokenize_records`, the joint forward)."""
    G = model.config.num_streams
    shared = model.config.mode == "shared"
    data = StreamSegmentDataset(states, G, segment_length, shared=shared)
    hits = torch.zeros(G, top, dtype=torch.float64)
    counts = torch.zeros(G, dtype=torch.float64)
    collate = StreamCollator(model.dtype)
    device = model.lm_head.weight.device  # the segments are built on the CPU; the targets and counts stay there
    for i in range(len(data)):
        batch = collate([data[i]])
        inputs = {k: v.to(device) for k, v in batch.items() if k != "targets"}
        out = stream_rows(model, inputs)[0, :, int(shared) :]  # (T, G, H): the streams
        tg = batch["targets"][0, :, int(shared) :]
        valid = tg != IGNORE_INDEX
        for j in range(G):
            rows = valid[:, j]
            if bool(rows.any()):
                ranked = torch.topk(model.lm_head(out[rows.to(device), j]), top, dim=-1).indices.cpu()
                hits[j] += (ranked == tg[rows, j][:, None]).sum(0).double()
                counts[j] += rows.sum()
    return (hits / counts.clamp_min(1)[:, None]).tolist()


def calibrate_stream_tree(model, held_out: HiddenStates, num_nodes: int | None, segment_length: int = 256) -> dict:
    """The streams' held-out top-i accuracies and, with ``num_nodes``, the draft tree of that many nodes that
    maximizes the expected acceptance length on them (`TreeSpec.optimize`), set as ``model.config.stream_tree``;
    the record also goes to ``model.config.calibration``."""
    from ...engine.trees import TreeSpec, expected_acceptance_length

    acc = stream_accuracies(model, held_out, segment_length=segment_length)
    calibration = {"stream_top_i_accuracy": [[round(a, 4) for a in r] for r in acc]}
    if num_nodes:
        tree = TreeSpec.optimize(acc, num_nodes)
        model.config.stream_tree = tree.to_list()
        calibration.update(
            num_nodes=num_nodes, expected_acceptance_length=round(expected_acceptance_length(tree, acc), 4)
        )
    model.config.calibration = calibration
    return calibration


class StreamCurveCallback(LearningCurveCallback):
    """The streams' learning curve (`LearningCurveCallback`): per-stream top-1 accuracy against tokens trained on."""

    seen_key, top1_key = "train_tokens", "stream_top1"

    def __init__(
        self, model, held_out: HiddenStates, num_nodes: int = 16, num_points: int = 4, tokens_per_step: int = 0
    ):
        super().__init__(model, held_out, num_nodes, num_points, per_step=tokens_per_step)

    def accuracies(self) -> list[list[float]]:
        return stream_accuracies(self.model, self.held_out)


def train_speculative_streaming(
    model,
    train_states: HiddenStates,
    output_dir: str,
    segment_length: int = 256,
    max_tokens: int | None = None,
    stream_weights: Sequence[float] | None = None,
    **training,
):
    """Train ``model`` (a `LlamaForSpeculativeStreaming` attached to its base) on segments of ``segment_length``
    tokens (at most ``max_tokens``); returns the Trainer. ``training``: the schedule
    (`hf_speculative.training.trainer.TRAINING_DEFAULTS`; here learning rate 1e-3, batch 2): ``time_budget`` (seconds)
    stops it, the learning rate annealed over the budget; ``save_steps`` / ``resume``: resumable checkpoints in
    ``output_dir`` (`train_resumable`). Lossless: the streams, on cached states entering layer N - N_s
    (`extract_stream_inputs`). Shared: the streams and the base's LoRA adapters, with the joint forward on tokens
    (`tokenize_records`), alpha_0 = 1, alpha_j = 0.1. ``model`` may also be a plain causal LM with trainable (e.g.
    PEFT LoRA) weights: then only the next-token term trains (alpha_0 = 1, no streams), with the same data, segments,
    optimizer and schedule."""
    training = training_settings(training, learning_rate=1e-3, batch_size=2, weight_decay=0.0)
    shared = getattr(model.config, "mode", "shared") == "shared"
    num_streams = getattr(model.config, "num_streams", 0)
    dataset = StreamSegmentDataset(train_states, num_streams, segment_length, max_tokens, shared=shared)
    # shared mode: the optimizer also holds the base's LoRA weights (not submodules of ``model``)
    params = DrafterTrainer.trainable_tensors(model)
    optimizers = (
        (torch.optim.AdamW(params, lr=training["learning_rate"], weight_decay=training["weight_decay"]), None)
        if shared
        else (None, None)
    )
    return train_drafter(
        SpeculativeStreamingTrainer,
        model,
        dataset,
        StreamCollator(),
        output_dir,
        trainer_kwargs={"stream_weights": stream_weights, "optimizers": optimizers},
        **training,
    )
