"""The tree speculative decoding loop: draft, verify, accept, commit, compact the cache, repeat.

`tree_speculative_decoding` has the signature of transformers' decoding methods (``GenerationMixin._sample``)
and is handed to ``generate(custom_generate=...)``, so generate prepares inputs, the generation config,
logits processors, stopping criteria and the cache exactly as it does for plain decoding.

**Batches.** B left-padded prompts (with ``attention_mask``) decode together, one target forward per step:

* every row still generating drafts its own tree; the trees are padded to the widest (padding nodes see
  only themselves and are never accepted) and verified in ONE forward of shape ``(A, n)`` with a per-row
  4D tree mask and per-row position ids (a row's position = the number of real tokens before it);
* each row accepts its own path (the acceptance walk runs per row over that row's verified logits);
* cache lengths stay one common length, BASS-PAD style: every row keeps ``m = max(accepted path
  lengths)`` new columns (`hf_speculative.engine.cache.keep_paths`, one gather per layer), and the columns past a
  shorter row's path are *holes* that a per-row visibility matrix (``visible``, ``(A, C)``) hides in every
  later mask, exactly as the prompts' left padding is hidden. Positions count real tokens only, so a row's
  keys and queries carry the positions plain decoding gives them and each row is exact. Compacting each row
  (shifting its cache left) would avoid the holes but costs a copy of the whole cache per step; holes cost
  at most ``m - len(path)`` masked columns per step, bounded by the tree depth;
* a row that finishes (EOS, a stopping criterion, ``max_new_tokens``) leaves the batch: its cache row, mask
  row and drafting state are dropped, so later forwards carry only the rows still generating. Without an
  EOS criterion plain `generate` keeps extending finished rows until every row is finished; so does this
  loop, so each row's tokens and the output length equal plain batched `generate`'s.

**Sliding windows.** Sliding-window cache layers are turned into full-length layers (`prepare_tree_cache`)
and the window is applied in the masks (keys whose position is ``>= window`` before the query's are hidden):
one mask for models whose every layer slides (Mistral), a ``{"full_attention", "sliding_attention"}``
mapping for hybrid models (Qwen2 ``use_sliding_window``, Gemma-2-like ``layer_types``). The window comes
from the model's config, whatever cache the caller built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .._compat import cache_arg, model_kwargs_cache
from .acceptance import AcceptanceSettings, accept_greedy_all
from .cache import attention_window, keep_paths, prepare_tree_cache
from .logits import NodeLogits
from .policy import speed_policy
from .protocol import TreeDrafter
from .rows import TargetRows
from .step_pricing import pricer_for, pricing_enabled
from .tree_forward import verification_forward
from .trees import BatchTreeMaskBuffer, DraftingOptions, DraftTree, DynamicTree, TreeSpec, batch_tree_block

__all__ = [
    "SpeculativeStats",
    "SpeculativeGenerateOutput",
    "tree_speculative_decoding",
    "check_tree_attention",
    "attention_window",
]

TREE_ATTENTION = ("eager", "sdpa")


@dataclass
class SpeculativeStats:
    """What one speculative `generate` call did.

    ``accepted_lengths[i]``: tokens committed by target forward i (the prefill forward commits 1; a tree
    step commits its accepted drafted tokens plus the bonus token). tau is their mean.
    ``timings`` (seconds): ``draft`` (drafter calls), ``target`` (target forwards), ``engine`` (masks,
    acceptance, cache compaction, bookkeeping).

    With a batch: ``accepted_lengths[i]`` sums the tokens all rows committed in forward i, and ``rows[b]``
    holds row b's own statistics (its ``accepted_lengths`` per forward it took part in: its tau). With one
    row ``rows[0]`` repeats the call's numbers.
    """

    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "target": 0.0, "engine": 0.0})
    rows: list["SpeculativeStats"] = field(default_factory=list)

    @property
    def mean_accepted_length(self) -> float:
        """tau: mean tokens committed per target forward and row, bonus token included (1.0 = no speedup)."""
        if len(self.rows) > 1:
            forwards = sum(r.num_target_forwards for r in self.rows)
            return sum(r.num_new_tokens for r in self.rows) / max(forwards, 1)
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def num_target_forwards(self) -> int:
        return len(self.accepted_lengths)

    @property
    def num_new_tokens(self) -> int:
        return sum(self.accepted_lengths)


@dataclass
class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus the speculative statistics of the call."""

    speculative_stats: SpeculativeStats | None = None


