"""SuffixDecoding as a tree drafter: Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications" (arXiv 2411.04975). No model and no training: it drafts what followed the context's suffix before.

Each step, for each row (the paper's sections named in brackets):

1. **Match** ["Suffix Tree Construction"]: the longest suffix of the row's sequence, up to ``max_match_length``
   tokens, found in the **global** structure over previous outputs (`SuffixIndex`: every output of this drafter's
   ``generate()`` calls and of `warm`) and in the **per-request** one over the row's own prompt and output.
2. **Expand** ["Speculation Tree Expansion"]: from each match of p tokens, a tree of the continuations seen most
   often, best first, of at most ``MAX_SPEC = ceil(alpha * p)`` nodes (adaptive speculation length: a long match
   drafts deep, a short one little). A node's score is its empirical probability of acceptance, the product of the
   conditional frequencies along its path; nodes below ``min_probability`` are not drafted.
3. **Score and merge** ["Speculation Tree Scoring"]: the global and per-request trees become one trie (a node
   found in both keeps the larger score: the hybrid of the two structures the paper ablates), and the nodes kept are
   the best-scoring ones, within the call's node and depth budget, as many as maximize expected tokens per step
   cost on the target's cost curve (`cost_aware.target_cost_curve`, the pricing `HybridDrafter` uses).
4. **Learn**: when a call ends, each row's output goes into the global structure (the tokens of a row's last step
   excepted: the engine shows a drafter no step after the one that ends a row). Under ``max_cache_bytes`` the
   oldest outputs are evicted.

Drafts are fixed candidates (``sampling="deterministic"``), so the engine's tree rejection sampling keeps sampling
exact. The rows of a batch share the global structure; `SuffixDrafter.for_tenant` gives a drafter that reads it and
learns into a memory of its own, which no other tenant drafts from (docs/suffix_decoding.md, "Shared memory, tenants
and privacy"). ``save_pretrained`` writes ``config.json``
(``model_type: suffix_decoding``) and ``suffix_index.safetensors``; ``AutoModel.from_pretrained`` loads the folder
after ``import hf_speculative``.
"""

from __future__ import annotations

import copy
import math
import os
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from ...engine.protocol import TreeDrafter
from ...engine.rows import TargetRows
from ...engine.trees import DraftingOptions, DraftTree, TreeSpec, budget_tree
from ..cost_aware import target_cost_curve
from ..hybrid import best_nodes as _best_nodes
from ..hybrid import kept_draft, merge_drafts
from .configuration_suffix import SuffixConfig
from .speculation_tree import expand_speculation_tree
from .suffix_index import SuffixIndex, match_in_sequence

