"""The configuration fields the drafters share: `DrafterConfigMixin` (every drafter's), `TreeDrafterConfig` (the
drafters that fill a static tree from one distribution per depth: Medusa heads, ParallelSpec) and
`ModelFreeDrafterConfig` (the drafters with no network: SuffixDecoding, Token Recycling)."""

from __future__ import annotations

import inspect

from transformers import PretrainedConfig

from ..engine.trees import TreeSpec, expected_acceptance_length

__all__ = ["DrafterConfigMixin", "ModelFreeDrafterConfig", "TreeDrafterConfig"]


class DrafterConfigMixin:
    r"""Mixed into a drafter's config class (before the `PretrainedConfig` it extends), whose ``__init__`` passes these
    on to ``super().__init__``.

    Args:
        base_model_name_or_path (`str`, *optional*):
            Name or path of the target (base) model the drafter was built for (recorded for users and the model card;
            the drafter never loads it itself, except Speculative Streaming when no ``base_model=`` is given).
        draft_vocab_size (`int`, *optional*):
            FR-Spec's truncated draft vocabulary: when drafting, project onto only these K tokens (the most frequent
            of the training data, ``set_draft_vocab``; their target ids are saved with the weights). Verification
            keeps the full vocabulary, so the output does not change. `None` (default): the full vocabulary.
    """

    def __init__(self, *, base_model_name_or_path: str | None = None, draft_vocab_size: int | None = None, **kwargs):
        self.base_model_name_or_path = base_model_name_or_path
        self.draft_vocab_size = draft_vocab_size
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        if draft_vocab_size is not None and not 1 <= draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..vocab_size ({self.vocab_size}), got {draft_vocab_size}")


class TreeDrafterConfig(DrafterConfigMixin, PretrainedConfig):
    r"""The fields of a drafter that fills a static tree with one distribution per depth (Medusa heads, ParallelSpec),
    besides those of `DrafterConfigMixin`. A subclass names the field of its static draft tree (Medusa-style paths of
    top-i indices) in ``choices_field`` and sets it with `_set_choices`.

    Args:
        hidden_size (`int`, *optional*): hidden size of the target (default: the subclass's ``default_hidden_size``).
        vocab_size (`int`, *optional*): vocabulary size of the target; the drafter refuses a target with another
            vocabulary (default: the subclass's ``default_vocab_size``).
        acceptance (`str`, defaults to `"exact"`):
            `"exact"`: lossless tree rejection sampling when sampling (greedy decoding is always exact).
            `"typical"`: Medusa's typical acceptance (Sec. 2.3.1) when sampling; lossy, faster at high temperature.
        posterior_threshold (`float`, defaults to 0.09):
            Typical acceptance's hard threshold epsilon.
        posterior_alpha (`float`, defaults to 0.3):
            Typical acceptance's entropy-dependent threshold factor alpha (``alpha * exp(-H(p))``).
        initializer_range (`float`, defaults to 0.02):
            Std of the normal init of the weights not copied from the target.
        cost_aware_tree (`bool`, defaults to `True`):
            With a calibration (the held-out top-i accuracy per depth in ``calibration``, written by the drafter's tree
            calibration), the default tree is the one with the best expected tau per unit of cost on the target's
            measured cost curve (`hf_speculative.drafters.cost_aware`); `False` keeps the configured tree. The
            environment variable ``HF_SPECULATIVE_COST_AWARE=0`` turns it off everywhere.
    """

    default_hidden_size: int
    default_vocab_size: int

    def __init__(
        self,
        *,
        hidden_size: int | None = None,
        vocab_size: int | None = None,
        acceptance: str = "exact",
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        initializer_range: float = 0.02,
        cost_aware_tree: bool = True,
        **kwargs,
    ):
        if acceptance not in ("exact", "typical"):
            raise ValueError(f"{type(self).__name__}.acceptance must be 'exact' or 'typical', got {acceptance!r}")
        self.hidden_size = self.default_hidden_size if hidden_size is None else hidden_size
        self.vocab_size = self.default_vocab_size if vocab_size is None else vocab_size
        self.acceptance = acceptance
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha
        self.initializer_range = initializer_range
        self.cost_aware_tree = cost_aware_tree
        super().__init__(**kwargs)

    def _set_choices(self, choices: list[list[int]], max_depth: int, limit: str) -> None:
        """Validate the draft tree ``choices`` (at most ``max_depth`` deep, as ``limit`` says) and store its paths."""
        tree = TreeSpec.from_choices(choices)
        if tree.depth > max_depth:
            raise ValueError(f"{self.choices_field} is {tree.depth} deep but {limit}")
        setattr(self, self.choices_field, tree.to_list())

    def calibrate(self, accuracies: list[list[float]], num_nodes: int, key: str, **record) -> TreeSpec:
        """Medusa Sec. 2.3.3: the tree of ``num_nodes`` with the largest expected acceptance length for the held-out
        top-i ``accuracies`` becomes the static tree; ``calibration`` records the accuracies under ``key``, the tree's
        size and expected acceptance length, and ``record``. Returns the tree."""
        tree = TreeSpec.optimize(accuracies, num_nodes)
        setattr(self, self.choices_field, tree.to_list())
        self.calibration = {
            **record,
            key: [[round(a, 4) for a in row] for row in accuracies],
            "num_nodes": tree.num_nodes,
            "expected_acceptance_length": round(expected_acceptance_length(tree, accuracies), 4),
        }
        return tree

    @property
    def tree(self) -> TreeSpec:
        """The static draft tree (of ``choices_field``)."""
        return TreeSpec.from_choices(getattr(self, self.choices_field))


class ModelFreeDrafterConfig(PretrainedConfig):
    r"""The fields of a drafter with no network (SuffixDecoding, Token Recycling): the budget of its trees and the
    vocabulary of the token ids it stores. A subclass gives the budget's defaults (``default_max_nodes``,
    ``default_max_depth``).

    Args:
        max_nodes (`int`, *optional*):
            Node budget of a step's tree when the call gives no ``speculative_tree`` (the cost curve trims it further).
        max_depth (`int`, *optional*):
            Depth budget of a step's tree.
        vocab_size (`int`, *optional*):
            Vocabulary of the target the stored token ids belong to (set on first use).
    """

    default_max_nodes: int
    default_max_depth: int

    def __init__(
        self, *, max_nodes: int | None = None, max_depth: int | None = None, vocab_size: int | None = None, **kwargs
    ):
        max_nodes = self.default_max_nodes if max_nodes is None else max_nodes
        max_depth = self.default_max_depth if max_depth is None else max_depth
        if max_nodes < 1 or max_depth < 1:
            raise ValueError(f"max_nodes and max_depth must be >= 1, got {max_nodes}, {max_depth}")
        self.max_nodes = int(max_nodes)
        self.max_depth = int(max_depth)
        self.vocab_size = vocab_size
        super().__init__(**kwargs)

    @classmethod
    def from_settings(cls, what: str, **settings) -> "ModelFreeDrafterConfig":
        """The config of a drafter built from keywords (``what(**settings)``): a keyword that is none of the config's
        fields raises `TypeError` naming the ones it takes, instead of becoming a stray config attribute."""
        known = {
            name
            for klass in cls.__mro__[: cls.__mro__.index(PretrainedConfig)]
            for name in inspect.signature(klass.__init__).parameters
            if name not in ("self", "kwargs")
        }
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(
                f"{what} got unexpected keyword(s) {', '.join(unknown)}; it takes {', '.join(sorted(known))}"
            )
        return cls(**settings)
