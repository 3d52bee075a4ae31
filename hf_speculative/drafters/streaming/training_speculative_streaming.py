"""Speculative Streaming training in lossless mode (Sec. 3.1.4, Appendix D, H.1): loss, labels, data, `Trainer`.

Loss (Sec. 3.1.4): ``L = alpha_0 * CE(main_t, y_{t+1}) + sum_{j=1..gamma} alpha_j * CE(stream_tj, y_{t+1+j})``,
where ``main_t`` are the main stream's logits at position t (they predict the next token ``y_{t+1}``) and
``stream_tj`` stream j's logits at t, which predict the token j places further, ``y_{t+1+j}`` (0-based token
indices of the training sequence; positions whose target is not an answer token are ignored). Each CE is the
mean over its valid positions.

Lossless mode: alpha_0 = 0 and the base is frozen, so the main stream entering layer ``N - N_s`` never
changes: it is computed once over the data and cached in fp16 (`extract_stream_inputs`, like
`hf_speculative.training.trainer.extract_hidden_states`), and each training step runs only the top N_s
layers (main stream without gradients for its keys/values, plus the streams). Long conversations are cut
into segments of ``segment_length`` tokens (segment attention, Appendix D), each keeping its true positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...training.callbacks import LearningCurveCallback, TimeBudgetCallback
from ...training.trainer import DrafterTrainer, HiddenStates, _cache_root, _model_key, _record_key

__all__ = [
    "IGNORE_INDEX",
    "stream_labels",
    "stream_losses",
    "streaming_loss",
    "extract_stream_inputs",
    "StreamSegmentDataset",
    "StreamCollator",
    "SpeculativeStreamingTrainer",
    "StreamCurveCallback",
    "stream_accuracies",
    "TimeBudgetCallback",
    "train_speculative_streaming",
]

IGNORE_INDEX = -100


def stream_labels(labels: torch.LongTensor, num_streams: int, first_shift: int = 2) -> torch.LongTensor:
    """``(..., T)`` token labels (the token itself on answer tokens, ``-100`` elsewhere) -> ``(..., T, gamma)``
    stream targets: ``[t, j-1] = labels[t + 1 + j]`` for stream j = 1..gamma, ``-100`` past the end
    (``first_shift=1``, one stream: next-token targets, as for the pruning early exit)."""
    T = labels.shape[-1]
    out = torch.full((*labels.shape, num_streams), IGNORE_INDEX, dtype=torch.long, device=labels.device)
    for j in range(1, num_streams + 1):
        shift = first_shift - 1 + j
        if shift < T:
            out[..., : T - shift, j - 1] = labels[..., shift:]
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


def streaming_loss(per_stream: torch.Tensor, stream_weights: Sequence[float], main_loss: torch.Tensor | None = None, alpha_0: float = 0.0):
    """``alpha_0 * main_loss + sum_j alpha_j * per_stream[j]`` (Sec. 3.1.4)."""
    w = torch.tensor(list(stream_weights)[: per_stream.shape[0]], dtype=per_stream.dtype, device=per_stream.device)
    loss = (w * per_stream).sum()
    if alpha_0 and main_loss is not None:
        loss = loss + alpha_0 * main_loss
    return loss


class _StopForward(Exception):
    pass


@torch.no_grad()
def extract_stream_inputs(model, tokenizer, records, layer: int, max_length: int = 1024, cache: bool = True, progress: bool = True) -> HiddenStates:
    """The frozen base's hidden states entering decoder layer ``layer`` (= N - N_s) over ``records``, cached in
    fp16 per conversation under ``$HF_SPECULATIVE_CACHE/stream_inputs/``. The forward stops at that layer."""
    from safetensors.torch import load_file, save_file

    from ...training.data import tokenize_conversation

    folder = _cache_root() / "stream_inputs" / f"{_model_key(model, max_length)}-layer{layer}"
    if cache:
        folder.mkdir(parents=True, exist_ok=True)
    decoder = model.model
    captured = {}

    def stop(module, args, kw):
        captured["h"] = args[0] if args else kw["hidden_states"]
        raise _StopForward

    hs, xs, ys, offsets, ids = [], [], [], [0], []
    iterator = records
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(records, desc=f"hidden states entering layer {layer}", unit="conv")
    handle = decoder.layers[layer].register_forward_pre_hook(stop, with_kwargs=True)
    try:
        for r in iterator:
            if not r.answers:
                continue
            path = folder / f"{_record_key(r)}.safetensors"
            if cache and path.is_file():
                t = load_file(str(path))
                h, x, y = t["hidden"], t["input_ids"], t["labels"]
            else:
                msgs = r.conversation(num_turns=len(r.answers)) + [{"role": "assistant", "content": r.answers[-1]}]
                enc = tokenize_conversation(tokenizer, msgs, max_length=max_length)
                x, y = torch.tensor(enc["input_ids"]), torch.tensor(enc["labels"])
                if len(x) < 3 or bool((y == IGNORE_INDEX).all()):
                    continue
                try:
                    decoder(input_ids=x[None].to(model.device), use_cache=False)
                except _StopForward:
                    pass
                h = captured.pop("h")[0].to("cpu", torch.float16).contiguous()
                if cache:
                    save_file({"hidden": h, "input_ids": x, "labels": y}, str(path))
            hs.append(h)
            xs.append(x)
            ys.append(y)
            offsets.append(offsets[-1] + len(x))
            ids.append(r.id)
    finally:
        handle.remove()
    if not ids:
        raise ValueError("no conversation with an assistant answer")
    return HiddenStates(torch.cat(hs), torch.cat(xs), torch.cat(ys), torch.tensor(offsets), ids)


class StreamSegmentDataset(Dataset):
    """Segments of at most ``segment_length`` positions of each conversation: ``hidden (T, H)`` (fp16),
    ``targets (T, gamma)`` (computed on the whole conversation, so a segment's last positions keep their
    targets), ``position_ids (T,)``. Segments without any stream target are dropped."""

    def __init__(
        self, states: HiddenStates, num_streams: int, segment_length: int = 256, max_tokens: int | None = None, first_shift: int = 2
    ):
        self.items = []
        total = 0
        for i in range(len(states)):
            s, e = int(states.offsets[i]), int(states.offsets[i + 1])
            targets = stream_labels(states.labels[s:e], num_streams, first_shift)
            for a in range(0, e - s, segment_length):
                b = min(a + segment_length, e - s)
                tg = targets[a:b]
                if not bool((tg != IGNORE_INDEX).any()):
                    continue
                self.items.append((states.hidden[s + a : s + b], tg, torch.arange(a, b)))
                total += b - a
                if max_tokens is not None and total >= max_tokens:
                    return

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        h, t, p = self.items[i]
        return {"hidden": h, "targets": t, "position_ids": p}


@dataclass
class StreamCollator:
    """Right-pads segments: ``hidden (B, T, H)`` float32, ``targets (B, T, gamma)`` (-100 on padding),
    ``position_ids (B, T)``. Right padding cannot leak into earlier positions under the causal mask."""

    dtype: torch.dtype = torch.float32

    def __call__(self, features: Sequence[dict]) -> dict:
        T = max(f["hidden"].shape[0] for f in features)
        B, H, G = len(features), features[0]["hidden"].shape[-1], features[0]["targets"].shape[-1]
        hidden = torch.zeros(B, T, H, dtype=self.dtype)
        targets = torch.full((B, T, G), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(B, T, dtype=torch.long)
        for b, f in enumerate(features):
            n = f["hidden"].shape[0]
            hidden[b, :n] = f["hidden"].to(self.dtype)
            targets[b, :n] = f["targets"]
            positions[b, :n] = f["position_ids"]
            positions[b, n:] = f["position_ids"][-1] + 1 + torch.arange(T - n)
        return {"hidden": hidden, "targets": targets, "position_ids": positions}


class SpeculativeStreamingTrainer(DrafterTrainer):
    """Lossless mode: only the streams' parameters train; the loss is `streaming_loss` with alpha_0 = 0."""

    def __init__(self, *args, stream_weights: Sequence[float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stream_weights = stream_weights

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        states = model.streams_from_hidden(inputs["hidden"].to(model.dtype), inputs["position_ids"])
        per_stream = stream_losses(model.lm_head, states, inputs["targets"])
        weights = self.stream_weights or [1.0] * per_stream.shape[0]
        loss = streaming_loss(per_stream, weights)
        self.record_parts({f"loss_stream{j + 1}": v.detach() for j, v in enumerate(per_stream)})
        return (loss, states) if return_outputs else loss


@torch.no_grad()
def stream_accuracies(model, states: HiddenStates, top: int = 10, segment_length: int = 256) -> list[list[float]]:
    """``acc[j][i]``: share of held-out positions where stream j+1's i-th ranked token is its target."""
    G = model.config.num_streams
    data = StreamSegmentDataset(states, G, segment_length)
    hits = torch.zeros(G, top, dtype=torch.float64)
    counts = torch.zeros(G, dtype=torch.float64)
    for item in data.items:
        h, tg, pos = item
        out = model.streams_from_hidden(h[None].to(model.dtype), pos[None])[0]  # (T, G, H)
        valid = tg != IGNORE_INDEX
        for j in range(G):
            rows = valid[:, j]
            if bool(rows.any()):
                ranked = torch.topk(model.lm_head(out[rows, j]), top, dim=-1).indices
                hits[j] += (ranked == tg[rows, j][:, None]).sum(0).double()
                counts[j] += rows.sum()
    return (hits / counts.clamp_min(1)[:, None]).tolist()


class StreamCurveCallback(LearningCurveCallback):
    """The learning curve: held-out stream accuracies and the expected tau of the calibrated tree at
    ``num_points`` evenly spaced steps (plus step 0)."""

    def __init__(self, model, held_out: HiddenStates, num_nodes: int = 16, num_points: int = 4, tokens_per_step: int = 0):
        self.model, self.held_out, self.num_nodes, self.num_points = model, held_out, num_nodes, num_points
        self.tokens_per_step = tokens_per_step
        self.curve: list[dict] = []

    def _record(self, step: int) -> None:
        from ...trees import TreeSpec
        from ..medusa.tree_calibration import expected_acceptance_length

        was = self.model.training
        self.model.eval()
        acc = stream_accuracies(self.model, self.held_out)
        tree = TreeSpec.optimize(acc, self.num_nodes)
        self.curve.append({
            "step": step,
            "train_tokens": step * self.tokens_per_step,
            "stream_top1": [round(r[0], 4) for r in acc],
            "expected_tau_calibrated": round(expected_acceptance_length(tree, acc), 4),
        })
        self.model.train(was)



def train_speculative_streaming(
    model,
    train_states: HiddenStates,
    output_dir: str,
    num_epochs: float = 1.0,
    learning_rate: float = 1e-3,
    batch_size: int = 2,
    segment_length: int = 256,
    max_tokens: int | None = None,
    stream_weights: Sequence[float] | None = None,
    max_steps: int = -1,
    logging_steps: int = 10,
    seed: int = 0,
    progress: bool = True,
    callbacks: list | None = None,
):
    """Train the streams of ``model`` (a `LlamaForSpeculativeStreaming` attached to its frozen base) on cached
    states entering layer N - N_s; returns the Trainer."""
    from transformers import TrainingArguments

    dataset = StreamSegmentDataset(train_states, model.config.num_streams, segment_length, max_tokens)
    steps = max_steps if max_steps > 0 else max(1, math.ceil(len(dataset) / batch_size * num_epochs))
    args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_epochs,
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, int(0.05 * steps)),
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
    model.train()
    trainer = SpeculativeStreamingTrainer(
        model=model, args=args, train_dataset=dataset, data_collator=StreamCollator(), callbacks=callbacks, stream_weights=stream_weights
    )
    trainer.train()
    model.eval()
    return trainer