def check_tree_attention(model) -> None:
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in TREE_ATTENTION:
        raise ValueError(
            f"{type(model).__name__} uses attn_implementation={impl!r}, which cannot take the arbitrary tree attention "
            "mask of a speculative tree step. Load the model with attn_implementation='sdpa' (or 'eager'), or call "
            "`model.set_attn_implementation('sdpa')`."
        )


class _Timer:
    """Adds a block's wall time to ``timings[key]``; synchronizes CUDA first so GPU splits are real."""

    def __init__(self, timings: dict, key: str, device: torch.device | None = None):
        self.timings, self.key = timings, key
        self.sync = device is not None and device.type == "cuda"

    def __enter__(self):
        if self.sync:
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.sync:
            torch.cuda.synchronize()
        self.timings[self.key] += time.perf_counter() - self.start


class _Row:
    """One prompt of the batch: its committed tokens (left padding included, as generate returns them) and
    its stopping state."""

    def __init__(self, ids: torch.LongTensor, pad: int):
        self.ids, self.pad = ids, pad
        self.finished_at: int | None = None  # sequence length at which its stopping criteria fired
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []
        self.stats = SpeculativeStats()

    @property
    def sequence(self) -> torch.LongTensor:
        """What the drafter sees: the committed tokens without the prompt's padding."""
        return self.ids[:, self.pad :] if self.pad else self.ids


class _Batch:
    """The rows still generating and the bookkeeping of the shared cache.

    ``active[a]`` is the original row of cache row a; ``visible`` ``(A, C)`` marks the cache columns that hold
    row a's real tokens; ``next_position[a]`` is the position of row a's root (its real token count);
    ``column_positions`` ``(A, C)`` the position of every column (kept only when a sliding window needs it).
    """

    def __init__(self, rows: list[_Row], visible: torch.Tensor, column_positions: torch.Tensor, keep_positions: bool):
        self.rows = rows
        self.active = list(range(len(rows)))
        self.visible = visible
        self.next_position = visible.sum(-1)
        self.column_positions = column_positions if keep_positions else None

    def sequences(self) -> list[torch.LongTensor]:
        return [self.rows[r].sequence for r in self.active]

    def tree_inputs(self, drafts: list[DraftTree], device) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``position_ids`` ``(A, n)`` of the drafts, padded to the widest with root tokens at
        the root's position."""
        if len(drafts) == 1:
            draft = drafts[0]
            return draft.tokens.to(device)[None], self.next_position[:, None] + draft.depths.to(device)[None]
        n = max(len(d) for d in drafts)
        tokens = torch.stack([torch.cat([d.tokens, d.tokens[:1].expand(n - len(d))]) for d in drafts]).to(device)
        depths = torch.zeros(len(drafts), n, dtype=torch.long)
        for a, d in enumerate(drafts):
            depths[a, : len(d)] = d.depths
        return tokens, self.next_position[:, None] + depths.to(device)

    def append_columns(self, path_lengths: torch.Tensor, m: int) -> None:
        """After `keep_paths`: m new columns per row, the first ``path_lengths[a]`` of them real."""
        new = torch.arange(m, device=self.visible.device)[None]
        if self.column_positions is not None:
            self.column_positions = torch.cat([self.column_positions, self.next_position[:, None] + new], dim=1)
        self.visible = torch.cat([self.visible, new < path_lengths[:, None]], dim=1)
        self.next_position = self.next_position + path_lengths

    def select(self, keep: list[int]) -> torch.Tensor:
        """Keep cache rows ``keep`` (indices into the current rows); returns them as a tensor."""
        index = torch.tensor(keep, dtype=torch.long, device=self.visible.device)
        self.active = [self.active[a] for a in keep]
        self.visible, self.next_position = self.visible[index], self.next_position[index]
        if self.column_positions is not None:
            self.column_positions = self.column_positions[index]
        return index


