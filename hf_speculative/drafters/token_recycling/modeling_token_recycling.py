"""Token Recycling: a model-free drafter that learns from the target's own verified logits.

Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large Language Models with Token Recycling"
(ACL 2025, arXiv 2408.08696), Sec. 3:

* **Adjacency matrix** (Sec. 3.1): ``M`` of shape ``[vocab, k]`` holds, for each token t, the k tokens the target
  last ranked most likely to follow t. Rows start empty (-1): a token never seen drafts nothing.
* **Update** (Sec. 3.3): after every verification forward, the row of every tree node's token is overwritten with
  the top-k of the logits the forward computed at that node -- accepted and rejected nodes alike, so the
  candidates a step throws away (its "trash") become next steps' drafts. The prefill's positions update their
  rows the same way. The engine hands these top-k ids to the drafter (`TreeDrafter.verified_top_k`,
  `TargetRows.top_k`): no second LM-head pass.
* **Drafting** (Sec. 3.2): a breadth-first expansion over ``M`` from the last committed token along a static tree
  template: the rank-r child of a node holding token t is ``M[t, r]``. Nodes whose row is empty are dropped with
  their subtrees.

The template here is sized for the machine (the paper uses one large static tree on a GPU): by default it is the
tree that maximizes expected tau per step cost (`TreeSpec.optimize` with the target's cost curve, Medusa Sec. 2.3.3
with Sequoia's cost term), from the per-depth, per-rank hit rates of ``M`` measured online (`OnlineAccuracy`; each
committed token tells at which rank of its predecessor's row it stood). The tree is re-chosen every
``refresh_every`` steps. A call's ``speculative_tree=`` is used as the template as it is (one equal, by value, to the
tree `tree_for_batch` gives for the call is that tree, and is re-chosen too).

The matrix and the hit rates persist across `generate()` calls (that is how the drafter learns), are shared by
the rows of a batch, and save with `save_pretrained` (``config.json`` + ``model.safetensors``, about
``vocab x k x 4`` bytes: 1.5 MB for a 49K vocabulary at k = 8). Drafts are fixed tokens (point-mass proposals), so
sampling stays exact through the engine's tree rejection sampling.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ...engine.protocol import TreeDrafter
from ...engine.rows import TargetRows
from ...engine.trees import DraftTree, TreeSpec
from ..cost_aware import target_cost_curve
from ..online_accuracy import OnlineAccuracy
from .configuration_token_recycling import TokenRecyclingConfig

__all__ = ["TokenRecyclingDrafter", "tree_levels"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
DRAFTER_TYPE = TokenRecyclingConfig.model_type

#: drafted templates whose `tree_levels` a drafter keeps (the call's tree, its refreshes, a hybrid's candidates)
MAX_TEMPLATES = 8
#: hit-rate prior per rank before any observation (worth `OnlineAccuracy.prior_weight` observations)
DEFAULT_PRIOR = (0.35, 0.12, 0.06, 0.04, 0.03, 0.02, 0.015, 0.01)


class TokenRecyclingDrafter(TreeDrafter):
    """Token Recycling (see the module docstring): ``model.generate(ids, assistant_model=TokenRecyclingDrafter())``.

    Args:
        num_successors: k, candidates kept per token (columns of the adjacency matrix; the paper's 8).
        cost_curve: the target's cost curve ``c(n)`` (a `CostCurve` or a callable); None: the target's cached curve,
            else a documented default (`cost_aware.target_cost_curve`).
        kwargs: the other `TokenRecyclingConfig` fields, with its defaults: ``max_nodes`` (most drafted nodes of the
            cost-aware tree), ``max_depth`` (its deepest level, and that of the measured hit-rate table) and
            ``refresh_every`` (decoding steps between re-choosing it from the latest hit rates).
    """

    learns_across_calls = True
    config_class = TokenRecyclingConfig  # AutoModel.from_pretrained(folder) finds it by the config's model_type

    def __init__(self, num_successors: int = 8, cost_curve=None, **kwargs):
        config = TokenRecyclingConfig.from_settings(type(self).__name__, num_successors=num_successors, **kwargs)
        self.num_successors = config.num_successors
        self.verified_top_k = self.num_successors
        self.max_nodes = config.max_nodes
        self.tree_depth = config.max_depth
        self.refresh_every = config.refresh_every
        self.cost_curve = cost_curve
        self.adjacency: torch.Tensor | None = None  # [vocab, k] long, -1 = empty
        self.vocab_size: int | None = None
        self.hit_rates = OnlineAccuracy(self.tree_depth, self.num_successors, list(DEFAULT_PRIOR) + [0.01] * 64)
        self._curve = None
        self._own: TreeSpec | None = None  # the call's tree_for_batch tree (begin_batch): a call passing it refreshes
        self._current: TreeSpec | None = None  # that tree, re-chosen every refresh_every steps
        self._steps = 0
        #: per drafted template (by value, a few at most): its node ids, parents and ranks per depth (`tree_levels`)
        self._levels: dict[TreeSpec, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    # ------------------------------------------------------------------ the matrix
    def _ensure_matrix(self, vocab_size: int, device: torch.device) -> None:
        if self.adjacency is None:
            self.adjacency = torch.full((vocab_size, self.num_successors), -1, dtype=torch.long, device=device)
            self.vocab_size = vocab_size
        elif self.adjacency.shape[0] != vocab_size:
            raise ValueError(
                f"vocabulary mismatch: this Token Recycling matrix has {self.adjacency.shape[0]} rows but the target "
                f"predicts {vocab_size} tokens; use a fresh TokenRecyclingDrafter() for this model"
            )
        elif self.adjacency.device != device:
            self.adjacency = self.adjacency.to(device)

    @torch.no_grad()
    def update(self, tokens: torch.Tensor, top_k: torch.Tensor) -> None:
        """Sec. 3.3: ``M[tokens[i]] = top_k[i]`` (the target's most likely successors of each position's token)."""
        if tokens.numel():
            self.adjacency[tokens.to(self.adjacency.device)] = top_k[:, : self.num_successors].to(self.adjacency.device)

    @property
    def filled_rows(self) -> int:
        """Tokens whose successors the matrix knows."""
        return 0 if self.adjacency is None else int((self.adjacency[:, 0] >= 0).sum())

    # ------------------------------------------------------------------ the tree
    def attach_target(self, target) -> None:
        head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
        vocab = head.weight.shape[0] if head is not None else target.config.vocab_size
        self._ensure_matrix(int(vocab), next(target.parameters()).device)
        self._curve = target_cost_curve(target, self.cost_curve)

    def cost_aware_tree(self, batch_size: int = 1) -> TreeSpec:
        """The tree with the best expected tau per step cost for the hit rates measured so far."""
        cost = self._curve if self._curve is not None else (lambda n: 1.0)
        return TreeSpec.optimize(self.hit_rates.accuracy(), self.max_nodes, cost=cost, batch_size=batch_size)

    def candidate_tree(self, num_nodes: int | None = None) -> TreeSpec:
        """The ``num_nodes`` nodes most likely to be accepted, whatever they cost (Medusa Sec. 2.3.3): the candidates
        this drafter offers a `HybridDrafter`, which prices the merged tree itself."""
        return TreeSpec.optimize(self.hit_rates.accuracy(), num_nodes or self.max_nodes)

    @property
    def default_tree(self) -> TreeSpec:
        return self.cost_aware_tree()

    def tree_for_batch(self, batch_size: int) -> TreeSpec:
        return self.cost_aware_tree(batch_size)

    def _template(self, tree: TreeSpec, batch_size: int) -> TreeSpec:
        """The call's tree, or the refreshed cost-aware tree when the call's tree is (by value) the one
        `tree_for_batch` gives for the call's batch."""
        if tree != self._own:
            return tree
        if self._steps and self._steps % self.refresh_every == 0:
            self._current = self.cost_aware_tree(batch_size)
        return self._current

    @torch.no_grad()
    def draft(self, root: int, tree: TreeSpec) -> DraftTree:
        """Sec. 3.2: breadth-first over the matrix along ``tree``; empty rows drop their subtrees."""
        m = self.adjacency
        tokens = torch.full((tree.num_nodes + 1,), -1, dtype=torch.long, device=m.device)
        tokens[0] = root
        for nodes, parents, ranks in self._levels_of(tree):  # one depth at a time: parents are filled
            p = tokens[parents]
            tokens[nodes] = torch.where(p >= 0, m[p.clamp_min(0), ranks], -1)
        keep = (tokens >= 0).nonzero().squeeze(-1).tolist()
        draft = DraftTree.from_spec(tree, tokens)
        return draft if len(keep) == len(tokens) else draft.select(keep)

    def _levels_of(self, tree: TreeSpec) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """`tree_levels` of ``tree``, kept beside the spec (never on it) for the few templates drafted lately."""
        levels = self._levels.get(tree)
        if levels is None:
            if len(self._levels) >= MAX_TEMPLATES:
                self._levels.clear()
            levels = self._levels[tree] = tree_levels(tree)
        return levels

    # ------------------------------------------------------------------ the drafter protocol
    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        self._steps = 0
        if self.adjacency is None:
            raise RuntimeError("TokenRecyclingDrafter was not attached to a target (the engine calls attach_target)")
        self._own = self._current = self.tree_for_batch(len(prompts))
        for j, prompt in enumerate(prompts):
            if target_outputs.top_k is not None:
                top = target_outputs.top_k[j]
                self.update(prompt[0, prompt.shape[1] - top.shape[0] :], top)

    def propose_batch(self, sequences, rows, tree, options):
        template = self._template(tree, len(sequences))
        self._steps += 1
        return [self.draft(int(seq[0, -1]), template) for seq in sequences]

    @torch.no_grad()
    def advance_batch(self, sequences, rows, drafts, results, target_outputs: TargetRows) -> None:
        m = self.adjacency
        # hit rates first, against the matrix the step drafted from: the rank of each committed token in its
        # predecessor's row (an empty row is a miss at every rank)
        for draft, result in zip(drafts, results):
            committed = torch.tensor(result.tokens, dtype=torch.long, device=m.device)
            before = torch.cat([draft.tokens[:1].to(m.device), committed[:-1]])
            match = (m[before] == committed[:, None]).int()
            found, rank = match.max(-1)
            for depth, (f, r) in enumerate(zip(found.tolist(), rank.tolist()), start=1):
                self.hit_rates.observe_ranks(depth, r if f else None)
        if target_outputs.top_k is not None:
            for draft, top in zip(drafts, target_outputs.top_k):
                self.update(draft.tokens, top)

    def end_batch(self) -> None:
        self._steps = 0
        self._own = self._current = None

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """``config.json`` (the arguments) and ``model.safetensors`` (the matrix and the measured hit rates), each
        written through a unique temporary file and ``os.replace`` (`paths.atomic_path`)."""
        from safetensors.torch import save_file

        from ...paths import atomic_path, write_atomically

        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "model_type": DRAFTER_TYPE,
            "drafter_type": DRAFTER_TYPE,
            "num_successors": self.num_successors,
            "max_nodes": self.max_nodes,
            "max_depth": self.tree_depth,
            "refresh_every": self.refresh_every,
            "vocab_size": self.vocab_size,
        }
        tensors = {f"hit_rates.{k}": v for k, v in self.hit_rates.state_dict().items()}
        if self.adjacency is not None:
            tensors["adjacency"] = self.adjacency.to(torch.int32).cpu().contiguous()
        with atomic_path(folder / WEIGHTS_NAME) as tmp:
            save_file(tensors, str(tmp))
        write_atomically(folder / CONFIG_NAME, json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, pretrained_path: str | os.PathLike, config: TokenRecyclingConfig | None = None, **kwargs
    ) -> "TokenRecyclingDrafter":
        """Load a folder written by `save_pretrained`, or a Hub repo of one (also what ``AutoModel.from_pretrained``
        calls, with the folder's ``config``); ``kwargs`` override its saved arguments.

        Raises ``FileNotFoundError`` for a missing folder or ``config.json``, ``ValueError`` naming the file for a
        damaged one (truncated, not JSON or safetensors) and for a matrix that disagrees with its config or holds a
        token id outside ``[0, vocab_size)``."""
        from ..hub import LOADER_ARGUMENTS, drafter_folder

        folder = drafter_folder(pretrained_path, [CONFIG_NAME, WEIGHTS_NAME], "Token Recycling drafter", **kwargs)
        if config is not None:
            config = config.to_dict()
        elif (folder / CONFIG_NAME).is_file():
            config = _read_json(folder / CONFIG_NAME)
        else:
            raise FileNotFoundError(f"no Token Recycling drafter at {str(folder)!r} (expected {CONFIG_NAME} there)")
        kind = config.get("model_type") or config.get("drafter_type")
        if kind != DRAFTER_TYPE:
            raise ValueError(f"{str(folder)!r} holds a {kind!r} drafter, not Token Recycling")
        kwargs = {k: v for k, v in kwargs.items() if k not in LOADER_ARGUMENTS}
        args = {k: config[k] for k in ("num_successors", "max_nodes", "max_depth", "refresh_every") if k in config}
        drafter = cls(**{**args, **kwargs})
        file = folder / WEIGHTS_NAME
        tensors = _read_safetensors(file) if file.is_file() else {}
        if "adjacency" in tensors:
            adjacency = _checked_adjacency(tensors["adjacency"], file, config)
            drafter.adjacency = _fit_columns(adjacency, drafter.num_successors)
            drafter.vocab_size = drafter.adjacency.shape[0]
        if "hit_rates.hits" in tensors:
            drafter.hit_rates.load_state_dict(_checked_hit_rates(tensors, file))
        return drafter


