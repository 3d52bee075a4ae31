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

import contextlib
import time
from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .._compat import cache_arg, model_kwargs_cache
from .acceptance import AcceptanceSettings, accept_greedy_all
from .batch_state import Batch, Row, SpeculativeStats, StepTimer, Stopping, TreeMasks
from .cache import attention_window, keep_paths, prepare_tree_cache, release_tree_cache
from .drafts import check_drafts, row_processors
from .logits import FinalState, NodeLogits
from .policy import speed_policy
from .protocol import TreeDrafter
from .rows import TargetRows
from .sampling_noise import PositionNoise
from .tree_forward import verification_forward
from .trees import DraftingOptions, DraftTree, DynamicTree, TreeSpec

__all__ = [
    "CallSettings",
    "SpeculativeGenerateOutput",
    "SpeculativeLoop",
    "SpeculativeStats",
    "attention_window",
    "check_tree_attention",
    "tree_speculative_decoding",
]

TREE_ATTENTION = ("eager", "sdpa")


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


@dataclass
class CallSettings:
    """What one ``generate()`` call asked for, besides the model and its inputs."""

    drafter: TreeDrafter
    generation_config: object
    logits_processor: object
    stopping_criteria: object
    streamer: object = None
    tree: TreeSpec | DynamicTree | None = None
    acceptance: AcceptanceSettings | str | None = None
    pricing: bool | None = None


@torch.no_grad()
def tree_speculative_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    **model_kwargs,
):
    """Tree speculative decoding of a batch of sequences; called by `generate` after its usual preparation, with
    the call's ``drafter`` (and ``tree``, ``acceptance``, ``pricing``) among ``model_kwargs``."""
    if synced_gpus:
        raise ValueError("tree speculative decoding does not support synced_gpus (ZeRO-3/FSDP) generation")
    settings = CallSettings(
        drafter=model_kwargs.pop("drafter"),
        generation_config=generation_config,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        streamer=streamer,
        tree=model_kwargs.pop("tree", None),
        acceptance=model_kwargs.pop("acceptance", None),
        pricing=model_kwargs.pop("pricing", None),
    )
    loop = SpeculativeLoop(model, input_ids, settings, model_kwargs)
    try:
        with speed_policy(model).drafter_in_use(settings.drafter):
            loop.prefill()
            while loop.batch.active:
                loop.step()
        return loop.finish()
    finally:
        release_tree_cache(loop.cache)  # the caller's cache holds plain layers again, whatever happened