class _TreeMasks:
    """Each step's attention mask(s) for the verification forward (see the module docstring)."""

    def __init__(self, model, device):
        self.window, self.layout = attention_window(model.config)
        self.dtype = model.dtype
        self.buffer = BatchTreeMaskBuffer(self.dtype, device)
        self.blocks: dict = {}

    def __call__(self, batch: _Batch, drafts: list[DraftTree], position_ids: torch.Tensor):
        block = batch_tree_block(drafts, self.dtype, self.buffer.device, self.blocks)
        full = self.buffer(batch.visible, block)
        if self.window is None:
            return full
        sliding = self._windowed(full, batch, position_ids)
        return sliding if self.layout == "all" else {"full_attention": full, "sliding_attention": sliding}

    def _windowed(self, full: torch.Tensor, batch: _Batch, position_ids: torch.Tensor) -> torch.Tensor:
        if full.shape[-1] <= self.window:  # no key can be `window` positions behind a query (positions <= columns)
            return full
        keys = torch.cat([batch.column_positions, position_ids], dim=1)  # (A, C + n)
        too_old = (position_ids[:, :, None] - keys[:, None, :]) >= self.window
        return full.masked_fill(too_old[:, None], torch.finfo(self.dtype).min)

    def select(self, index: torch.Tensor) -> None:
        self.buffer.select(index)


class _Stopping:
    """Commits accepted tokens as plain decoding would, one stopping check per token and row.

    With an EOS criterion a finished row stops (plain `generate` pads it); without one plain `generate` keeps
    extending finished rows until every row is finished, and so does this loop (`is_done`)."""

    def __init__(self, stopping_criteria, streamer, pad_token_id, keep_scores: bool, keep_logits: bool):
        self.criteria, self.streamer = stopping_criteria, streamer
        self.stop_rows = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
        self.pad_token_id = pad_token_id
        self.keep_scores, self.keep_logits = keep_scores, keep_logits

    def commit(self, row: _Row, tokens: list[int], token_scores, token_logits) -> int:
        """Append ``tokens`` to ``row``; returns how many count (up to the one where the row stops). Without an
        EOS criterion the tokens past a stop are still appended (the row goes on; `output` cuts them off)."""
        length = row.ids.shape[1]
        grown = torch.cat([row.ids, row.ids.new_tensor([tokens])], dim=-1)
        row.ids = grown
        if row.finished_at is not None:
            return 0
        for i in range(len(tokens)):
            if self.keep_scores:
                row.scores.append(token_scores[i])
            if self.keep_logits:
                row.logits.append(token_logits[i])
            if self.streamer is not None:
                self.streamer.put(grown[:, length + i].cpu())
            if bool(self.criteria(grown[:, : length + i + 1], None)[0]):
                row.finished_at = length + i + 1
                if self.stop_rows:
                    row.ids = grown[:, : length + i + 1]
                return i + 1
        return len(tokens)

    def is_done(self, row: _Row, rows: list[_Row]) -> bool:
        if row.finished_at is None:
            return False
        if self.stop_rows:
            return True
        if any(r.finished_at is None for r in rows):
            return False
        return row.ids.shape[1] >= max(r.finished_at for r in rows)

    def output(self, rows: list[_Row]) -> torch.LongTensor:
        """The rows as one tensor, as plain `generate` returns them."""
        if not self.stop_rows:  # finished rows went on decoding; generate stops them all at the last finish
            end = max(r.finished_at for r in rows)
            return torch.cat([r.ids[:, :end] for r in rows])
        if len(rows) == 1:
            return rows[0].ids
        end = max(r.ids.shape[1] for r in rows)
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        return torch.cat([torch.nn.functional.pad(r.ids, (0, end - r.ids.shape[1]), value=int(pad)) for r in rows])


