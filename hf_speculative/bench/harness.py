"""The timing harness behind ``hf-speculative bench``.

Every method is a small :class:`BenchMethod` registered by name in :data:`METHODS`; it builds its
drafter once (``setup``) and makes one ``generate`` call per prompt (``generate``). The harness
then, in one process and on the same tokenized prompts:

1. warms every method up with one short ``generate``;
2. for each prompt, runs every method in turn (interleaved, so slow drifts of a shared machine hit
   all methods alike), ``--repeats`` times, timing only the ``generate`` call with
   ``time.perf_counter`` (tokenization and chat templating happen before, outside the timed region;
   on CUDA the region is closed by ``torch.cuda.synchronize``);
3. greedy only, untimed: per prompt, the numerics floor (:mod:`hf_speculative.bench.numerics`): plain
   ``generate()`` as one row of a batch of two identical rows and with its prefill split in two, each
   compared with plain's batch-of-one output (in bf16/fp16 these differ by rounding now and then);
4. summarizes with :mod:`hf_speculative.bench.report`.

Counting target forwards.  Our engine reports ``out.speculative_stats.accepted_lengths`` (one entry
per target forward).  Plain decoding makes one forward per new token.  For transformers' own
assisted and prompt-lookup decoding, a ``register_forward_pre_hook`` on the *target's top-level
module* whose only work is ``self.n += 1`` counts the target's forward calls during the timed
``generate`` (the draft is a different top-level module, even when it shares the target's layers,
so it is not counted); tau is then ``new_tokens / forwards``.  The hook is registered before and
removed after the timed region.

Adding a method: subclass :class:`BenchMethod`, set ``name``, implement ``generate`` (and ``setup``
if it needs a drafter), and decorate it with :func:`register_method`.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from .numerics import FLOOR_VARIANTS, first_divergence, floor_outputs, summarize_floor
from .prompts import BenchPrompt, prepare_prompts
from .report import Measurement, prompts_json, summarize
from .root_only import ENGINE_CALL, ENGINE_LABEL, RootOnlyDrafter

__all__ = [
    "BenchOptions",
    "BenchMethod",
    "METHODS",
    "register_method",
    "parse_tree",
    "build_methods",
    "baselines_first",
    "run_benchmark",
    "machine_info",
    "generate_kwargs",
    "learns_across_calls",
    "synchronize",
]


# ----------------------------------------------------------------------------- options


@dataclass
class BenchOptions:
    """Knobs of the methods (one object shared by all of them).

    Attributes:
        draft_layers: decoder layers kept by the layer-cut self-speculative draft.
        tree: ``--tree`` string for our tree methods (``None``: the drafter's own default tree).
        chain_length: drafted tokens per step of ``chain-layercut`` and ``magicdec``.
        assistant_tokens / assistant_schedule / assistant_confidence: transformers' assisted decoding
            knobs; they are set on the ASSISTANT's ``generation_config`` (that is where transformers
            reads them), ``None`` keeps transformers' defaults (20, "constant", 0.4). The defaults here
            (5, "heuristic", 0.0) were the fastest of the settings tried on SmolLM2 + layer-cut draft
            (docs/bench.md lists the sweep).
        prompt_lookup_tokens / max_matching_ngram: transformers' prompt-lookup decoding (3 and 2 were
            the fastest tried; transformers' docs suggest 10); ``max_matching_ngram`` is also the longest
            n-gram of ``tree-prompt-lookup``.
        magicdec_window / magicdec_sinks / magicdec_positions: ``magicdec``'s StreamingLLM draft cache: window W, S
            sink tokens, rotary positions within the cache (``"cache"``) or of the text (``"original"``).
        drafters: ``{method name: path}`` from ``--drafter``.
        recycling: a saved `TokenRecyclingDrafter` folder that ``token-recycling`` and ``hybrid`` start from (None:
            an empty matrix, which learns over the run's prompts in their order).
        suffix: a saved `SuffixDrafter` folder that ``suffix`` and the hybrid part ``sx`` start from (None: an empty
            structure, which learns the run's outputs in their order).
    """

    draft_layers: int = 8
    tree: str | None = None
    chain_length: int = 4
    assistant_tokens: int | None = 5
    assistant_schedule: str | None = "heuristic"
    assistant_confidence: float | None = 0.0
    prompt_lookup_tokens: int = 3
    max_matching_ngram: int = 2
    magicdec_window: int = 64
    magicdec_sinks: int = 1
    magicdec_positions: str = "cache"
    drafters: dict[str, str] = field(default_factory=dict)
    recycling: str | None = None
    suffix: str | None = None


def parse_tree(spec: str | None):
    """``cartesian:4,2,2,1`` | ``chain:5`` | ``dynamic:16,4,4`` (`DynamicTree` total_tokens, depth, top_k) | a
    JSON list of choices | a path to a JSON file of choices."""
    if spec is None:
        return None
    import hf_speculative as hfs

    spec = spec.strip()
    if spec.startswith("cartesian:"):
        return hfs.TreeSpec.cartesian([int(x) for x in spec.split(":", 1)[1].split(",") if x])
    if spec.startswith("chain:"):
        return hfs.TreeSpec.chain(int(spec.split(":", 1)[1]))
    if spec.startswith("dynamic:"):
        return hfs.DynamicTree(*[int(x) for x in spec.split(":", 1)[1].split(",") if x])
    if spec.startswith("["):
        return hfs.TreeSpec.from_choices(json.loads(spec))
    path = Path(spec)
    if path.is_file():
        data = json.loads(path.read_text())
        return hfs.TreeSpec.from_choices(data["choices"] if isinstance(data, dict) else data)
    raise ValueError(
        f"--tree {spec!r}: want 'cartesian:4,2,2,1', 'chain:5', 'dynamic:16,4,4', a JSON list of choices or a JSON file"
    )


# ----------------------------------------------------------------------------- methods


class BenchMethod:
    """One decoding method under test.

    ``generate(input_ids, attention_mask, **common)`` is the timed call: it must do nothing but
    call ``generate``. ``common`` holds ``max_new_tokens``, ``do_sample``, ``temperature``,
    ``return_dict_in_generate=True`` and the token ids.
    """

    name: ClassVar[str] = ""
    #: how reports name the method (default: ``name``)
    label: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: count target forwards with a forward pre-hook (transformers' own speculative methods)
    count_forwards_with_hook: ClassVar[bool] = False

    def __init__(self, model, tokenizer, options: BenchOptions):
        self.model, self.tokenizer, self.options = model, tokenizer, options

    def setup(self) -> None:
        """Build drafters etc. (not timed)."""

    def settings(self) -> dict[str, Any]:
        """What to record in the JSON ``setting`` for this method."""
        return {}

    def generate(self, input_ids, attention_mask, **common):
        raise NotImplementedError

    def target_forwards(self, output, new_tokens: int, hook_count: int | None) -> int | None:
        stats = getattr(output, "speculative_stats", None)
        if stats is not None:
            return len(stats.accepted_lengths)
        return hook_count


METHODS: dict[str, type[BenchMethod]] = {}


def register_method(cls: type[BenchMethod]) -> type[BenchMethod]:
    """Class decorator: make ``cls`` available to ``--methods`` under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    METHODS[cls.name] = cls
    return cls


def _transformers_generate(model, *args, **kwargs):
    """transformers' own generate, even on a model that hf_speculative.enable() patched."""
    import transformers

    return transformers.GenerationMixin.generate(model, *args, **kwargs)


@register_method
class PlainMethod(BenchMethod):
    name = "plain"
    description = "transformers generate() without speculation (the baseline)"

    def generate(self, input_ids, attention_mask, **common):
        return _transformers_generate(self.model, input_ids, attention_mask=attention_mask, **common)

    def target_forwards(self, output, new_tokens, hook_count):
        return new_tokens  # one forward per token (the prefill forward gives the first)


class _LayerCutMixin:
    def _build_draft(self):
        import hf_speculative as hfs

        self.draft = hfs.layer_cut_draft(self.model, num_layers=self.options.draft_layers)


@register_method
class HFAssistedMethod(_LayerCutMixin, BenchMethod):
    name = "hf-assisted"
    description = "transformers' assisted decoding (chain), layer-cut draft as assistant_model"
    count_forwards_with_hook = True

    def setup(self):
        self._build_draft()
        gc = self.draft.generation_config = copy.deepcopy(self.draft.generation_config)
        o = self.options
        # transformers reads these from the ASSISTANT's generation_config, not from generate kwargs
        if o.assistant_tokens is not None:
            gc.num_assistant_tokens = o.assistant_tokens
        if o.assistant_schedule is not None:
            gc.num_assistant_tokens_schedule = o.assistant_schedule
        if o.assistant_confidence is not None:
            gc.assistant_confidence_threshold = o.assistant_confidence
        self._initial = gc.num_assistant_tokens

    def settings(self):
        gc = self.draft.generation_config
        return {
            "draft_layers": self.options.draft_layers,
            "num_assistant_tokens": self._initial,
            "num_assistant_tokens_schedule": gc.num_assistant_tokens_schedule,
            "assistant_confidence_threshold": gc.assistant_confidence_threshold,
            "note": "None = transformers default (20 tokens, 'constant', confidence 0.4)",
        }

    def generate(self, input_ids, attention_mask, **common):
        return _transformers_generate(
            self.model, input_ids, attention_mask=attention_mask, assistant_model=self.draft, **common
        )


@register_method
class HFPromptLookupMethod(BenchMethod):
    name = "hf-prompt-lookup"
    description = "transformers' prompt-lookup decoding (n-gram match in the prompt)"
    count_forwards_with_hook = True

    def settings(self):
        return {
            "prompt_lookup_num_tokens": self.options.prompt_lookup_tokens,
            "max_matching_ngram_size": self.options.max_matching_ngram,
        }

    def generate(self, input_ids, attention_mask, **common):
        return _transformers_generate(
            self.model,
            input_ids,
            attention_mask=attention_mask,
            prompt_lookup_num_tokens=self.options.prompt_lookup_tokens,
            max_matching_ngram_size=self.options.max_matching_ngram,
            **common,
        )


class _EngineMethod(BenchMethod):
    """A method that runs hf_speculative's tree loop: ``enable(model)``, ``generate(assistant_model=...)``."""

    tree = None

    def setup(self):
        import hf_speculative as hfs

        hfs.enable(self.model)

    def _tree_settings(self):
        from ..engine.trees import DynamicTree

        if self.tree is None:
            return {"tree": None, "tree_nodes": None}
        shape = repr(self.tree) if isinstance(self.tree, DynamicTree) else self.tree.to_list()
        return {"tree": shape, "tree_nodes": self.tree.num_nodes}

    #: the tree passed to generate; None lets the drafter choose (a cost-aware drafter picks per batch size)
    call_tree = None

    def generate(self, input_ids, attention_mask, **common):
        tree = self.tree if self.call_tree is None and not isinstance(self, DrafterMethod) else self.call_tree
        kwargs = {} if tree is None else {"speculative_tree": tree}
        return self.model.generate(
            input_ids, attention_mask=attention_mask, assistant_model=self.draft, **kwargs, **common
        )

    def tree_for_batch(self, batch_size: int):
        """The tree a call over ``batch_size`` rows verifies (for the report)."""
        if self.call_tree is not None or isinstance(self, _LayerCutEngineMethod):
            return self.call_tree or self.tree
        from hf_speculative.engine.resolve import resolve_drafter

        drafter = resolve_drafter(self.model, self.draft)
        drafter.attach_target(self.model)
        return drafter.tree_for_batch(batch_size)


class _LayerCutEngineMethod(_LayerCutMixin, _EngineMethod):
    """The engine's loop over a layer-cut draft; subclasses choose the tree (`_layer_cut_tree`)."""

    def setup(self):
        super().setup()
        self._build_draft()
        self.tree = self._layer_cut_tree()

    def _layer_cut_tree(self):
        raise NotImplementedError

    def settings(self):
        return {"draft_layers": self.options.draft_layers, **self._tree_settings()}


@register_method
class TreeLayerCutMethod(_LayerCutEngineMethod):
    name = "tree-layercut"
    description = "hf_speculative tree loop, layer-cut self-speculative draft"

    def _layer_cut_tree(self):
        tree = parse_tree(self.options.tree)
        if tree is None:  # the drafter's own default tree, recorded for the JSON
            from hf_speculative.engine.resolve import resolve_drafter

            tree = resolve_drafter(self.model, self.draft).default_tree
        return tree


@register_method
class ChainLayerCutMethod(_LayerCutEngineMethod):
    name = "chain-layercut"
    description = "hf_speculative loop with a one-path tree (chain), layer-cut draft"

    def _layer_cut_tree(self):
        import hf_speculative as hfs

        return hfs.TreeSpec.chain(self.options.chain_length)


class _BuiltDraftMethod(_EngineMethod):
    """The engine's loop over a drafter built from the options (`_build_draft`), verifying ``--tree``, else the
    drafter's default tree; its settings are the drafter's (`_drafter_settings`) and the tree's."""

    def setup(self):
        super().setup()
        self.draft = self._build_draft()
        self.call_tree = self.tree = parse_tree(self.options.tree) or self.draft.default_tree

    def settings(self):
        return {**self._drafter_settings(), **self._tree_settings()}


@register_method
class TreePromptLookupMethod(_BuiltDraftMethod):
    name = "tree-prompt-lookup"
    description = "hf_speculative tree loop, n-gram (prompt lookup) tree drafter: no draft model"

    def _build_draft(self):
        import hf_speculative as hfs

        return hfs.PromptLookupDrafter(max_ngram_size=self.options.max_matching_ngram)

    def _drafter_settings(self):
        d = self.draft
        budget = "at most tree_nodes nodes, tree depth levels"
        return {"max_ngram_size": d.max_ngram_size, "max_candidates": d.max_candidates, "budget": budget}


@register_method
class EngineOnlyMethod(_EngineMethod):
    """``engine``: the engine's loop with nothing drafted (`RootOnlyDrafter`), every step a one-token step through
    its kernels; a method's tokens/s over this one is speculation's own share of its speedup."""

    name = "engine"
    label = ENGINE_LABEL
    description = (
        "hf_speculative tree loop with nothing drafted: every step a one-token step through the engine's kernels"
    )

    def setup(self):
        super().setup()
        self.draft = RootOnlyDrafter()

    def settings(self):
        return {"drafter": "RootOnlyDrafter (every draft is the root alone)", **ENGINE_CALL}

    def generate(self, input_ids, attention_mask, **common):
        return self.model.generate(
            input_ids, attention_mask=attention_mask, assistant_model=self.draft, **ENGINE_CALL, **common
        )

    def tree_for_batch(self, batch_size: int):
        return None  # nothing is drafted


@register_method
class MagicDecMethod(_BuiltDraftMethod):
    name = "magicdec"
    description = "hf_speculative tree loop, MagicDec: the target drafts for itself over a StreamingLLM sparse KV cache"

    def _build_draft(self):
        import hf_speculative as hfs

        o = self.options
        return hfs.MagicDecDrafter(
            self.model,
            sliding_window=o.magicdec_window,
            num_sink_tokens=o.magicdec_sinks,
            num_draft_tokens=o.chain_length,
            positions=o.magicdec_positions,
        )

    def _drafter_settings(self):
        d = self.draft
        return {
            "sliding_window": d.window,
            "num_sink_tokens": d.sinks,
            "num_draft_tokens": d.num_draft_tokens,
            "positions": d.positions,
        }


def _model_free_drafter(kind: str, options: BenchOptions):
    """A fresh Token Recycling (``kind="recycling"``) or SuffixDecoding (``"suffix"``) drafter, or the one saved in
    the folder of the option of that name."""
    import hf_speculative as hfs

    drafter_class = {"recycling": hfs.TokenRecyclingDrafter, "suffix": hfs.SuffixDrafter}[kind]
    folder = getattr(options, kind)
    return drafter_class.from_pretrained(folder) if folder else drafter_class()


class _ModelFreeMethod(_EngineMethod):
    """The engine's loop over a drafter with no model (`_model_free_drafter` of ``kind``): the tree is ``--tree``,
    else the drafter's own (``own_tree`` says how it is chosen); its settings are the drafter's ``reported`` ones
    (attributes of its config, or of the drafter where it keeps none)."""

    kind: ClassVar[str]
    own_tree: ClassVar[str]
    reported: ClassVar[tuple[str, ...]]

    def setup(self):
        super().setup()
        self.draft = _model_free_drafter(self.kind, self.options)
        self.call_tree = self.tree = parse_tree(self.options.tree)

    def settings(self):
        tree = self.own_tree if self.tree is None else self._tree_settings()["tree"]
        return {**self._drafter_settings(), self.kind: getattr(self.options, self.kind), "tree": tree}

    def _drafter_settings(self):
        source = getattr(self.draft, "config", self.draft)
        return {name: getattr(source, name) for name in self.reported}


@register_method
class TokenRecyclingMethod(_ModelFreeMethod):
    name = "token-recycling"
    description = "hf_speculative tree loop, Token Recycling (adjacency matrix of verified top-k; no model)"
    kind, own_tree = "recycling", "cost-aware, re-chosen online"
    reported = ("num_successors", "max_nodes")


@register_method
class SuffixMethod(_ModelFreeMethod):
    name = "suffix"
    description = "hf_speculative tree loop, SuffixDecoding (suffix match on past outputs and the row; no model)"
    kind, own_tree = "suffix", "budget, sized per step by the match"
    reported = ("alpha", "max_match_length", "min_probability", "max_nodes")

    def _drafter_settings(self):
        return {**super()._drafter_settings(), "warm_outputs": len(self.draft.index)}


@register_method
class HybridMethod(_EngineMethod):
    """``hybrid``: tree prompt lookup, Token Recycling and every ``--drafter`` in one merged tree; ``hybrid:A+B+...``
    merges only the named parts (``pl``: prompt lookup, ``tr``: Token Recycling, ``sx``: SuffixDecoding, or a
    ``--drafter`` method name)."""

    name = "hybrid"
    description = (
        "hf_speculative tree loop, one merged tree from tree prompt lookup, Token Recycling and every --drafter"
    )
    parts: ClassVar[tuple[str, ...] | None] = None

    def setup(self):
        import hf_speculative as hfs

        super().setup()
        names = self.parts or ("pl", "tr", *self.options.drafters)
        unknown = [n for n in names if n not in ("pl", "tr", "sx", *self.options.drafters)]
        if unknown:
            raise ValueError(
                f"unknown hybrid part(s) {unknown}: use pl, tr, sx or a --drafter name {sorted(self.options.drafters)}"
            )
        build = {
            "pl": lambda: hfs.PromptLookupDrafter(max_ngram_size=self.options.max_matching_ngram),
            "tr": lambda: _model_free_drafter("recycling", self.options),
            "sx": lambda: _model_free_drafter("suffix", self.options),
        }
        self.part_names = list(names)
        self.draft = hfs.HybridDrafter(
            [build[n]() if n in build else load_drafter(self.options.drafters[n], self.model) for n in names]
        )
        self.call_tree = self.tree = parse_tree(self.options.tree)

    def settings(self):
        return {"parts": self.part_names, "max_nodes": self.draft.max_nodes, "max_depth": self.draft.tree_depth}


def make_hybrid_method(name: str) -> type[BenchMethod]:
    """Register the ``hybrid:A+B`` method ``name``."""
    parts = tuple(p for p in name.partition(":")[2].split("+") if p)
    cls = type(
        f"HybridMethod_{'_'.join(parts)}",
        (HybridMethod,),
        {"name": name, "parts": parts, "description": f"hybrid of {parts}"},
    )
    return register_method(cls)


class DrafterMethod(_EngineMethod):
    """A trained drafter from ``--drafter [NAME=]PATH`` (Medusa heads, ParallelSpec, SPIRe, a small LM...).

    The method is named ``NAME``, or by default the drafter config's ``model_type``.
    """

    path: ClassVar[str] = ""

    def setup(self):
        super().setup()
        self.draft = load_drafter(self.path, self.model)
        self.call_tree = self.tree = parse_tree(self.options.tree)
        if self.tree is None:  # the drafter's own tree, recorded for the JSON
            from hf_speculative.engine.resolve import resolve_drafter

            self.tree = getattr(resolve_drafter(self.model, self.draft), "default_tree", None)

    def settings(self):
        return {"drafter": self.path, "drafter_type": type(self.draft).__name__, **self._tree_settings()}


def load_drafter(path: str, target=None):
    """Load a drafter folder: an hf_speculative drafter (registered Auto classes) or a causal LM."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from ..auto import register_auto_classes
    from ..hub import resolve_name_or_path

    register_auto_classes()  # idempotent; a script may have imported only this module
    path = resolve_name_or_path(path, what="drafter")  # a missing folder fails here, with no Hub lookup
    config = AutoConfig.from_pretrained(path)
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith("ForCausalLM") for a in archs):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=target.dtype if target is not None else None, attn_implementation="sdpa"
        )
    else:
        model = AutoModel.from_pretrained(path)
    if not isinstance(model, torch.nn.Module):  # a model-free drafter's folder (Token Recycling, SuffixDecoding)
        return model
    if target is not None:
        model.to(device=target.device, dtype=target.dtype)
    return model.eval()


def drafter_method_name(path: str) -> str:
    from transformers import AutoConfig

    from ..auto import register_auto_classes
    from ..hub import resolve_name_or_path

    register_auto_classes()
    return AutoConfig.from_pretrained(resolve_name_or_path(path, what="drafter")).model_type.replace("_", "-")


def make_drafter_method(name: str, path: str) -> type[BenchMethod]:
    """Register a :class:`DrafterMethod` subclass named ``name`` for the drafter at ``path``."""
    cls = type(
        f"DrafterMethod_{name}", (DrafterMethod,), {"name": name, "path": path, "description": f"drafter {path}"}
    )
    return register_method(cls)


def baselines_first(names: list[str]) -> list[str]:
    """``names`` with ``plain`` (the baseline) and then ``engine`` (the engine with nothing drafted) first, where given."""
    first = [n for n in ("plain", "engine") if n in names]
    return first + [n for n in names if n not in first]


def build_methods(names: list[str], model, tokenizer, options: BenchOptions) -> list[BenchMethod]:
    for name, path in options.drafters.items():
        make_drafter_method(name, path)
    for name in names:
        if name.startswith("hybrid:") and name not in METHODS:
            make_hybrid_method(name)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {sorted(METHODS)}")
    methods = [METHODS[n](model, tokenizer, options) for n in names]
    for m in methods:
        m.setup()
    return methods


# ----------------------------------------------------------------------------- timing


class _ForwardCounter:
    """A forward pre-hook that only increments an int."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def __call__(self, module, args):
        self.n += 1


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (CUDA) before the clock is read."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def generate_kwargs(model, tokenizer, max_new_tokens: int, temperature: float) -> dict:
    """The ``generate()`` arguments every method of a run shares: greedy (``temperature`` 0) or plain sampling at
    ``temperature``, the model's end-of-sequence and padding tokens, a dict output."""
    gc = model.generation_config
    kw = dict(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        return_dict_in_generate=True,
        eos_token_id=gc.eos_token_id,
        pad_token_id=gc.pad_token_id if gc.pad_token_id is not None else tokenizer.pad_token_id,
    )
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    return kw


def time_one(method: BenchMethod, prompt: BenchPrompt, common: dict, device, seed: int | None = None):
    """One timed generate: ``(output, seconds, hook_count)``."""
    ids = prompt.input_ids
    mask = torch.ones_like(ids)
    counter = None
    handle = None
    if method.count_forwards_with_hook:
        counter = _ForwardCounter()
        handle = method.model.register_forward_pre_hook(counter)
    if seed is not None:
        torch.manual_seed(seed)
    try:
        synchronize(device)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = method.generate(ids, mask, **common)
            synchronize(device)
            t1 = time.perf_counter()
    finally:
        if handle is not None:
            handle.remove()
    return out, t1 - t0, (counter.n if counter is not None else None)


def _version_or_none(name: str) -> str | None:
    """The installed distribution's version; None when the package runs from a source tree (PYTHONPATH)."""
    try:
        return version(name)
    except PackageNotFoundError:  # not installed, only importable
        return None


def machine_info(device) -> dict:

    import transformers

    from .shape_bench import cpu_info

    cpu = cpu_info()
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu["cpu"],
        "cpu_flags": cpu["flags"],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_speculative": _version_or_none("hf-speculative"),
        "device": str(device),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def machine_line(setting: dict) -> str:
    """One line naming where a result was measured: the CPU (or GPU) with its vector flags, threads, and the
    process's peak resident memory (``setting["peak_resident_bytes"]``) when recorded."""
    machine = setting.get("machine") or {}
    flags = ", ".join(f"{f} {'yes' if have else 'no'}" for f, have in (machine.get("cpu_flags") or {}).items())
    where = machine.get("gpu") or machine.get("cpu") or machine.get("processor", "?")
    line = f"measured on: {where}{f' ({flags})' if flags else ''}, {machine.get('torch_threads', '?')} torch threads"
    peak = setting.get("peak_resident_bytes")
    return line + (f"; peak resident memory of this process {peak / 2**30:.2f} GiB" if peak else "")


def run_benchmark(
    model,
    tokenizer,
    records,
    methods: list[str],
    options: BenchOptions | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    repeats: int = 1,
    seed: int = 0,
    device=None,
    warmup_tokens: int = 16,
    progress: bool = True,
    save_text: bool = False,
    extra_setting: dict | None = None,
    checkpoint: Callable[[dict], None] | None = None,
    numerics_floor: bool = True,
) -> dict:
    """Benchmark ``methods`` on ``records``; returns the JSON-ready result dict.

    ``numerics_floor`` (greedy only): also run plain ``generate()`` untimed in the other batch shapes of
    `hf_speculative.bench.numerics` and report how often its output changes (``result["numerics_floor"]``).

    ``checkpoint(partial_result)`` is called after every prompt (outside any timed region) with the
    result so far (``setting["partial"] = True``), e.g. to keep a JSON file up to date.
    """
    options = options or BenchOptions()
    device = device or model.device
    methods = baselines_first(methods)  # plain, then the engine with nothing drafted, first in every round
    model.eval()
    bench_methods = build_methods(methods, model, tokenizer, options)
    prompts = prepare_prompts(records, tokenizer, device=device)
    common = generate_kwargs(model, tokenizer, max_new_tokens, temperature)
    greedy = temperature <= 0
    _warm_up(bench_methods, prompts[0], {**common, "max_new_tokens": min(warmup_tokens, max_new_tokens)}, device, seed)
    floor: dict[str, dict[str, int | None]] | None = {} if greedy and numerics_floor else None
    result = functools.partial(
        _assemble,
        model=model,
        greedy=greedy,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        repeats=repeats,
        seed=seed,
        device=device,
        bench_methods=bench_methods,
        options=options,
        save_text=save_text,
        extra_setting=extra_setting,
        floor=floor,
    )
    run = _PromptRun(model, bench_methods, common, device, repeats, tokenizer if save_text else None, floor)
    measurements = run.measure_all(prompts, None if greedy else seed, progress, checkpoint=checkpoint, result=result)
    return result(measurements, len(prompts), partial=False)


def _warm_up(bench_methods, prompt: BenchPrompt, common: dict, device, seed: int) -> None:
    """One untimed call of every method (``common`` with the warm-up's ``max_new_tokens``)."""
    for m in bench_methods:
        time_one(m, prompt, common, device, seed)


@dataclass
class _PromptRun:
    """What every prompt of a `run_benchmark` call is measured with; ``floor`` (or None) collects the numerics
    floor of each prompt, ``tokenizer`` (or None) decodes the texts."""

    model: Any
    bench_methods: list
    common: dict
    device: Any
    repeats: int
    tokenizer: Any
    floor: dict | None

    def measure_all(
        self, prompts: list[BenchPrompt], seed: int | None, progress: bool, checkpoint=None, result=None
    ) -> list[Measurement]:
        """Every method on every prompt, prompt by prompt (prompt i seeded ``seed + i``; ``seed`` None: greedy,
        unseeded); after every prompt but the last, ``checkpoint(result(measurements, n_done, partial=True))``."""
        from tqdm.auto import tqdm

        measurements: list[Measurement] = []
        bar = tqdm(total=len(prompts) * len(self.bench_methods), desc="bench", unit="gen", disable=not progress)
        for i, prompt in enumerate(prompts):
            run_seed = seed + i if seed is not None else None
            measurements += _measure_prompt(
                self.bench_methods, prompt, self.common, self.device, run_seed, self.repeats, self.tokenizer, bar
            )
            if self.floor is not None:
                self.floor[prompt.id] = _floor_of_prompt(self.model, prompt, self.common, measurements, self.device)
            if checkpoint is not None and i + 1 < len(prompts):
                checkpoint(result(measurements, i + 1, partial=True))
        bar.close()
        return measurements


def _measure_prompt(
    bench_methods, prompt: BenchPrompt, common: dict, device, seed: int | None, repeats: int, tokenizer, bar
) -> list[Measurement]:
    """Every method on one prompt, in order (the progress bar advanced after each)."""
    measured = []
    for m in bench_methods:
        measured.append(_measure(m, prompt, common, device, seed, repeats, tokenizer))
        bar.update(1)
        bar.set_postfix(method=m.name)
    return measured


def _measure(
    m, prompt: BenchPrompt, common: dict, device, seed: int | None, repeats: int, tokenizer=None
) -> Measurement:
    """``repeats`` timed calls of one method on one prompt (one for a drafter that learns across calls: a second call
    would draft from the first one's answer); the first call's output is the one measured (its text decoded when a
    ``tokenizer`` is given)."""
    prompt_len = prompt.input_ids.shape[1]
    walls, out, hook_count = [], None, None
    for _ in range(1 if learns_across_calls(m) else repeats):
        out_r, dt, hc = time_one(m, prompt, common, device, seed=seed)
        walls.append(dt)
        if out is None:
            out, hook_count = out_r, hc
    new_ids = out.sequences[0, prompt_len:].tolist()
    stats = getattr(out, "speculative_stats", None)
    return Measurement(
        prompt_id=prompt.id,
        category=prompt.category,
        method=m.name,
        new_tokens=len(new_ids),
        wall_s=walls,
        target_forwards=m.target_forwards(out, len(new_ids), hook_count),
        accepted_lengths=list(stats.accepted_lengths) if stats is not None else None,
        output_ids=new_ids,
        timings=dict(stats.timings) if stats is not None and getattr(stats, "timings", None) else None,
        prompt_tokens=prompt_len,
        text=tokenizer.decode(new_ids, skip_special_tokens=True) if tokenizer is not None else None,
    )


def learns_across_calls(m) -> bool:
    """Whether method ``m``'s drafter keeps what it saw across calls (`TreeDrafter.learns_across_calls`): timing it
    again on the same prompt would time a drafter that has seen the answer, so benchmarks time its first call only."""
    return bool(getattr(getattr(m, "draft", None), "learns_across_calls", False))


def _floor_of_prompt(model, prompt: BenchPrompt, common: dict, measurements: list[Measurement], device) -> dict:
    """``{variant: first divergence from plain's batch-of-one output}`` (``None``: identical) for one prompt;
    plain's output is this run's ``plain`` measurement, or one more untimed plain call without it."""
    plain = next((m.output_ids for m in measurements if m.method == "plain" and m.prompt_id == prompt.id), None)
    ids = prompt.input_ids
    with torch.inference_mode():
        if plain is None:
            plain = (
                _transformers_generate(model, ids, attention_mask=torch.ones_like(ids), **common)
                .sequences[0, ids.shape[1] :]
                .tolist()
            )
        outputs = floor_outputs(model, ids, common)
    synchronize(device)
    return {variant: first_divergence(outputs[variant], plain) for variant in FLOOR_VARIANTS}


def _assemble(
    measurements,
    n_done,
    partial,
    *,
    model,
    greedy,
    max_new_tokens,
    temperature,
    repeats,
    seed,
    device,
    bench_methods,
    options,
    save_text,
    extra_setting,
    floor=None,
):
    summary = summarize(measurements, greedy=greedy)
    for m in bench_methods:
        if m.name in summary:
            summary[m.name]["label"] = m.label or m.name
    setting = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "greedy": greedy,
        "n_prompts": n_done,
        "repeats": repeats,
        "seed": seed,
        "dtype": str(model.dtype),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "machine": machine_info(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "methods": {m.name: {"description": m.description, **m.settings()} for m in bench_methods},
        "options": asdict(options),
        "timing": "time.perf_counter around the generate call only; tokenization/chat template outside",
        **(extra_setting or {}),
    }
    if partial:
        setting["partial"] = True
    result = {
        "setting": setting,
        "methods": summary,
        "prompts": prompts_json(measurements, save_text=save_text),
    }
    if floor:
        result["numerics_floor"] = {
            "description": "plain greedy generate() on the same prompts and dtype, as one row of a batch of 2 identical "
            "rows (batch_of_two) and with the prefill split in two forwards (split_prefill), against its batch-of-one "
            "output; first divergence: index of the first differing new token",
            **summarize_floor(floor),
        }
        for row in result["prompts"]:
            if row["id"] in floor:
                row["numerics_floor"] = floor[row["id"]]
    return result