def _read_json(file: Path) -> dict:
    """A JSON object from ``file``; ``ValueError`` naming it when it is damaged."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:  # not UTF-8, not JSON: a truncated or damaged file
        raise ValueError(f"{file} is damaged (truncated or not JSON): {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{file} is damaged: it holds {type(data).__name__}, not a JSON object")
    return data


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``file``; ``ValueError`` naming it when it is damaged (safetensors' own error names no file)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, ValueError, RuntimeError) as error:
        raise ValueError(f"{file} is damaged (truncated or not safetensors): {error}") from error


def _checked_adjacency(adjacency: torch.Tensor, file: Path, config: dict) -> torch.Tensor:
    """The saved matrix as long, after checking it against its config: ``[vocab_size, num_successors]``, integer,
    every entry a token id in ``[0, vocab_size)`` or -1 (empty). ``ValueError`` naming ``file`` otherwise."""
    vocab, k = config.get("vocab_size"), config.get("num_successors")
    if adjacency.dim() != 2 or adjacency.is_floating_point() or adjacency.dtype == torch.bool:
        raise ValueError(
            f"{file}: the adjacency matrix is {adjacency.dtype} of shape {tuple(adjacency.shape)}, not 2-D ids"
        )
    if (vocab is not None and adjacency.shape[0] != vocab) or (k is not None and adjacency.shape[1] != k):
        raise ValueError(
            f"{file}: the adjacency matrix has shape {tuple(adjacency.shape)} but its config says "
            f"vocab_size={vocab}, num_successors={k}"
        )
    adjacency = adjacency.long()
    bad = (adjacency < -1) | (adjacency >= adjacency.shape[0])
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{file}: token id {int(adjacency[row, column])} (row {row}, column {column}) is outside "
            f"[0, {adjacency.shape[0]}) (-1 marks an empty entry)"
        )
    return adjacency


def _fit_columns(adjacency: torch.Tensor, k: int) -> torch.Tensor:
    """``k`` columns: the first ``k`` saved, or the saved ones and empty (-1) columns after them."""
    if adjacency.shape[1] >= k:
        return adjacency[:, :k].contiguous()
    return torch.cat([adjacency, adjacency.new_full((adjacency.shape[0], k - adjacency.shape[1]), -1)], dim=1)


def _checked_hit_rates(tensors: dict[str, torch.Tensor], file: Path) -> dict[str, torch.Tensor]:
    """The saved hit-rate counts: two 2-D tensors of one shape, finite, ``0 <= hits <= trials``."""
    hits, trials = tensors["hit_rates.hits"], tensors.get("hit_rates.trials")
    if trials is None or hits.dim() != 2 or hits.shape != trials.shape:
        raise ValueError(f"{file}: hit_rates.hits and hit_rates.trials are missing or of different shapes")
    hits, trials = hits.double(), trials.double()
    if not (torch.isfinite(trials).all() and (hits >= 0).all() and (hits <= trials).all()):
        raise ValueError(f"{file}: hit_rates hold counts that are negative, not finite or above their trials")
    return {"hits": hits, "trials": trials}


def tree_levels(tree: TreeSpec) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per depth 1..D: the node ids, their parents and their ranks."""
    depths = tree.depths.tolist()
    levels = []
    for level in range(1, tree.depth + 1):
        nodes = [i for i, d in enumerate(depths) if d == level]
        levels.append(
            tuple(torch.tensor(v) for v in (nodes, [tree.parents[i] for i in nodes], [tree.ranks[i] for i in nodes]))
        )
    return levels