def _check_call(model, input_ids, drafter: TreeDrafter, tree, synced_gpus: bool, streamer) -> TreeSpec:
    if synced_gpus:
        raise ValueError("tree speculative decoding does not support synced_gpus (ZeRO-3/FSDP) generation")
    drafter.attach_target(model)
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(f"a streamer takes one sequence, got a batch of {input_ids.shape[0]}")
    tree = tree if tree is not None else drafter.tree_for_batch(input_ids.shape[0])
    if not isinstance(tree, (TreeSpec, DynamicTree)):
        raise TypeError(f"speculative_tree must be a hf_speculative.TreeSpec or DynamicTree, got {type(tree).__name__}")
    if isinstance(tree, DynamicTree) and not drafter.fills_dynamic_tree:
        raise TypeError(
            f"a DynamicTree has no fixed shape and {type(drafter).__name__} fills static trees only (a TreeSpec); the "
            "drafters that build one per step are Medusa heads, ParallelDrafter, Speculative Streaming and EagleDrafter"
        )
    if drafter.max_depth is not None and tree.depth > drafter.max_depth:
        raise ValueError(
            f"the tree is {tree.depth} deep but {type(drafter).__name__} can fill at most {drafter.max_depth} levels"
        )
    return tree


def _node_scores(logits: NodeLogits, draft: DraftTree, prefix_ids, logits_processor):
    """``node_scores(i)``: the processed scores after node i (what `verify` reads). With no logits processor
    (plain greedy) the raw logits are the scores and no prefix is built."""
    if not logits_processor:
        return lambda node: logits[node]
    tokens = draft.tokens.to(prefix_ids.device)

    def node_scores(node: int) -> torch.Tensor:
        path = draft.path_to(node)[1:]
        prefix = torch.cat([prefix_ids, tokens[path][None]], dim=-1) if path else prefix_ids
        return logits_processor(prefix, logits[node][None])[0]

    return node_scores


# ----------------------------------------------------------------------------- the steps of the loop


def _prefill(model, input_ids, cache, model_kwargs, all_logits: bool = False):
    """One target forward over the prompts (what generate's first step does). ``all_logits``: the logits of every
    prompt position, for a drafter that learns from them (`TreeDrafter.verified_top_k`); else the last only."""
    past_length = cache.get_seq_length()
    kwargs = {}
    if model_kwargs.get("attention_mask") is not None:
        kwargs["attention_mask"] = model_kwargs["attention_mask"]
    if model_kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = model_kwargs["position_ids"][:, past_length:]
    return model(
        input_ids=input_ids[:, past_length:],
        **cache_arg(cache),
        use_cache=True,
        output_hidden_states=True,
        logits_to_keep=0 if all_logits else 1,
        **kwargs,
    )


def _top_k(logits: torch.Tensor, k: int, spans: list[tuple[int, int]]) -> list[torch.Tensor] | None:
    """Per row a, the top-``k`` token ids ``(end - start, k)`` of ``logits[a, start:end]``; None when k is 0."""
    if not k:
        return None
    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
    return [top[a, start:end] for a, (start, end) in enumerate(spans)]


def _draft(
    drafter: TreeDrafter, batch: _Batch, tree: TreeSpec, options: DraftingOptions, drafting: bool
) -> list[DraftTree]:
    """1. every row still generating drafts its tree (or, on a one-token step the pricer chose, its root alone)."""
    if not drafting:
        return [DraftTree(tokens=seq[0, -1:].clone(), parents=(-1,)) for seq in batch.sequences()]
    return drafter.propose_batch(batch.sequences(), list(batch.active), tree, options)


def _verify(model, drafter: TreeDrafter, batch: _Batch, drafts, masks: _TreeMasks, cache, want_hidden, lazy_head):
    """2. one target forward over all rows' trees (pruned inside it by a drafter with a pruning hook); returns the
    outputs and the drafts they verified."""
    device = batch.visible.device
    input_ids, position_ids = batch.tree_inputs(drafts, device)
    no_rows = torch.empty(0, dtype=torch.long, device=device)
    with speed_policy(model).engine_kernels(
        model, rows=input_ids.numel()
    ):  # the linear layers at this machine's cost for that many rows
        return verification_forward(
            model,
            drafter,
            drafts,
            lambda pruned, positions: masks(batch, pruned, positions),
            input_ids=input_ids,
            attention_mask=masks(batch, drafts, position_ids),
            position_ids=position_ids,
            **cache_arg(cache),
            use_cache=True,
            output_hidden_states=want_hidden or lazy_head is not None,
            # with the lazy head the forward computes no logits itself: `NodeLogits` computes the rows the walk reads
            logits_to_keep=no_rows if lazy_head is not None else 0,
        )


