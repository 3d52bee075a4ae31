"""The tree speculative decoding loop: draft, verify, accept, compact the cache, repeat.

`tree_speculative_decoding` has the signature of transformers' decoding methods (``GenerationMixin._sample``)
and is handed to ``generate(custom_generate=...)``, so generate prepares inputs, the generation config,
logits processors, stopping criteria and the cache exactly as it does for plain decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .cache import check_tree_cache, crop_to, keep_path
from .drafters.base import DraftingOptions, TreeDrafter, vocab_logits
from .trees import DraftTree, TreeMaskBuffer, TreeSpec
from .verify import AcceptanceResult, accept_greedy, accept_sampling, accept_typical

__all__ = ["SpeculativeStats", "SpeculativeGenerateOutput", "tree_speculative_decoding", "check_tree_attention"]

TREE_ATTENTION = ("eager", "sdpa")


@dataclass
class SpeculativeStats:
    """What one speculative `generate` call did.

    ``accepted_lengths[i]``: tokens committed by target forward i (the prefill forward commits 1; a tree
    step commits its accepted drafted tokens plus the bonus token). tau is their mean.
    ``timings`` (seconds): ``draft`` (drafter calls), ``target`` (target forwards), ``engine`` (masks,
    acceptance, cache compaction, bookkeeping).
    """

    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "target": 0.0, "engine": 0.0})

    @property
    def mean_accepted_length(self) -> float:
        """tau: mean tokens committed per target forward, bonus token included (1.0 = no speedup)."""
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


#: rows the LM head computes together when a node's logits are first needed: on CPU BLAS a single-row
#: product with SmolLM2's 49K x 576 head is a slow matrix-vector product (7.9 ms on this project's 2-core
#: machine) while 2-4 rows cost 2.9-3.8 ms in all, so the likely next rows come almost for free.
PREFETCH_ROWS = 4


class NodeLogits:
    """The target's logits per tree node, computed only for the nodes the acceptance walk visits.

    A tree step needs logits at the accepted path and one node past it (a few of the n nodes); the LM
    head over a large vocabulary for every node is a large share of a tree forward's compute. When the
    model's logits are plain ``lm_head(final hidden state)`` (checked once on the prefill: models with
    logit scaling or soft-capping fail the check), the forward keeps a single logit row and the head is
    applied lazily: a visited node's row is computed together with its rank-0 descendants (the path the walk
    most likely takes next, up to `PREFETCH_ROWS` rows) in one product. Otherwise all logits come from the
    forward.
    """

    def __init__(self, outputs, head: torch.nn.Module | None, draft: DraftTree | None = None):
        self.head = head
        self.seconds = 0.0  # time spent in the LM head here: the target's work, not the engine's
        if head is None:
            self.full = outputs.logits[0]
            return
        self.hidden = outputs.hidden_states[-1][0]
        self.rows: dict[int, torch.Tensor] = {}
        children = draft.children if draft is not None else ((),) * self.hidden.shape[0]
        self.first_child = [kids[0] if kids else -1 for kids in children]

    def _compute(self, node: int) -> None:
        nodes = [node]
        while len(nodes) < PREFETCH_ROWS and self.first_child[nodes[-1]] >= 0:
            nodes.append(self.first_child[nodes[-1]])
        nodes = [i for i in nodes if i not in self.rows]
        start = time.perf_counter()
        states = self.hidden[nodes if len(nodes) > 1 else nodes * 2]  # never a single-row product (see above)
        weight = getattr(self.head, "weight", None)
        if isinstance(self.head, torch.nn.Linear) and weight is not None:
            logits = vocab_logits(states, weight)
            if self.head.bias is not None:
                logits = logits + self.head.bias
        else:
            logits = self.head(states)
        for i, node_i in enumerate(nodes):
            self.rows[node_i] = logits[i].float()
        self.seconds += time.perf_counter() - start

    def __getitem__(self, node: int) -> torch.Tensor:
        if self.head is None:
            return self.full[node].float()
        if node not in self.rows:
            self._compute(node)
        return self.rows[node]

    @staticmethod
    def lazy_head(model, prefill_outputs) -> torch.nn.Module | None:
        """The LM head when ``logits == lm_head(hidden_states[-1])`` holds for this model, else None."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        hidden = getattr(prefill_outputs, "hidden_states", None)
        if head is None or not hidden:
            return None
        reference = prefill_outputs.logits[:, -1].float()
        recomputed = head(hidden[-1][:, -1]).float()
        return head if torch.allclose(recomputed, reference, rtol=1e-4, atol=1e-4) else None


