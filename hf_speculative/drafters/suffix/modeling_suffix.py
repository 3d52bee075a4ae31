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
exact. The rows of a batch share the global structure. ``save_pretrained`` writes ``config.json``
(``model_type: suffix_decoding``) and ``suffix_index.safetensors``; ``AutoModel.from_pretrained`` loads the folder
after ``import hf_speculative``.
"""

from __future__ import annotations

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
from ..hybrid import merge_drafts
from .configuration_suffix import SuffixConfig
from .speculation_tree import expand_speculation_tree
from .suffix_index import SuffixIndex, match_in_sequence

__all__ = ["SuffixDrafter"]

WEIGHTS_NAME = "suffix_index.safetensors"
#: what ``AutoModel.from_pretrained`` passes besides the config; a drafter with no weights has no use for them
_LOADER_ARGUMENTS = {
    "trust_remote_code",
    "adapter_kwargs",
    "cache_dir",
    "force_download",
    "local_files_only",
    "token",
    "revision",
    "subfolder",
    "proxies",
    "code_revision",
    "_from_auto",
    "_from_pipeline",
    "_commit_hash",
}


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

    config_class = SuffixConfig

    def __init__(self, config: SuffixConfig | None = None, cost_curve=None, **kwargs):
        if config is None:
            config = SuffixConfig(**kwargs)
        else:
            for name, value in kwargs.items():
                setattr(config, name, value)
        self.config = config
        self.index = SuffixIndex(config.max_match_length, config.max_cache_bytes)
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

    # ------------------------------------------------------------------ drafting
    def attach_target(self, target) -> None:
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        vocab = int(head.weight.shape[0] if head is not None else target.config.vocab_size)
        if self.config.vocab_size is None:
            top = int(self.index.codes.max()) - 1 if len(self.index.codes) else -1
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
        length, lo, hi = self.index.longest_match(seq, cfg.max_match_length)
        if length >= cfg.min_match_length:
            follow = self.index.occurrences(lo, hi, cfg.max_occurrences) + length
            candidates.append(self._expand(self.index.codes, follow, root, length, tree))
        self.match_lengths[max(local, length)] += 1
        candidates = [c for c in candidates if len(c[0]) > 1]
        if not candidates:
            return DraftTree(tokens=sequence[-1:].clone(), parents=(-1,))
        drafts = [DraftTree(tokens=torch.tensor(tokens), parents=tuple(parents)) for tokens, parents, _ in candidates]
        tokens, parents, scores, depths = merge_drafts(drafts, [scores for _, _, scores in candidates])
        keep = _best_nodes(scores, depths, tree.num_nodes, tree.depth, self._step_cost)
        new_id = {old: new for new, old in enumerate(keep)}
        return DraftTree(
            tokens=torch.tensor([tokens[i] for i in keep], dtype=torch.long, device=sequence.device),
            parents=tuple([-1] + [new_id[parents[i]] for i in keep[1:]]),
        )

    def _expand(self, codes: np.ndarray, follow: np.ndarray, root: int, length: int, tree: TreeSpec):
        budget = min(tree.num_nodes, math.ceil(self.config.alpha * length))
        return expand_speculation_tree(codes, follow, root, budget, tree.depth, self.config.min_probability)

    # ------------------------------------------------------------------ the drafter protocol (batched)
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        return self.draft(sequence[0], tree)

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
        """``config.json`` (the `SuffixConfig`) and ``suffix_index.safetensors`` (the global structure)."""
        from safetensors.torch import save_file

        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(folder)
        save_file({k: torch.from_numpy(v) for k, v in self.index.state().items()}, str(folder / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(
        cls, pretrained_path: str | os.PathLike, config: SuffixConfig | None = None, cost_curve=None, **kwargs
    ) -> "SuffixDrafter":
        """Load a folder written by `save_pretrained`; ``kwargs`` override `SuffixConfig` fields."""
        from safetensors.torch import load_file

        from ...hub import resolve_name_or_path

        folder = Path(resolve_name_or_path(pretrained_path, what="SuffixDecoding drafter"))
        config = config if config is not None else SuffixConfig.from_pretrained(folder)
        overrides = {k: v for k, v in kwargs.items() if k not in _LOADER_ARGUMENTS}
        unknown = [k for k in overrides if k not in SuffixConfig().to_dict() or k in ("model_type",)]
        if unknown:
            raise TypeError(f"unknown SuffixDrafter argument(s) {unknown}")
        drafter = cls(config, cost_curve=cost_curve, **overrides)
        if (folder / WEIGHTS_NAME).is_file():
            arrays = {k: v.numpy() for k, v in load_file(str(folder / WEIGHTS_NAME)).items()}
            drafter.index.load_state(arrays["codes"], arrays["suffixes"], arrays["lengths"])
        return drafter