def _accept(accept, outputs, drafts, batch: _Batch, lazy_head, logits_processor, project=None):
    """3. per row, the longest valid path and the bonus token: greedy over every node's logits in tensor ops when
    the forward computed them all and no logits processor applies; else the walk over lazily computed rows."""
    logits = [NodeLogits(outputs, lazy_head, d, row=a, project=project) for a, d in enumerate(drafts)]
    if accept is None and lazy_head is None and not logits_processor:
        return [accept_greedy_all(d, outputs.logits[a, : len(d)]) for a, d in enumerate(drafts)], logits
    NodeLogits.prefetch(logits)
    walk = accept or AcceptanceSettings().acceptor(do_sample=False)
    results = [
        walk(d, _node_scores(lg, d, batch.rows[r].ids, logits_processor))
        for d, lg, r in zip(drafts, logits, batch.active)
    ]
    return results, logits


def _commit(stopping: _Stopping, batch: _Batch, drafts, results, logits, stats: SpeculativeStats) -> None:
    """4. append each row's accepted tokens, stopping where plain decoding would."""
    total = 0
    for d, result, lg, r in zip(drafts, results, logits, batch.active):
        row = batch.rows[r]
        committed = stopping.commit(row, result.tokens, result.scores, [lg[i] for i in result.path])
        row.stats.accepted_lengths.append(committed)
        row.stats.tree_sizes.append(len(d))
        total += committed
    stats.accepted_lengths.append(total)
    stats.tree_sizes.append(sum(len(d) for d in drafts))


def _compact_cache(cache, batch: _Batch, past_length: int, results) -> None:
    """5. the cache keeps each row's accepted path (`keep_paths`); shorter rows' extra columns become holes."""
    paths = [r.path for r in results]
    m = keep_paths(cache, past_length, paths)
    lengths = torch.tensor([len(p) for p in paths], device=batch.visible.device)
    batch.append_columns(lengths, m)


def _rows_going_on(stopping: _Stopping, batch: _Batch) -> list[int]:
    """The cache rows whose sequence is not done (see `_Stopping.is_done`)."""
    return [a for a, r in enumerate(batch.active) if not stopping.is_done(batch.rows[r], batch.rows)]


def _advance_drafter(drafter: TreeDrafter, batch: _Batch, going_on: list[int], drafts, results, outputs) -> None:
    """6. the drafter catches up with the committed sequences of the rows that go on (with the verified logits'
    top-k of their tree nodes when it asked for them)."""
    if going_on:
        k = drafter.verified_top_k
        top_k = _top_k(outputs.logits[going_on], k, [(0, len(drafts[a])) for a in going_on]) if k else None
        drafter.advance_batch(
            [batch.rows[batch.active[a]].sequence for a in going_on],
            [batch.active[a] for a in going_on],
            [drafts[a] for a in going_on],
            [results[a] for a in going_on],
            TargetRows(outputs, rows=going_on, columns=batch.visible, top_k=top_k),
        )


def _drop_finished_rows(batch: _Batch, going_on: list[int], cache, masks: _TreeMasks) -> None:
    """7. rows that are done leave the batch: their cache rows, mask rows and bookkeeping."""
    if not going_on:
        batch.active = []
    elif len(going_on) < len(batch.active):
        index = batch.select(going_on)
        cache.batch_select_indices(index)
        masks.select(index)


def _start(input_ids, model_kwargs, keep_positions: bool) -> _Batch:
    """The rows of the call: prompts, left padding (from ``attention_mask``) and the positions generate prepared."""
    attention_mask = model_kwargs.get("attention_mask")
    visible = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions = model_kwargs.get("position_ids")
    positions = positions if positions is not None else (visible.long().cumsum(-1) - 1).clamp_min(0)
    pads = (~visible).sum(-1).tolist()
    rows = [_Row(input_ids[b : b + 1], int(pads[b])) for b in range(input_ids.shape[0])]
    return _Batch(rows, visible, positions, keep_positions)


