"""Training an `EagleDrafter` on target-labelled data (the target's features and top-k log-probabilities, computed
once: `hf_speculative.training.labelling`).

Row j of a sequence pairs the token x_{j+1} with the target's feature f_j; the drafter's output g_j drafts x_{j+2}.

* EAGLE-1/2 (EAGLE Sec. 4.3): feature regression ``SmoothL1(g_j, f_{j+1})`` plus ``w_cls`` (0.1 in the paper) times
  the token loss, here a KD loss against the target's stored top-k distribution of x_{j+2}
  (`hf_speculative.training.losses.kd_loss`) through the target's ``lm_head``; optional uniform feature noise.
* EAGLE-3 (EAGLE-3 Sec. 3.2-3.3): no feature loss, the token (KD) loss only, over the draft vocabulary, and the
  *training-time test*: ``steps`` unrolled drafting steps, step s feeding the drafter's own outputs of step s - 1
  back at row j together with the true token x_{j+s+1}, at position j + s, attending to the real-feature rows
  <= j (step 0) and to its own chain at row j (steps 1..s): exactly what tree drafting does at depth s + 1.
  Step s's loss is weighted ``0.8**s`` as in EAGLE-3's reference training.

The draft vocabulary (EAGLE-3's ``d2t`` / ``t2d``) is the most frequent target tokens of the training data
(`hf_speculative.drafters.draft_vocab.frequent_tokens`).
"""

from __future__ import annotations

import math
import sys
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ...training.losses import kd_loss
from ...training.trainer import DrafterTrainer, HiddenStates, train_drafter, training_settings
from .draft_columns import DraftColumns, context_vocab
from .modeling_eagle import EagleDrafter, causal_mask

__all__ = [
    "EagleDataset",
    "EagleCollator",
    "EagleTrainer",
    "eagle_loss",
    "eagle_step_accuracies",
    "calibrate_tree",
    "train_eagle",
    "scale_fc_to_features",
    "hidden_states_from_model",
    "STEP_DECAY",
    "W_CLS",
]

STEP_DECAY = 0.8  # EAGLE-3's reference training weights unrolled step s by 0.8**s
W_CLS = 0.1  # EAGLE Sec. 4.3: L = L_reg + w_cls L_cls


@torch.no_grad()
def hidden_states_from_model(
    model, sequences: Sequence[torch.Tensor], layers: Sequence[int], top_k: int = 8
) -> HiddenStates:
    """Label token sequences with ``model`` in memory (what the labelling command writes to shards): the
    ``output_hidden_states`` rows ``layers`` (``HiddenStates.layers``; ``hidden`` is the final post-norm state),
    every token a training token, and the top-k teacher. For tests and small experiments."""
    n_layers = model.config.num_hidden_layers
    hs, xs, tops, lps, offsets = [], [], [], [], [0]
    extra: dict[int, list[torch.Tensor]] = {int(i): [] for i in layers}
    for seq in sequences:
        ids = torch.as_tensor(seq).reshape(1, -1).to(model.device)
        out = model(input_ids=ids, output_hidden_states=True)
        logp = torch.log_softmax(out.logits[0].float(), -1)
        top = logp.topk(top_k, dim=-1)
        hs.append(out.hidden_states[n_layers][0].float())
        for i in extra:
            extra[i].append(out.hidden_states[i][0].float())
        xs.append(ids[0])
        tops.append(top.indices)
        lps.append(top.values)
        offsets.append(offsets[-1] + ids.shape[1])
    x = torch.cat(xs).long()
    return HiddenStates(
        torch.cat(hs),
        x,
        x.clone(),
        torch.tensor(offsets),
        [str(i) for i in range(len(xs))],
        torch.cat(tops),
        torch.cat(lps),
        {i: torch.cat(v) for i, v in extra.items()},
    )


