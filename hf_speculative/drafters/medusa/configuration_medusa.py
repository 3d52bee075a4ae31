"""Configuration of Medusa heads (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads", 2024, https://arxiv.org/abs/2401.10774)."""

from __future__ import annotations

from ...engine.trees import TreeSpec
from ..configuration_drafter import TreeDrafterConfig

__all__ = ["MedusaConfig", "default_medusa_choices"]


def default_medusa_choices(num_heads: int, num_nodes: int = 24) -> list[list[int]]:
    """A sparse tree for untrained (or uncalibrated) heads: `TreeSpec.optimize` on a prior accuracy table.

    The prior assumes head ``d`` has top-1 accuracy ``0.6 * 0.8**d`` and that the i-th ranked candidate is
    half as likely as the (i-1)-th, which is close to the shape of the tables in Medusa Fig. 3. Calibrate
    with `calibrate_tree` once the heads are trained.
    """
    prior = [[0.6 * 0.8**d * 0.5**i for i in range(8)] for d in range(num_heads)]
    return TreeSpec.optimize(prior, num_nodes).to_list()


class MedusaConfig(TreeDrafterConfig):
    r"""Configuration of a `MedusaHeadsModel`: K Medusa heads on the last hidden state of a base model.

    Head k (0-based) reads the base model's final hidden state ``h_t`` (after the final norm, the state the
    base ``lm_head`` consumes) and predicts the token at position ``t + k + 2``: the base ``lm_head``
    predicts ``t + 1``, head 0 the token after it, and so on (Medusa Sec. 2.1.1).

    The fields of `TreeDrafterConfig` and `DrafterConfigMixin` come with it: the target (``base_model_name_or_path``),
    an FR-Spec ``draft_vocab_size``, the acceptance settings, ``initializer_range`` (the init of a head's own W2 when
    it is not copied from a base ``lm_head``) and ``cost_aware_tree`` (on ``calibration["head_top_i_accuracy"]``,
    written by `calibrate_tree`).

    ``hidden_size`` defaults to 4096 and ``vocab_size`` to 32000 (those of the base model).

    Args:
        num_heads (`int`, defaults to 4):
            Number of Medusa heads K, i.e. the deepest tree the heads can fill.
        num_layers (`int`, defaults to 1):
            Residual blocks per head. Each block is ``h + SiLU(W1 h + b1)``, with its own weights (the
            reference implementation shared one block across layers by accident).
        share_lm_head (`bool`, defaults to `True`):
            When `True`, every head ends in the base model's frozen ``lm_head`` (not stored in the checkpoint,
            attached from the base model); when `False`, each head has its own vocabulary projection W2,
            initialised from the base ``lm_head`` (Medusa-1 as in the paper).
        medusa_choices (`list[list[int]]`, *optional*):
            The static draft tree as Medusa-style paths of top-i indices (see `TreeSpec.from_choices`).
            Defaults to `default_medusa_choices(num_heads)`; `calibrate_tree` replaces it with the tree built
            from measured head accuracies (Medusa Sec. 2.3.3).
    """

    model_type = "medusa_heads"
    default_hidden_size, default_vocab_size = 4096, 32000
    choices_field = "medusa_choices"

    def __init__(
        self,
        num_heads: int = 4,
        num_layers: int = 1,
        share_lm_head: bool = True,
        medusa_choices: list[list[int]] | None = None,
        **kwargs,
    ):
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"MedusaConfig needs num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.share_lm_head = share_lm_head
        if medusa_choices is None:
            medusa_choices = default_medusa_choices(num_heads)
        self._set_choices(medusa_choices, num_heads, f"there are only {num_heads} heads")
        super().__init__(**kwargs)