def _first_tokens(outputs, input_ids, logits_processor, do_sample: bool):
    """The prefill's new token per row, exactly as plain decoding draws it (batched)."""
    raw = outputs.logits[:, -1].float()
    scores = logits_processor(input_ids, raw)
    if do_sample:
        tokens = torch.multinomial(torch.softmax(scores, -1), 1)[:, 0]
    else:
        tokens = torch.argmax(scores, -1)
    return tokens.tolist(), scores, raw


@torch.no_grad()
def tree_speculative_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    *,
    drafter: TreeDrafter,
    tree: TreeSpec | None = None,
    acceptance: AcceptanceSettings | str | None = None,
    pricing: bool | None = None,
    **model_kwargs,
):
    """Tree speculative decoding of a batch of sequences; called by `generate` after its usual preparation.

    Each step: (1) draft a tree per row, (2) verify all of them in one target forward, (3) accept each row's
    longest valid path, (4) commit its tokens with the stopping checks plain decoding makes, (5) compact the
    cache to the accepted paths, (6) let the drafter catch up, (7) drop the rows that are done.
    """
    tree = _check_call(model, input_ids, drafter, tree, synced_gpus, streamer)
    priced = drafter  # the step prices follow the drafter the caller gave (`step_pricing.pricer_for`)
    cache = model_kwargs_cache(model_kwargs)
    prepare_tree_cache(cache)
    device = input_ids.device
    do_sample = bool(generation_config.do_sample)
    options = DraftingOptions(do_sample, float(generation_config.temperature or 1.0))
    settings = AcceptanceSettings.resolve(acceptance)
    accept = settings.acceptor(do_sample) if do_sample else None  # None: greedy
    want_hidden = drafter.needs_target_hidden_states
    stopping = _stopping_for(stopping_criteria, streamer, generation_config)
    stats = SpeculativeStats()
    masks = _TreeMasks(model, device)

    batch, prefill = _prefill_and_begin(
        model, input_ids, cache, model_kwargs, drafter, stopping, masks, stats, logits_processor, do_sample
    )
    # a drafter that reads every node's logits gets them from the verification forward itself (no lazy head)
    lazy_head = None if drafter.verified_top_k else NodeLogits.lazy_head(model, prefill)
    project = speed_policy(model).head_projector(lazy_head) if lazy_head is not None else None
    del prefill

    pricer = pricer_for(priced, model, len(batch.rows)) if pricing_enabled(pricing) else None
    while batch.active:
        _speculative_step(
            model,
            drafter,
            batch,
            tree,
            options,
            cache,
            masks,
            stats,
            stopping,
            pricer,
            accept,
            logits_processor,
            want_hidden,
            lazy_head,
            project,
            device,
        )

    drafter.end_batch()
    if streamer is not None:
        streamer.end()
    return _output(stopping, batch, cache, input_ids.shape[1], generation_config, stats)


def _stopping_for(stopping_criteria, streamer, generation_config) -> _Stopping:
    """The stopping checks plain decoding makes, keeping the scores/logits `generate` was asked to return."""
    return_dict = generation_config.return_dict_in_generate
    return _Stopping(
        stopping_criteria,
        streamer,
        generation_config._pad_token_tensor,
        keep_scores=bool(return_dict and generation_config.output_scores),
        keep_logits=bool(return_dict and generation_config.output_logits),
    )


def _speculative_step(
    model,
    drafter,
    batch,
    tree,
    options,
    cache,
    masks,
    stats,
    stopping,
    pricer,
    accept,
    logits_processor,
    want_hidden: bool,
    lazy_head,
    project,
    device: torch.device,
) -> None:
    """One step over the active rows: draft, verify, accept, commit, compact the cache, let the drafter catch
    up and drop the rows that are done; each phase timed (and priced when a pricer is given)."""
    past_length = batch.visible.shape[1]  # the roots (last committed tokens) are not cached yet
    drafting, rows, step_start = pricer is None or pricer.draft_this_step(), len(batch.active), time.perf_counter()
    with _Timer(stats.timings, "draft", device):
        drafts = _draft(drafter, batch, tree, options, drafting)
    with _Timer(stats.timings, "target", device):
        outputs, drafts = _verify(model, drafter, batch, drafts, masks, cache, want_hidden, lazy_head)
    with _Timer(stats.timings, "engine", device):
        results, logits = _accept(accept, outputs, drafts, batch, lazy_head, logits_processor, project)
        _commit(stopping, batch, drafts, results, logits, stats)
        _compact_cache(cache, batch, past_length, results)
        going_on = _rows_going_on(stopping, batch)
    head_seconds = sum(lg.seconds for lg in logits)  # the LM head is the target's work, not the engine's
    stats.timings["engine"] -= head_seconds
    stats.timings["target"] += head_seconds
    with _Timer(stats.timings, "draft", device):
        _advance_drafter(drafter, batch, going_on, drafts, results, outputs)
    with _Timer(stats.timings, "engine", device):
        _drop_finished_rows(batch, going_on, cache, masks)
    if pricer is not None:  # a step whose drafts hold no node past the root was a one-token step
        drafted = drafting and stats.tree_sizes[-1] > rows
        pricer.record(drafted, time.perf_counter() - step_start, stats.accepted_lengths[-1], rows)