__all__ = ["SuffixDrafter"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "suffix_index.safetensors"


class SuffixDrafter(TreeDrafter):
    """SuffixDecoding (see the module docstring)::

        sfx = hfs.SuffixDrafter()                     # or SuffixDrafter(alpha=4.0), SuffixDrafter(config)
        sfx.warm(["earlier outputs ..."], tokenizer)  # optional: a corpus of outputs
        out = model.generate(input_ids, assistant_model=sfx, max_new_tokens=128)

    Args:
        config: a `SuffixConfig`; None: one from ``kwargs``.
        cost_curve: the target's cost curve ``c(n)``; None: the target's cached curve, else the documented default.
        kwargs: `SuffixConfig` fields.
    """

    learns_across_calls = True
    prices_own_draft = True  # `draft` keeps the nodes that pay on the target's cost curve, by the tree's own scores
    config_class = SuffixConfig

    def __init__(self, config: SuffixConfig | None = None, cost_curve=None, **kwargs):
        if config is None:
            config = SuffixConfig.from_settings(type(self).__name__, **kwargs)
        else:
            SuffixConfig.from_settings(type(self).__name__, **kwargs)  # the same check on the keywords given
            for name, value in kwargs.items():
                setattr(config, name, value)
        self.config = config
        #: the memory this drafter learns its outputs into (and `warm` fills)
        self.index = SuffixIndex(config.max_match_length, config.max_cache_bytes)
        #: a tenant's drafter (`for_tenant`): the memory of the drafter it came from, which it reads and never writes
        self.shared: SuffixIndex | None = None
        #: the tenant's name (`for_tenant`); None for a drafter of its own
        self.tenant: str | None = None
        self._owner: SuffixDrafter = self  # the drafter whose memory tenants share
        self._tenants: dict[str, SuffixDrafter] = {}
        self.default_tree = budget_tree(config.max_nodes, config.max_depth)
        self.cost_curve = cost_curve
        self._step_cost = lambda n: 1.0
        self._rows: dict[int, list] = {}  # row -> [prompt length, latest committed sequence]
        #: how many drafting steps matched how many tokens (the longer of the two structures' matches; 0: none)
        self.match_lengths: Counter = Counter()

    @property
    def vocab_size(self) -> int | None:
        return self.config.vocab_size

    # ------------------------------------------------------------------ the corpus
    def warm(self, corpus: Iterable[str | Sequence[int]], tokenizer=None) -> "SuffixDrafter":
        """Add outputs to the global structure: token id lists, or texts encoded with ``tokenizer``."""
        outputs = []
        for item in corpus:
            if isinstance(item, str):
                if tokenizer is None:
                    raise TypeError("warm() got texts: pass the target's tokenizer to encode them")
                item = tokenizer(item, add_special_tokens=False)["input_ids"]
            outputs.append([int(t) for t in item])
        self._check_tokens(outputs)
        self.index.add(outputs)
        return self

    def _check_tokens(self, outputs: list[list[int]]) -> None:
        vocab = self.config.vocab_size
        top = max((max(o) for o in outputs if o), default=-1)
        low = min((min(o) for o in outputs if o), default=0)
        if low < 0 or (vocab is not None and top >= vocab):
            raise ValueError(f"token ids must lie in [0, {vocab}) for this drafter's vocabulary, got {low}..{top}")

    # ------------------------------------------------------------------ tenants
    def for_tenant(self, name: str) -> "SuffixDrafter":
        """The drafter of one tenant (a user, a customer, a conversation) of this drafter's memory::

            sfx = hfs.SuffixDrafter().warm(corpus, tok)
            model.generate(ids, assistant_model=sfx.for_tenant("alice"))

        It drafts from this drafter's memory (its `warm` corpus and the outputs its own calls learned), which it reads
        and never writes, and from a memory of its own, where its calls' outputs go (capped by ``max_cache_bytes``
        like any). Outputs learned under one tenant are never drafted for another. The same name gives the same
        drafter (its memory lives as long as this drafter, or until `forget_tenant`); its config is a copy, so a
        tenant can be set apart (``.config.learn_outputs = False``). Called on a tenant's drafter, it gives the
        sibling of that name. `save_pretrained` of a tenant's drafter writes that tenant's memory only.
        """
        owner = self._owner
        if name in owner._tenants:
            return owner._tenants[name]
        drafter = type(self)(copy.deepcopy(owner.config), cost_curve=owner.cost_curve)
        drafter.shared, drafter.tenant, drafter._owner = owner.index, str(name), owner
        return owner._tenants.setdefault(name, drafter)  # one drafter per name, also when two threads ask at once

    def forget_tenant(self, name: str) -> None:
        """Drop a tenant's drafter and its memory (a later `for_tenant` of the name starts empty)."""
        self._owner._tenants.pop(name, None)

    def _snapshots(self) -> list:
        """The states drafted from, each taken once: the shared memory (a tenant's) and this drafter's own."""
        own = self.index.snapshot
        return [own] if self.shared is None else [self.shared.snapshot, own]

    # ------------------------------------------------------------------ drafting
    def attach_target(self, target) -> None:
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        vocab = int(head.weight.shape[0] if head is not None else target.config.vocab_size)
        if self.config.vocab_size is None:
            top = max((int(snap.codes.max()) - 1 for snap in self._snapshots() if len(snap.codes)), default=-1)
            if top >= vocab:
                raise ValueError(
                    f"vocabulary mismatch: the stored outputs hold token {top} but the target predicts {vocab} tokens"
                )
            self.config.vocab_size = vocab
        self._curve = target_cost_curve(target, self.cost_curve)

    def candidate_tree(self, num_nodes: int | None = None) -> TreeSpec:
        """The budget this drafter fills inside a `HybridDrafter` (which prices the merged tree itself)."""
        return budget_tree(num_nodes or self.config.max_nodes, self.config.max_depth)

    @torch.no_grad()
    def draft(self, sequence: torch.Tensor, tree: TreeSpec) -> DraftTree:
        """This step's tree for one row's committed ``sequence`` (1-D token ids; the root is its last token)."""
        seq = sequence.cpu().numpy().astype(np.int64)
        cfg, root = self.config, int(seq[-1])
        candidates = []
        local, follow = match_in_sequence(seq, cfg.max_match_length)
        if local >= cfg.min_match_length:
            candidates.append(self._expand(seq + 1, follow, root, local, tree))
        longest = local
        for snap in self._snapshots():  # one snapshot per structure: a buffer and the suffix array over it
            length, lo, hi = snap.longest_match(seq, cfg.max_match_length)
            if length >= cfg.min_match_length:
                follow = snap.occurrences(lo, hi, cfg.max_occurrences) + length
                candidates.append(self._expand(snap.codes, follow, root, length, tree))
            longest = max(longest, length)
        self.match_lengths[longest] += 1
        candidates = [c for c in candidates if len(c[0]) > 1]
        if not candidates:
            return DraftTree(tokens=sequence[-1:].clone(), parents=(-1,))
        drafts = [DraftTree(tokens=torch.tensor(tokens), parents=tuple(parents)) for tokens, parents, _ in candidates]
        tokens, parents, scores, depths = merge_drafts(drafts, [scores for _, _, scores in candidates])
        keep = _best_nodes(scores, depths, tree.num_nodes, tree.depth, self._step_cost)
        return kept_draft(tokens, parents, scores, keep, sequence.device)

    def _expand(self, codes: np.ndarray, follow: np.ndarray, root: int, length: int, tree: TreeSpec):
        budget = min(tree.num_nodes, math.ceil(self.config.alpha * length))
        return expand_speculation_tree(codes, follow, root, budget, tree.depth, self.config.min_probability)

    # ------------------------------------------------------------------ the drafter protocol (batched)
    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        self._rows = {j: [prompt.shape[1], prompt] for j, prompt in enumerate(prompts)}
        batch = len(prompts)
        curve = getattr(self, "_curve", None) or (lambda n: 1.0)
        self._step_cost = (lambda n: curve(batch * n) / curve(batch)) if batch > 1 else curve

    def propose_batch(self, sequences, rows, tree: TreeSpec, options: DraftingOptions) -> list[DraftTree]:
        for seq, r in zip(sequences, rows):
            self._rows[r][1] = seq
        return [self.draft(seq[0], tree) for seq in sequences]

    def advance_batch(self, sequences, rows, drafts, results, target_outputs: TargetRows) -> None:
        for seq, r in zip(sequences, rows):
            self._rows[r][1] = seq

    def end_batch(self) -> None:
        """Learn: every row's output (what it generated beyond its prompt) goes into the global structure."""
        if self.config.learn_outputs:
            outputs = [seq[0, start:].tolist() for start, seq in self._rows.values() if seq.shape[1] > start]
            self.index.add(outputs)
        self._rows = {}

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """``config.json`` (the `SuffixConfig`) and ``suffix_index.safetensors`` (this drafter's memory: every output
        it remembers; a tenant's drafter writes its own memory, not the shared one), each written through a unique
        temporary file and ``os.replace``."""
        from safetensors.torch import save_file

        from ...paths import atomic_path, write_atomically

        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / WEIGHTS_NAME) as tmp:
            save_file({k: torch.from_numpy(v) for k, v in self.index.state().items()}, str(tmp))
        write_atomically(folder / CONFIG_NAME, self.config.to_json_string(use_diff=True))

    @classmethod
    def from_pretrained(
        cls, pretrained_path: str | os.PathLike, config: SuffixConfig | None = None, cost_curve=None, **kwargs
    ) -> "SuffixDrafter":
        """Load a folder written by `save_pretrained`, or a Hub repo of one (downloaded through huggingface_hub;
        offline, from its cache); ``kwargs`` override `SuffixConfig` fields.

        Raises ``FileNotFoundError`` for a missing folder, Hub repo or file of it, ``OSError`` for a Hub download that
        fails, ``ValueError`` naming the file for a damaged one (truncated, not safetensors, arrays that disagree, a
        token id outside ``[0, vocab_size)``)."""
        from ..hub import LOADER_ARGUMENTS, drafter_folder

        folder = drafter_folder(pretrained_path, [CONFIG_NAME, WEIGHTS_NAME], "SuffixDecoding drafter", **kwargs)
        config = config if config is not None else SuffixConfig.from_pretrained(folder)
        overrides = {k: v for k, v in kwargs.items() if k not in LOADER_ARGUMENTS}
        unknown = [k for k in overrides if k not in SuffixConfig().to_dict() or k in ("model_type",)]
        if unknown:
            raise TypeError(f"unknown SuffixDrafter argument(s) {unknown}")
        drafter = cls(config, cost_curve=cost_curve, **overrides)
        file = folder / WEIGHTS_NAME
        if not file.is_file():
            raise FileNotFoundError(
                f"no {WEIGHTS_NAME} in {str(folder)!r}: not a folder SuffixDrafter.save_pretrained wrote"
            )
        arrays = _read_index_file(file)
        try:
            drafter.index.load_state(
                arrays["codes"], arrays["suffixes"], arrays["lengths"], vocab_size=drafter.config.vocab_size
            )
        except ValueError as error:
            raise ValueError(f"{file}: {error}") from error
        return drafter


def _read_index_file(file: Path) -> dict[str, np.ndarray]:
    """The arrays of a saved suffix structure; ``ValueError`` naming ``file`` when it is damaged."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        arrays = {k: v.numpy() for k, v in load_file(str(file)).items()}
    except (SafetensorError, ValueError, RuntimeError) as error:
        raise ValueError(f"{file} is damaged (truncated or not safetensors): {error}") from error
    missing = {"codes", "suffixes", "lengths"} - set(arrays)
    if missing:
        raise ValueError(f"{file} is no saved suffix structure: {sorted(missing)} missing")
    return arrays