class _Committer:
    """Appends accepted tokens to the sequence as plain decoding would, one stopping check per token.

    The tokens are appended with one concatenation; the stopping criteria then see each prefix in turn (views
    of the grown sequence), so a stop inside the accepted path truncates exactly where generate would stop.
    """

    def __init__(self, input_ids: torch.LongTensor, stopping_criteria, streamer, keep_scores: bool, keep_logits: bool):
        self.input_ids = input_ids
        self.stopping_criteria, self.streamer = stopping_criteria, streamer
        self.keep_scores, self.keep_logits = keep_scores, keep_logits
        self.scores: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []

    def __call__(self, tokens: list[int], token_scores, token_logits) -> tuple[int, bool]:
        length = self.input_ids.shape[1]
        grown = torch.cat([self.input_ids, self.input_ids.new_tensor([tokens])], dim=-1)
        for i in range(len(tokens)):
            if self.keep_scores:
                self.scores.append(token_scores[i][None])
            if self.keep_logits:
                self.logits.append(token_logits[i][None])
            if self.streamer is not None:
                self.streamer.put(grown[:, length + i].cpu())
            if bool(self.stopping_criteria(grown[:, : length + i + 1], None)[0]):
                self.input_ids = grown[:, : length + i + 1]
                return i + 1, True
        self.input_ids = grown
        return len(tokens), False


def _acceptance(drafter: TreeDrafter, acceptance: str | None, do_sample: bool, generator):
    mode = acceptance if acceptance is not None else drafter.acceptance
    if mode not in (None, "exact", "typical"):
        raise ValueError(f"speculative_acceptance must be 'exact' or 'typical', got {mode!r}")
    if not do_sample:  # greedy: argmax through the tree (typical acceptance with T=0 is greedy, Medusa 2.3.1)
        return accept_greedy
    if mode == "typical":
        return lambda tree, scores: accept_typical(
            tree, scores, drafter.posterior_threshold, drafter.posterior_alpha, True, generator
        )
    return lambda tree, scores: accept_sampling(tree, scores, generator)


def _check_call(model, input_ids, drafter: TreeDrafter, tree, synced_gpus: bool) -> TreeSpec:
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"tree speculative decoding supports batch size 1 for now, got {input_ids.shape[0]} sequences "
            "(num_return_sequences > 1 counts too); generate them one at a time"
        )
    if synced_gpus:
        raise ValueError("tree speculative decoding does not support synced_gpus (ZeRO-3/FSDP) generation")
    check_tree_attention(model)
    tree = tree if tree is not None else drafter.default_tree
    if not isinstance(tree, TreeSpec):
        raise TypeError(f"speculative_tree must be a hf_speculative.TreeSpec, got {type(tree).__name__}")
    if drafter.max_depth is not None and tree.depth > drafter.max_depth:
        raise ValueError(
            f"the tree is {tree.depth} deep but {type(drafter).__name__} can fill at most {drafter.max_depth} levels"
        )
    return tree