class EagleDataset(Dataset):
    """Sequences of labelled states, cut into chunks of at most ``max_length`` tokens. An item: ``input_ids (T,)``,
    ``features (T, F)`` (the drafter's target features per position), ``final (T, H)`` (the post-norm final
    state, EAGLE-1/2's regression target), ``predict (T,)`` (row t's teacher predicts an answer token),
    ``topk_ids`` / ``topk_logprobs (T, k)``, ``context_ids`` (the distinct tokens of its prompt positions: what
    drafting adds to a reduced draft vocabulary, `hf_speculative.drafters.eagle.draft_columns`)."""

    def __init__(self, states: HiddenStates, feature_layers: Sequence[int], final_layer: int, max_length: int = 512):
        if not states.has_teacher:
            raise ValueError("EAGLE training needs target-labelled states (topk_ids, topk_logprobs)")
        layers = states.layers or {}
        self.states = states
        self.final_layer = final_layer

        def layer(i):
            if i == final_layer:
                return states.hidden
            if i not in layers:
                raise KeyError(
                    f"layer {i} is not in the labelled data (have {sorted(layers)} and the final {final_layer})"
                )
            return layers[i]

        self.feature_tensors = [layer(int(i)) for i in feature_layers]
        self.spans = []
        offsets = states.offsets.tolist()
        for s, e in zip(offsets[:-1], offsets[1:]):
            for a in range(s, e - 2, max_length):
                b = min(a + max_length, e)
                if b - a >= 3:
                    self.spans.append((a, b))

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> dict:
        a, b = self.spans[i]
        st = self.states
        labels = st.labels[a:b]
        predict = torch.zeros(b - a, dtype=torch.bool)
        predict[:-1] = labels[1:] != -100
        feats = [t[a:b] for t in self.feature_tensors]
        return {
            "input_ids": st.input_ids[a:b],
            "features": torch.cat(feats, -1) if len(feats) > 1 else feats[0],
            "final": st.hidden[a:b],
            "predict": predict,
            "topk_ids": st.topk_ids[a:b].long(),
            "topk_logprobs": st.topk_logprobs[a:b],
            "context_ids": st.input_ids[a:b][labels == -100].unique(),
        }


class EagleCollator:
    """Right-pads a batch of `EagleDataset` items (padded rows never predict; ``context_ids`` padded with -1)."""

    def __call__(self, items: list[dict]) -> dict:
        out = {}
        for key in items[0]:
            T = max(x[key].shape[0] for x in items)
            rows = []
            for x in items:
                t = x[key]
                pad = T - t.shape[0]
                if pad:
                    t = torch.cat([t, t.new_full((pad, *t.shape[1:]), -1 if key == "context_ids" else 0)])
                rows.append(t)
            out[key] = torch.stack(rows)
        return out


def _unrolled_attention(
    attn, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], mask0: torch.Tensor
) -> torch.Tensor:
    """Training-time-test attention: queries ``(B, h, T, d)`` see step 0's keys causally (``mask0``) and, at row j,
    the keys of row j of every later step so far (``keys[1:]``, one per step)."""
    groups = attn.num_heads // attn.num_kv_heads
    rep = (lambda t: t.repeat_interleave(groups, dim=1)) if groups > 1 else (lambda t: t)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = [torch.matmul(q, rep(keys[0]).transpose(-1, -2)) * scale + mask0]
    scores += [(q * rep(k)).sum(-1, keepdim=True) * scale for k in keys[1:]]
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    T = keys[0].shape[2]
    out = torch.matmul(probs[..., :T], rep(values[0]))
    for i, v in enumerate(values[1:]):
        out = out + probs[..., T + i : T + i + 1] * rep(v)
    B, _, Tq, _ = out.shape
    return attn.o_proj(out.transpose(1, 2).reshape(B, Tq, -1))