class SpeculativeLoop:
    """The decoding state of one ``generate()`` call: its rows, cache, masks, stopping checks, statistics, drafter
    and the model's speed policy. `prefill` commits each row's first token; each `step` then drafts a tree per row,
    verifies them all in one forward of the model, accepts each row's longest valid path, commits it, compacts the
    cache and tells the drafter; `finish` returns what plain ``generate()`` returns."""

    def __init__(self, model, input_ids: torch.LongTensor, call: CallSettings, model_kwargs: dict):
        self.model, self.input_ids, self.call, self.model_kwargs = model, input_ids, call, model_kwargs
        self.drafter = call.drafter
        self.tree = _check_call(model, input_ids, self.drafter, call.tree, call.streamer)
        self.policy = speed_policy(model)
        self.cache = model_kwargs_cache(model_kwargs)
        self.device = input_ids.device
        config = call.generation_config
        self.do_sample = bool(config.do_sample)
        self.acceptance = AcceptanceSettings.resolve(call.acceptance)
        # exact sampling draws every token from noise keyed by its row and position: the same tokens whatever the
        # steps drafted (`sampling_noise`); "rejection" keeps the drafters' own sampled siblings
        keyed = self.do_sample and self.acceptance.mode == "exact"
        self.noise = PositionNoise.for_call(self.device) if keyed else None
        self.options = DraftingOptions(self.do_sample and not keyed, float(config.temperature or 1.0))
        self.accept = self.acceptance.acceptor(self.do_sample, noise=self.noise)  # walk(tree, scores, row, position)
        self.processors = call.logits_processor
        self.stopping = _stopping_for(call.stopping_criteria, call.streamer, config)
        self.stats = SpeculativeStats()
        self.masks = TreeMasks(model, self.device)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.pricer = self.lazy_head = self.project = None
        self.final: FinalState | None = None  # the lazy head's final hidden state from one hook (the last forward's)
        prepare_tree_cache(self.cache)  # last: a call refused above leaves the caller's cache as it was

    def timer(self, key: str) -> StepTimer:
        return StepTimer(self.stats.timings, key, self.device)

    # ------------------------------------------------------------------ the prefill

    def prefill(self) -> None:
        """One target forward over the prompts commits each row's first new token, exactly as plain ``generate()``
        (through the speed policy's kernel for that many rows); the drafter begins from it (with the prompt positions'
        top-k when it reads them)."""
        self.batch = _start(self.input_ids, self.model_kwargs, keep_positions=self.masks.window is not None)
        self.stats.rows = [row.stats for row in self.batch.rows]
        top_k = self.drafter.verified_top_k
        new_tokens = self.input_ids[:, self.cache.get_seq_length() :].numel()
        final = FinalState(self.model)
        with self.timer("target"), self.policy.engine_kernels(self.model, rows=new_tokens), final.capture():
            outputs = _prefill(self.model, self.input_ids, self.cache, self.model_kwargs, all_logits=bool(top_k))
        first, scores, raw = self.first_tokens(outputs)
        with self.timer("draft"):
            self.begin_drafter(outputs, top_k)
        for b, row in enumerate(self.batch.rows):
            row.stats.accepted_lengths.append(self.stopping.commit(row, [first[b]], [scores[b]], [raw[b]]))
        self.stats.accepted_lengths.append(len(self.batch.rows))
        self.drop_finished_rows(self.rows_going_on())
        # a drafter that reads every node's logits gets them from the verification forward itself (no lazy head)
        self.lazy_head = None if top_k else NodeLogits.lazy_head(self.model, outputs)
        self.project = self.policy.head_projector(self.lazy_head) if self.lazy_head is not None else None
        # the lazy head reads the final hidden state: from one hook, unless the drafter reads the target's hidden states
        if self.lazy_head is not None and not self.drafter.needs_target_hidden_states and final.check(outputs):
            self.final = final
        if self.call.pricing if self.call.pricing is not None else self.policy.pricing:
            owner = self.drafter if self.drafter.pricing_owner is None else self.drafter.pricing_owner
            self.pricer = self.policy.step_pricer(owner, self.model, len(self.batch.rows))

    def first_tokens(self, outputs):
        """The prefill's new token per row, drawn as every later token is (argmax, or the keyed noise's draw)."""
        raw = outputs.logits[:, -1].float()
        scores = self.processors(self.input_ids, raw)
        if not self.do_sample:
            tokens = torch.argmax(scores, -1)
        elif self.noise is not None:
            lengths = [row.sequence.shape[1] for row in self.batch.rows]
            tokens = torch.stack([self.noise.sample(b, lengths[b], scores[b]) for b in range(len(lengths))])
        else:
            tokens = torch.multinomial(torch.softmax(scores, -1), 1)[:, 0]
        return tokens.tolist(), scores, raw

    def begin_drafter(self, outputs, top_k: int) -> None:
        pads = [row.pad for row in self.batch.rows]
        width = outputs.logits.shape[1]  # the prompt positions this forward computed (a cached prefix is not)
        spans = [(max(pad - (self.input_ids.shape[1] - width), 0), width) for pad in pads]
        prompt_top_k = _top_k(outputs.logits, top_k, spans) if top_k else None
        self.drafter.begin_batch(
            [row.sequence for row in self.batch.rows],
            TargetRows(outputs, starts=pads, columns=self.batch.visible, top_k=prompt_top_k),
        )

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        """One step over the rows still generating: draft, verify, accept, commit, compact, tell the drafter."""
        batch, stats, rows = self.batch, self.stats, len(self.batch.active)
        past_length = batch.visible.shape[1]  # the roots (the last committed tokens) are not cached yet
        drafting = self.pricer is None or self.pricer.draft_this_step()
        start = time.perf_counter()

        # 1. draft: every row drafts its tree (or, on a one-token step the pricer chose, its root alone)
        with self.timer("draft"):
            drafts = self.draft(drafting)

        # 2. verify: one forward of the model over every row's tree, through the speed policy's kernels
        with self.timer("target"):
            outputs, drafts = self.verify(drafts)

        with self.timer("engine"):
            # 3. accept: per row, the longest valid path and the bonus token
            results, logits = self.accept_paths(outputs, drafts)
            # 4. commit: append each row's tokens, stopping where plain decoding would
            committed = 0
            for d, result, lg, r in zip(drafts, results, logits, batch.active):
                row = batch.rows[r]
                row.stats.accepted_lengths.append(
                    self.stopping.commit(row, result.tokens, result.scores, [lg[i] for i in result.path])
                )
                row.stats.tree_sizes.append(len(d))
                committed += row.stats.accepted_lengths[-1]
                if self.noise is not None:
                    self.noise.forget(r, below=row.sequence.shape[1])
            stats.accepted_lengths.append(committed)
            stats.tree_sizes.append(sum(len(d) for d in drafts))
            # 5. compact: the cache keeps each row's accepted path; shorter rows' extra columns become holes
            paths = [result.path for result in results]
            kept = keep_paths(self.cache, past_length, paths)
            batch.append_columns(torch.tensor([len(p) for p in paths], device=batch.visible.device), kept)
            going_on = self.rows_going_on()
        head_seconds = sum(lg.seconds for lg in logits)  # the LM head is the model's work, not the engine's
        stats.timings["engine"] -= head_seconds
        stats.timings["target"] += head_seconds

        # 6. tell the drafter what was committed, for the rows that go on
        with self.timer("draft"):
            self.advance_drafter(going_on, drafts, results, outputs)
        with self.timer("engine"):
            self.drop_finished_rows(going_on)
        if self.pricer is not None:  # a step whose drafts hold no node past the root was a one-token step
            drafted = drafting and stats.tree_sizes[-1] > rows
            self.pricer.record(drafted, time.perf_counter() - start, stats.accepted_lengths[-1], rows)

    def draft(self, drafting: bool) -> list[DraftTree]:
        """Every row's draft (its root alone on a one-token step), checked (`drafts.check_drafts`)."""
        sequences = self.batch.sequences()
        if not drafting:
            return [DraftTree(tokens=seq[0, -1:].clone(), parents=(-1,)) for seq in sequences]
        with self.policy.drafting_kernels(self.drafter):
            drafts = self.drafter.propose_batch(sequences, list(self.batch.active), self.tree, self.options)
        check_drafts(self.drafter, drafts, sequences, self.vocab_size)
        return drafts

    def verify(self, drafts: list[DraftTree]):
        """One target forward over all rows' trees (pruned inside it by a drafter with a pruning hook); returns the
        outputs and the drafts they verified. The speed policy's decoder loop runs it when it serves the model
        (`hf_speculative.engine.decoder_loop`: bitwise the model's forward); else the model's own forward."""
        batch, lazy, final = self.batch, self.lazy_head is not None, self.final
        input_ids, position_ids = batch.tree_inputs(drafts, self.device)
        inputs = dict(
            input_ids=input_ids,
            attention_mask=None if self.one_query(drafts) else self.masks(batch, drafts, position_ids),
            position_ids=position_ids,
            output_hidden_states=self.drafter.needs_target_hidden_states or (lazy and final is None),
            # with the lazy head the forward computes no logits: `NodeLogits` computes the rows the walk reads
            logits_to_keep=torch.empty(0, dtype=torch.long, device=self.device) if lazy else 0,
        )
        loop = self.policy.decoder_loop(self.model) if self.drafter.pruning_layer is None else None
        with self.policy.engine_kernels(self.model, rows=input_ids.numel()):
            if loop is not None:
                outputs = loop(cache=self.cache, **inputs)
                if final is not None:
                    final.state = outputs.final_state
                return outputs, drafts
            with final.capture() if final is not None else contextlib.nullcontext():
                return verification_forward(
                    self.model,
                    self.drafter,
                    drafts,
                    lambda pruned, positions: self.masks(batch, pruned, positions),
                    **cache_arg(self.cache),
                    use_cache=True,
                    **inputs,
                )

    def one_query(self, drafts: list[DraftTree]) -> bool:
        """A one-token step of one row that sees every cached column: it needs no mask (the model's own unmasked
        attention, what plain decoding runs; about 1% of a SmolLM2-135M step), unless a drafter prunes inside the
        forward (its hooks read the mask)."""
        single = len(drafts) == 1 and len(drafts[0]) == 1 and self.drafter.pruning_layer is None
        return single and self.masks.window is None and bool(self.batch.visible.all())

    def accept_paths(self, outputs, drafts: list[DraftTree]):
        """Per row, the longest valid path and the bonus token: greedy over every node's logits in tensor ops when
        the forward computed them all and no logits processor applies; else the walk over lazily computed rows."""
        batch = self.batch
        final, head, project = self.final.state if self.final is not None else None, self.lazy_head, self.project
        logits = [NodeLogits(outputs, head, d, row=a, project=project, final=final) for a, d in enumerate(drafts)]
        if not self.do_sample and self.lazy_head is None and not self.processors:
            return [accept_greedy_all(d, outputs.logits[a, : len(d)]) for a, d in enumerate(drafts)], logits
        NodeLogits.prefetch(logits)
        results = []
        for d, lg, r in zip(drafts, logits, batch.active):
            row = batch.rows[r]
            scores = _node_scores(lg, d, row.ids, row_processors(self.processors, r))
            results.append(self.accept(d, scores, row=r, position=row.sequence.shape[1]))
        return results, logits

    def rows_going_on(self) -> list[int]:
        """The cache rows whose sequence is not done (see `Stopping.is_done`)."""
        batch = self.batch
        return [a for a, r in enumerate(batch.active) if not self.stopping.is_done(batch.rows[r], batch.rows)]

    def advance_drafter(self, going_on: list[int], drafts, results, outputs) -> None:
        """The drafter catches up with the committed sequences of the rows that go on (with the verified logits'
        top-k of their tree nodes when it asked for them)."""
        if not going_on:
            return
        batch, k = self.batch, self.drafter.verified_top_k
        top_k = _top_k(outputs.logits[going_on], k, [(0, len(drafts[a])) for a in going_on]) if k else None
        self.drafter.advance_batch(
            [batch.rows[batch.active[a]].sequence for a in going_on],
            [batch.active[a] for a in going_on],
            [drafts[a] for a in going_on],
            [results[a] for a in going_on],
            TargetRows(outputs, rows=going_on, columns=batch.visible, top_k=top_k),
        )

    def drop_finished_rows(self, going_on: list[int]) -> None:
        """Rows that are done leave the batch: their cache rows, mask rows and bookkeeping."""
        batch = self.batch
        if not going_on:
            batch.active = []
        elif len(going_on) < len(batch.active):
            index = batch.select(going_on)
            self.cache.batch_select_indices(index)
            self.masks.select(index)

    # ------------------------------------------------------------------ the end

    def finish(self):
        """The sequences as plain `generate` returns them (and the dict output with the speculative statistics)."""
        self.drafter.end_batch()
        if self.call.streamer is not None:
            self.call.streamer.end()
        stopping, rows, config = self.stopping, self.batch.rows, self.call.generation_config
        sequences = stopping.output(rows)
        if len(rows) == 1:
            self.cache.crop(sequences.shape[1] - 1 - self.cache.get_seq_length())  # negative: the columns to drop
        if not config.return_dict_in_generate:
            return sequences
        steps = sequences.shape[1] - self.input_ids.shape[1]
        return SpeculativeGenerateOutput(
            sequences=sequences,
            scores=_per_step(rows, "scores", steps) if stopping.keep_scores else None,
            logits=_per_step(rows, "logits", steps) if stopping.keep_logits else None,
            # with a batch, finished rows left the cache: it is returned for a single sequence only
            **cache_arg(self.cache if config.use_cache and len(rows) == 1 else None),
            speculative_stats=self.stats,
        )