def _node_scores(logits: NodeLogits, draft: DraftTree, tokens: torch.Tensor, input_ids, logits_processor):
    """``node_scores(i)``: the processed scores after node i (what `verify` reads). With no logits processor
    (plain greedy) the raw logits are the scores and no prefix is built."""
    if not logits_processor:
        return lambda node: logits[node]

    def node_scores(node: int) -> torch.Tensor:
        path = draft.path_to(node)[1:]
        prefix = torch.cat([input_ids, tokens[path][None]], dim=-1) if path else input_ids
        return logits_processor(prefix, logits[node][None])[0]

    return node_scores


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
    acceptance: str | None = None,
    **model_kwargs,
):
    """Tree speculative decoding of one sequence; called by `generate` after its usual preparation.

    Each step: the drafter proposes a tree (`propose`), one target forward verifies it (`verify`), the
    acceptance rule walks it (`accept`), the accepted tokens are committed with the stopping checks plain
    decoding makes, the cache keeps the accepted path only (`keep_path`), and the drafter catches up
    (`advance`).
    """
    tree = _check_call(model, input_ids, drafter, tree, synced_gpus)
    cache = model_kwargs.get("past_key_values")
    check_tree_cache(cache)
    device = input_ids.device
    do_sample = bool(generation_config.do_sample)
    generator = None
    options = DraftingOptions(do_sample, float(generation_config.temperature or 1.0), generator)
    accept = _acceptance(drafter, acceptance, do_sample, generator)
    want_hidden = drafter.needs_target_hidden_states
    return_dict = generation_config.return_dict_in_generate
    commit = _Committer(
        input_ids, stopping_criteria, streamer,
        keep_scores=bool(return_dict and generation_config.output_scores),
        keep_logits=bool(return_dict and generation_config.output_logits),
    )  # fmt: skip
    stats = SpeculativeStats()

    # Padding (batch 1 with a left-padded prompt): hidden prefix columns and shifted positions.
    attention_mask = model_kwargs.get("attention_mask")
    hidden_prefix = None
    num_hidden = 0
    if attention_mask is not None and not bool(attention_mask.all()):
        hidden_prefix = attention_mask[0].bool()
        num_hidden = int((~hidden_prefix).sum())
    masks = TreeMaskBuffer(model.dtype, device, hidden_prefix)

    # Prefill: one target forward over the prompt commits the first new token, exactly as plain generate.
    past_length = cache.get_seq_length()
    prefill_kwargs = {}
    if attention_mask is not None:
        prefill_kwargs["attention_mask"] = attention_mask
    if model_kwargs.get("position_ids") is not None:
        prefill_kwargs["position_ids"] = model_kwargs["position_ids"][:, past_length:]
    with _Timer(stats.timings, "target", device):
        outputs = model(
            input_ids=input_ids[:, past_length:],
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=True,
            logits_to_keep=1,
            **prefill_kwargs,
        )
    lazy_head = NodeLogits.lazy_head(model, outputs)
    # with the lazy head the verification forward computes no logits itself (an empty row index): the rows the
    # acceptance walk reads come from `NodeLogits`, several per product
    no_rows = torch.empty(0, dtype=torch.long, device=device)
    raw = outputs.logits[:, -1].float()
    scores = logits_processor(input_ids, raw)
    if do_sample:
        first = int(torch.multinomial(torch.softmax(scores, -1), 1, generator=generator))
    else:
        first = int(torch.argmax(scores, -1))
    with _Timer(stats.timings, "draft", device):
        drafter.begin(input_ids, outputs)
    _, stop = commit([first], [scores[0]], [raw[0]])
    stats.accepted_lengths.append(1)

    while not stop:
        sequence = commit.input_ids
        past_length = sequence.shape[1] - 1  # the root (last committed token) is not cached yet
        # 1. draft
        with _Timer(stats.timings, "draft", device):
            draft: DraftTree = drafter.propose(sequence, tree, options)
        # 2. verify: one target forward over the whole tree
        with _Timer(stats.timings, "engine", device):
            mask = masks(draft.ancestors, past_length)
            position_ids = (past_length - num_hidden + draft.depths.to(device))[None]
        with _Timer(stats.timings, "target", device):
            outputs, draft = drafter.verify(
                model,
                draft,
                input_ids=draft.tokens.to(device)[None],
                attention_mask=mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=want_hidden or lazy_head is not None,
                logits_to_keep=no_rows if lazy_head is not None else 0,
            )
        with _Timer(stats.timings, "engine", device):
            tokens = draft.tokens.to(device)  # the verified draft (a drafter may have pruned it)
            logits = NodeLogits(outputs, lazy_head, draft)
            # 3. accept: the longest valid path and the bonus token
            result: AcceptanceResult = accept(draft, _node_scores(logits, draft, tokens, sequence, logits_processor))
            # 4. compact the cache to the accepted path
            keep_path(cache, past_length, result.path)
            # 5. commit tokens, stopping where plain decoding would
            committed, stop = commit(result.tokens, result.scores, [logits[i] for i in result.path])
            stats.accepted_lengths.append(committed)
            stats.tree_sizes.append(len(draft))
            if stop:
                crop_to(cache, commit.input_ids.shape[1] - 1)
        stats.timings["engine"] -= logits.seconds
        stats.timings["target"] += logits.seconds
        # 6. the drafter catches up with the committed sequence
        if not stop:
            with _Timer(stats.timings, "draft", device):
                drafter.advance(commit.input_ids, draft, result, outputs)

    drafter.end()
    if streamer is not None:
        streamer.end()
    if return_dict:
        return SpeculativeGenerateOutput(
            sequences=commit.input_ids,
            scores=tuple(commit.scores) if commit.keep_scores else None,
            logits=tuple(commit.logits) if commit.keep_logits else None,
            past_key_values=cache if generation_config.use_cache else None,
            speculative_stats=stats,
        )
    return commit.input_ids