def _prefill_and_begin(
    model, input_ids, cache, model_kwargs, drafter, stopping, masks, stats, logits_processor, do_sample
):
    """The prefill: one target forward over the prompts commits each row's first new token, exactly as plain
    generate; the drafter begins from it (with the prompt positions' top-k when it reads them). Returns the batch
    and the prefill's outputs."""
    device = input_ids.device
    batch = _start(input_ids, model_kwargs, keep_positions=masks.window is not None)
    stats.rows = [row.stats for row in batch.rows]
    top_k = drafter.verified_top_k
    with _Timer(stats.timings, "target", device):
        outputs = _prefill(model, input_ids, cache, model_kwargs, all_logits=bool(top_k))
    first, scores, raw = _first_tokens(outputs, input_ids, logits_processor, do_sample)
    with _Timer(stats.timings, "draft", device):
        pads = [row.pad for row in batch.rows]
        width = outputs.logits.shape[
            1
        ]  # the prompt positions this forward computed (a cached prefix is not among them)
        spans = [(max(pad - (input_ids.shape[1] - width), 0), width) for pad in pads]
        prompt_top_k = _top_k(outputs.logits, top_k, spans) if top_k else None
        drafter.begin_batch(
            [row.sequence for row in batch.rows],
            TargetRows(outputs, starts=pads, columns=batch.visible, top_k=prompt_top_k),
        )
    for b, row in enumerate(batch.rows):
        row.stats.accepted_lengths.append(stopping.commit(row, [first[b]], [scores[b]], [raw[b]]))
    stats.accepted_lengths.append(len(batch.rows))
    _drop_finished_rows(batch, _rows_going_on(stopping, batch), cache, masks)
    return batch, outputs


def _output(
    stopping: "_Stopping", batch: "_Batch", cache, prompt_length: int, generation_config, stats: SpeculativeStats
):
    """The sequences as plain `generate` returns them (and the dict output with the speculative statistics)."""
    sequences = stopping.output(batch.rows)
    if len(batch.rows) == 1:
        cache.crop(sequences.shape[1] - 1 - cache.get_seq_length())  # a negative count: the columns to drop
    if not generation_config.return_dict_in_generate:
        return sequences
    steps = sequences.shape[1] - prompt_length
    return SpeculativeGenerateOutput(
        sequences=sequences,
        scores=_per_step(batch.rows, "scores", steps) if stopping.keep_scores else None,
        logits=_per_step(batch.rows, "logits", steps) if stopping.keep_logits else None,
        # with a batch, finished rows left the cache: it is returned for a single sequence only
        **cache_arg(cache if generation_config.use_cache and len(batch.rows) == 1 else None),
        speculative_stats=stats,
    )


def _per_step(rows: list[_Row], name: str, steps: int) -> tuple[torch.Tensor, ...]:
    """Per generated position, the ``(B, V)`` scores (or logits) of every row, as plain `generate` returns them;
    a row that had already finished gets ``-inf`` there (plain decoding would score its padding)."""
    out = []
    for t in range(steps):
        values = [getattr(row, name) for row in rows]
        filler = next(v[t] for v in values if t < len(v))
        out.append(torch.stack([v[t] if t < len(v) else torch.full_like(filler, float("-inf")) for v in values]))
    return tuple(out)