# ----------------------------------------------------------------------------- helpers of the loop


def _check_call(model, input_ids, drafter: TreeDrafter, tree, streamer) -> TreeSpec:
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


def _start(input_ids, model_kwargs, keep_positions: bool) -> Batch:
    """The rows of the call: prompts, left padding (from ``attention_mask``) and the positions generate prepared."""
    attention_mask = model_kwargs.get("attention_mask")
    visible = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions = model_kwargs.get("position_ids")
    positions = positions if positions is not None else (visible.long().cumsum(-1) - 1).clamp_min(0)
    pads = (~visible).sum(-1).tolist()
    rows = [Row(input_ids[b : b + 1], int(pads[b])) for b in range(input_ids.shape[0])]
    return Batch(rows, visible, positions, keep_positions)


def _stopping_for(stopping_criteria, streamer, generation_config) -> Stopping:
    """The stopping checks plain decoding makes, keeping the scores/logits `generate` was asked to return."""
    return_dict = generation_config.return_dict_in_generate
    return Stopping(
        stopping_criteria,
        streamer,
        generation_config._pad_token_tensor,
        keep_scores=bool(return_dict and generation_config.output_scores),
        keep_logits=bool(return_dict and generation_config.output_logits),
    )


def _per_step(rows: list[Row], name: str, steps: int) -> tuple[torch.Tensor, ...]:
    """Per generated position, the ``(B, V)`` scores (or logits) of every row, as plain `generate` returns them;
    a row that had already finished gets ``-inf`` there (plain decoding would score its padding)."""
    out = []
    for t in range(steps):
        values = [getattr(row, name) for row in rows]
        filler = next(v[t] for v in values if t < len(v))
        out.append(torch.stack([v[t] if t < len(v) else torch.full_like(filler, float("-inf")) for v in values]))
    return tuple(out)
