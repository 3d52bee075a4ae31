"""Configuration of the SPIRe drafter (Neelam et al., "SPIRe: Boosting LLM Inference Throughput with Speculative
Decoding", 2025)."""

from __future__ import annotations

from transformers import LlamaConfig

from ...engine.trees import TreeSpec
from ..configuration_drafter import DrafterConfigMixin

__all__ = ["SpireConfig", "chain_with_alternatives"]


def chain_with_alternatives(depth: int, top_i: int) -> TreeSpec:
    """The tree SPIRe drafts by default: its greedy chain of ``depth`` tokens, and at every depth the next
    ``top_i - 1`` candidates of the same distribution as siblings of the chain's node (leaves). Every node's parent
    is a chain node, whose distribution the drafter has computed, so each candidate is conditioned on its real
    prefix (unlike Medusa-style trees from one distribution per depth)."""
    if depth < 1 or top_i < 1:
        raise ValueError(f"need depth >= 1 and top_i >= 1, got {depth}, {top_i}")
    paths = [[0] * d + [i] for d in range(depth) for i in range(top_i)]
    return TreeSpec.from_choices(paths)


class SpireConfig(DrafterConfigMixin, LlamaConfig):
    r"""Configuration of a `SpireDrafter`: the fields of a `LlamaConfig` describing the drafter's decoder layers (the
    target's width, heads and MLP; ``num_hidden_layers`` of them) plus SPIRe's settings and those of
    `DrafterConfigMixin` (``base_model_name_or_path``, an FR-Spec ``draft_vocab_size`` for drafting).

    Args:
        target_layers (`list[int]`):
            For drafter layer i, the index of the target layer whose weights initialised it (pruned init, SPIRe
            Sec. 3.2). The target's ``output_hidden_states[target_layers[i]]`` (the input of that target layer) is
            layer i's memory at positions the target has verified (Sec. 3.3).
        target_num_layers (`int`, *optional*): the target's ``num_hidden_layers``.
        sliding_window (`int`, defaults to 64): W of the StreamingLLM sparse KV (Sec. 3.1): a query at position t
            sees the keys at positions s with ``t - s < W`` (itself included) ...
        num_sink_tokens (`int`, defaults to 1): ... and the first S positions of the text (attention sinks).
        num_draft_tokens (`int`, defaults to 4): k, the depth of the drafted chain (drafter forwards per step).
        tree_top_i (`int`, defaults to 2): candidates per depth in the default tree (`chain_with_alternatives`).
        tree_choices (`list[list[int]]`, *optional*): a static tree to draft instead (its inner nodes must be the
            chain's for exact conditioning; other trees are filled from the chain's per-depth distributions).
        memory_init_logit (`float`, defaults to 4.0): feedback-memory weights start as this logit on layer i's own
            input activation (l = i - 1) and 0 elsewhere, so ``m^i`` starts close to the activation a plain
            transformer layer would attend to.
        qkv_bias (`bool`, defaults to `False`): biases on q/k/v (Qwen2 targets).
        mixed_loss_omega (`float`, defaults to 0.5): omega of MixedLoss (Sec. 3.4), recorded for training.
        calibration (`dict`, *optional*): held-out measurements: ``depth_top_i_accuracy[d][i]``, the share of rows
            whose target token at depth d + 1 is among the drafter's top-(i + 1) given the chain up to d (written by
            ``hf-speculative train spire``).
        cost_aware_tree (`bool`, defaults to `True`): with a calibration, the default tree is the
            `chain_with_alternatives` shape (depth <= k, candidates per depth) with the best expected tau per unit of
            step cost on the target's measured cost curve (SPIRe's Delta t; `hf_speculative.drafters.cost_aware`);
            `False` keeps ``tree_choices`` / ``tree_top_i``.
    """

    model_type = "spire_drafter"

    def __init__(
        self,
        target_layers: list[int] | None = None,
        target_num_layers: int | None = None,
        sliding_window: int = 64,
        num_sink_tokens: int = 1,
        num_draft_tokens: int = 4,
        tree_top_i: int = 2,
        tree_choices: list[list[int]] | None = None,
        memory_init_logit: float = 4.0,
        qkv_bias: bool = False,
        mixed_loss_omega: float = 0.5,
        calibration: dict | None = None,
        cost_aware_tree: bool = True,
        num_hidden_layers: int = 2,
        **kwargs,
    ):
        if sliding_window is None or int(sliding_window) < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
        if int(num_sink_tokens) < 0:
            raise ValueError(f"num_sink_tokens must be >= 0, got {num_sink_tokens}")
        if int(num_draft_tokens) < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
        if not 0.0 <= float(mixed_loss_omega) <= 1.0:
            raise ValueError(f"mixed_loss_omega must be in [0, 1], got {mixed_loss_omega}")
        self.target_layers = None if target_layers is None else [int(i) for i in target_layers]
        if self.target_layers is not None and len(self.target_layers) != num_hidden_layers:
            raise ValueError(
                f"target_layers has {len(self.target_layers)} entries for {num_hidden_layers} drafter layers"
            )
        self.target_num_layers = target_num_layers
        self.sliding_window = int(sliding_window)
        self.num_sink_tokens = int(num_sink_tokens)
        self.num_draft_tokens = int(num_draft_tokens)
        self.tree_top_i = int(tree_top_i)
        self.tree_choices = None if tree_choices is None else TreeSpec.from_choices(tree_choices).to_list()
        self.memory_init_logit = float(memory_init_logit)
        self.qkv_bias = bool(qkv_bias)
        self.mixed_loss_omega = float(mixed_loss_omega)
        self.calibration = calibration
        self.cost_aware_tree = bool(cost_aware_tree)
        kwargs.pop("use_sliding_window", None)
        kwargs.pop("layer_types", None)
        kwargs.pop("max_window_layers", None)
        super().__init__(num_hidden_layers=num_hidden_layers, **kwargs)

    @property
    def tree(self) -> TreeSpec:
        """The default draft tree: ``tree_choices``, else the chain of depth k with ``tree_top_i`` candidates per depth."""
        if self.tree_choices:
            return TreeSpec.from_choices(self.tree_choices)
        return chain_with_alternatives(self.num_draft_tokens, self.tree_top_i)