def _context_logits(drafter: EagleDrafter, hidden: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """``(B, R, E)``: the context tokens' logits of every row, as drafting scores them (the target's ``lm_head`` rows
    of each sequence's ``extra`` tokens against the drafter's normed output; -1 columns at the dtype's minimum)."""
    rows = drafter.base_lm_head.weight.detach()[extra.clamp_min(0)].to(hidden.dtype)
    logits = torch.bmm(drafter.norm(hidden), rows.transpose(1, 2))
    return logits.masked_fill((extra < 0)[:, None, :], torch.finfo(logits.dtype).min)


def _unrolled_steps(drafter: EagleDrafter, batch: dict, steps: int, feature_noise: float = 0.0):
    """The training-time test (module docstring), step by step: yields ``(s, rows, logits, teacher_ids,
    teacher_logprobs, index, columns)`` for unrolled step s, over the rows that predict an answer token (``rows``:
    the drafter's outputs, ``logits`` over its vocabulary and each row's context tokens, the teacher's top-k ids
    and log-probabilities of those rows; ``index``: which of the batch's ``B * (T - 1)`` rows they are;
    ``columns``: the `DraftColumns` of ``logits``)."""
    ids_all, feats_all = batch["input_ids"], batch["features"]
    B, T = ids_all.shape
    R = T - 1  # rows j = 0 .. T - 2 pair x_{j+1} with f_j
    dtype = drafter.fc.weight.dtype
    feats = feats_all[:, :R].to(dtype)
    if feature_noise:
        feats = feats + (torch.rand_like(feats) * 2 - 1) * feature_noise
    layer, attn = drafter.layer, drafter.layer.self_attn
    mask0 = causal_mask(R, dtype, feats.device)
    extra, columns = context_vocab(drafter, batch), DraftColumns(drafter)
    keys, values, hidden = [], [], None
    for s in range(steps):
        if R - s <= 0:
            break
        ids = torch.zeros(B, R, dtype=torch.long, device=ids_all.device)
        ids[:, : R - s] = ids_all[:, 1 + s :]
        embeds = drafter.embed(ids)
        x = drafter.fuse(embeds, feats if s == 0 else None, hidden)
        positions = (torch.arange(R, device=x.device) + s)[None].expand(B, -1)
        cos, sin = drafter.rotary_emb(x, positions)
        q, k, v = attn.qkv(layer.attention_input(x, embeds), cos, sin)
        keys.append(k)
        values.append(v)
        hidden = layer.finish(x, _unrolled_attention(attn, q, keys, values, mask0))
        valid, tid, tlp = _teacher_at_step(batch, s, R, x.device)
        flat = valid.reshape(-1)
        rows = hidden.reshape(B * R, -1)[flat]
        logits, step_columns = drafter.compute_logits(rows), columns
        if extra is not None:
            context = _context_logits(drafter, hidden, extra).reshape(B * R, -1)[flat]
            logits = torch.cat([logits, context.to(logits.dtype)], -1)
            step_columns = columns.with_extra(extra.repeat_interleave(R, 0)[flat])
        yield s, rows, logits, tid.reshape(B * R, -1)[flat], tlp.reshape(B * R, -1)[flat], flat, step_columns


def eagle_loss(
    drafter: EagleDrafter,
    batch: dict,
    steps: int = 1,
    w_cls: float = W_CLS,
    feature_noise: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The EAGLE loss of one padded batch (see the module docstring) and its named parts (``reg``, ``kd_<s>``,
    ``acc_<s>``: top-1 agreement with the target at unrolled step s). EAGLE-3's KD runs over the columns drafting
    scores: the draft vocabulary and, with context tokens, each sequence's prompt tokens outside it (`DraftColumns`);
    teacher mass on tokens without a column is dropped."""
    parts: dict[str, torch.Tensor] = {}
    total = batch["features"].new_zeros((), dtype=torch.float32)
    for s, rows, logits, tid, tlp, index, columns in _unrolled_steps(drafter, batch, steps, feature_noise):
        kd = kd_loss(logits, columns.columns(tid), tlp)
        weight = STEP_DECAY**s
        if not drafter.config.is_eagle3:
            if s == 0:  # EAGLE Sec. 4.3: regress the next feature
                final = batch["final"][:, 1:]
                target = final.to(rows.dtype).reshape(-1, final.shape[-1])[index]
                reg = F.smooth_l1_loss(rows.float(), target.float()) if rows.shape[0] else rows.sum() * 0.0
                parts["reg"] = reg.detach()
                total = total + reg
            total = total + weight * w_cls * kd
        else:
            total = total + weight * kd
        parts[f"kd_{s}"] = kd.detach()
        if rows.shape[0]:
            parts[f"acc_{s}"] = (columns.target_ids(logits.argmax(-1)) == tid[:, 0]).float().mean()
    return total, parts


@torch.no_grad()
def eagle_step_accuracies(
    drafter: EagleDrafter,
    states: HiddenStates,
    steps: int = 6,
    top: int = 4,
    batch_size: int = 8,
    max_length: int = 512,
    final_layer: int | None = None,
) -> list[list[float]]:
    """The drafter's held-out accuracies for its tree calibration (Medusa Sec. 2.3.3, for a drafter that drafts
    depth by depth): ``accuracies[s][i]`` is the share of answer positions of ``states`` where the i-th ranked draft
    of unrolled step s + 1 is the target's greedy token, the drafter fed the true tokens before it and its own
    outputs (the training-time test, EAGLE-3 Sec. 3.2): depth s + 1's accuracy given the path to it is right, as
    `TreeSpec.optimize` multiplies them along a path."""
    final_layer = final_layer or drafter.num_target_layers
    dataset = EagleDataset(states, drafter.config.feature_layers(drafter.num_target_layers), final_layer, max_length)
    collate, device = EagleCollator(), drafter.fc.weight.device
    hits, counts = torch.zeros(steps, top, dtype=torch.float64), torch.zeros(steps, dtype=torch.float64)
    was_training = drafter.training
    drafter.eval()
    for b in range(0, len(dataset), batch_size):
        batch = collate([dataset[i] for i in range(b, min(b + batch_size, len(dataset)))])
        batch = {k: v.to(device) for k, v in batch.items()}
        for s, _rows, logits, tid, _tlp, _index, columns in _unrolled_steps(drafter, batch, steps):
            ranked = columns.target_ids(torch.topk(logits.float(), min(top, logits.shape[-1]), dim=-1).indices)
            hit = (ranked == tid[:, :1]).double().sum(0)
            hits[s, : hit.shape[0]] += hit.cpu()
            counts[s] += tid.shape[0]
    drafter.train(was_training)
    return (hits / counts.clamp_min(1)[:, None]).tolist()


CALIBRATION_DEPTH, CALIBRATION_TOP = 6, 4  # the drafting steps and ranks a tree calibration measures


def calibrate_tree(
    drafter: EagleDrafter, held_out: HiddenStates, max_length: int = 512, progress: bool = True, **record
) -> dict:
    """Set and return ``drafter.config.calibration``: its `eagle_step_accuracies` (in float32) on the labelled
    ``held_out`` states, never trained on, with their token count and ``record``'s entries; with ``progress`` the top-1
    accuracy per drafting step on stderr. The drafter's default tree is then the cost-aware one of the machine it runs
    on (`hf_speculative.drafters.cost_aware`)."""
    was = drafter.dtype
    accuracies = eagle_step_accuracies(
        drafter.float(), held_out, steps=CALIBRATION_DEPTH, top=CALIBRATION_TOP, max_length=max_length
    )
    drafter.to(was)
    drafter.config.calibration = {
        "step_top_i_accuracy": [[round(a, 4) for a in row] for row in accuracies],
        **record,
        "labelled_tokens": int(held_out.input_ids.numel()),
    }
    if progress:
        top1 = [row[0] for row in drafter.config.calibration["step_top_i_accuracy"]]
        print(f"EAGLE calibration (held-out accuracy per drafting step, top-1): {top1}", file=sys.stderr)
    return drafter.config.calibration


def _teacher_at_step(batch: dict, s: int, R: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(valid, topk_ids, topk_logprobs)`` of the ``R`` rows at unrolled step ``s``: row j drafts x_{j+s+2}, the
    teacher's row j + s + 1 (the last s rows have none: not valid, zeros)."""
    B = batch["predict"].shape[0]
    valid = torch.zeros(B, R, dtype=torch.bool, device=device)
    valid[:, : R - s] = batch["predict"][:, 1 + s :]
    tid = torch.zeros(B, R, batch["topk_ids"].shape[-1], dtype=torch.long, device=device)
    tlp = torch.zeros(B, R, batch["topk_logprobs"].shape[-1], device=device)
    tid[:, : R - s] = batch["topk_ids"][:, 1 + s :]
    tlp[:, : R - s] = batch["topk_logprobs"][:, 1 + s :].float()
    return valid, tid, tlp


@torch.no_grad()
def scale_fc_to_features(drafter: EagleDrafter, dataset: "EagleDataset", max_rows: int = 8192, seed: int = 0) -> None:
    """EAGLE-3: a data-dependent init of ``fc`` (our choice, not the paper's): a random projection whose every input
    column is divided by that feature dimension's RMS over the data, so the fused feature f starts at unit scale.

    The target's middle and high layers carry massive activations (SmolLM2-135M: RMS about 50, single values up
    to 2.5e4 at attention-sink tokens); with a plain random ``fc`` the residual f then dwarfs the attention and
    MLP outputs, the token embedding (which enters through attention only) barely moves the prediction, and a
    short training mostly spends itself shrinking ``fc``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in torch.randperm(len(dataset), generator=g)[:64].tolist():
        rows.append(dataset[i]["features"].float())
        if sum(r.shape[0] for r in rows) >= max_rows:
            break
    feats = torch.cat(rows)[:max_rows]
    rms = feats.pow(2).mean(0).sqrt().clamp_min(1e-3)
    fan_in = feats.shape[-1]
    w = torch.randn(drafter.fc.weight.shape, generator=g) / math.sqrt(fan_in) / rms[None, :]
    drafter.fc.weight.copy_(w.to(drafter.fc.weight))
    if drafter.fc.bias is not None:
        drafter.fc.bias.zero_()


class EagleTrainer(DrafterTrainer):
    """`DrafterTrainer` with `eagle_loss` (``steps`` unrolled steps; the KD over the draft vocabulary and the
    context tokens)."""

    def __init__(self, *args, steps: int = 1, w_cls: float = W_CLS, feature_noise: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps, self.w_cls, self.feature_noise = steps, w_cls, feature_noise

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, parts = eagle_loss(model, inputs, self.steps, self.w_cls, self.feature_noise)
        self.record_parts(parts)
        return (loss, {"loss": loss}) if return_outputs else loss


def train_eagle(
    drafter: EagleDrafter,
    states: HiddenStates,
    output_dir: str,
    steps: int | None = None,
    max_length: int = 512,
    final_layer: int | None = None,
    scale_fc: bool = True,
    **training,
) -> EagleTrainer:
    """Train ``drafter`` (attached to its target) on labelled ``states`` with the `EagleTrainer`; ``steps`` unrolled
    drafting steps (default 1 for EAGLE-1/2, 4 for EAGLE-3); ``scale_fc``: EAGLE-3's ``fc`` starts from
    `scale_fc_to_features` (a fresh drafter; pass False to continue training one). ``training``: num_epochs, max_steps,
    batch_size, learning_rate, weight_decay, warmup_steps, logging_steps, seed, progress, callbacks, ``time_budget``
    (seconds; a cosine over the budget, `hf_speculative.training.callbacks.TimeBudgetCallback`), ``save_steps`` /
    ``resume`` (resumable checkpoints in ``output_dir``); defaults `TRAINING_DEFAULTS`, 10 warm-up steps. Returns the trainer (its
    ``state.log_history`` holds the loss parts)."""
    drafter._require_base()
    steps = steps or (4 if drafter.config.is_eagle3 else 1)
    final_layer = final_layer or drafter.num_target_layers
    dataset = EagleDataset(states, drafter.config.feature_layers(drafter.num_target_layers), final_layer, max_length)
    training = training_settings(training, warmup_steps=10)
    if drafter.config.is_eagle3 and scale_fc:
        scale_fc_to_features(drafter, dataset, seed=training["seed"])
    return train_drafter(
        EagleTrainer,
        drafter,
        dataset,
        EagleCollator(),
        output_dir,
        trainer_kwargs={"steps": steps, "feature_noise": drafter.config.feature_noise},
        **training,
    )
