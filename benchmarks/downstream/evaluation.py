"""``downstream eval``: a trained folder loaded as a user would, its plain greedy decoding against its speculative
decoding on the task's test prompts, interleaved per prompt in one process (Speculative Streaming, Sec. 4.1,
Table 1: speedup, tokens per step, task metric, extra parameters).

What each folder decodes with (the model is always the fine-tuned one: base + the folder's LoRA):

=============  =================================================  ===============================================
method         plain                                              speculative
=============  =================================================  ===============================================
``lora``       base + adapter (merged), ``generate()``             the same model with tree prompt lookup, Token
                                                                  Recycling, SuffixDecoding (warmed with the task's
                                                                  training targets) or a hybrid (``drafter``: no
                                                                  drafter weights, training-free drafting)
``medusa2``    base + adapter (merged), ``generate()``             the same model with its Medusa-2 heads
``streaming``  ``ss.generate_autoregressive`` (the joint forward,  ``ss.generate``: drafts itself
               one token per forward)
``eagle``      base + the lora adapter (merged), ``generate()``    the same model with its EAGLE-3 drafter
``medusa``     base + the lora adapter (merged), ``generate()``    the same model with its Medusa-1 heads
=============  =================================================  ===============================================

tau is the mean number of tokens committed per target forward (bonus included); speedup is the speculative
tokens/s over the same model's plain tokens/s on the same prompts; lossless_rate the share of prompts whose
speculative greedy output equals the plain one token for token; the metric is computed on the plain outputs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .drafter_names import SUFFIX_DRAFTERS, TRAINING_FREE
from .training import ADAPTER_SUBFOLDER, read_downstream_info

__all__ = ["DownstreamModel", "load_downstream", "evaluate_folder", "compute_metric"]


@dataclass
class DownstreamModel:
    """A loaded folder: ``plain(ids)`` and ``speculative(ids)`` return generate outputs (``return_dict_in_generate``;
    the speculative one carries ``speculative_stats``), for greedy decoding of ``max_new_tokens``."""

    info: dict
    tokenizer: object
    plain: Callable
    speculative: Callable
    drafter: str
    extra_parameters: int
    device: torch.device
    drafter_stats: Callable[[], dict] | None = None
    model: object = None  # the decoding model (lora and eagle folders: base + adapter, merged)


def folder_adapter(folder: Path, method: str) -> str:
    """The adapter (relative to ``folder``) whose merged model a ``lora``, ``eagle`` or ``medusa`` folder decodes."""
    if method == "eagle":
        from hf_speculative.drafters.eagle.configuration_eagle import EagleConfig

        return getattr(EagleConfig.from_pretrained(folder), "base_adapter", ADAPTER_SUBFOLDER)
    if method == "medusa":
        from hf_speculative.drafters.medusa.configuration_medusa import MedusaConfig

        return getattr(MedusaConfig.from_pretrained(folder), "base_adapter", None) or ADAPTER_SUBFOLDER
    return ADAPTER_SUBFOLDER


def _merged(base, folder: Path, adapter: str = ADAPTER_SUBFOLDER):
    """``base`` with the PEFT adapter at ``folder / adapter`` merged (an EAGLE folder names its LoRA folder's adapter)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(folder / adapter)).merge_and_unload().eval()


#: the methods whose folders decode the model of a ``lora`` folder (base + its adapter), so one loaded copy serves them
SHARED_TARGET_METHODS = ("lora", "eagle", "medusa")
#: the methods whose folders hold a trained drafter that ``hybrid-suffix`` merges with SuffixDecoding
TRAINED_DRAFTER_METHODS = ("medusa2", "eagle", "medusa")

#: transformers' own prompt lookup (a chain of this many tokens), the baseline beside the tree drafters
HF_PROMPT_LOOKUP_TOKENS = 10


def training_targets(task: str, data_dir) -> list[str]:
    """The reference answers of the task's training split: what a SuffixDecoding drafter is warmed with."""
    from .tasks import get_task

    return [answer for r in get_task(task).load(data_dir, "train") for answer in (r.answers or [])[:1] if answer]


def chat_answers(path) -> list[str]:
    """The last assistant turn of every record of a chat jsonl (``self_distilled.jsonl``: a model's own answers)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            messages = json.loads(line)["messages"]
            if messages and messages[-1]["role"] == "assistant" and messages[-1]["content"]:
                out.append(messages[-1]["content"])
    return out


def _suffix_drafter(texts: list[str] | None, tokenizer):
    """A `SuffixDrafter` warmed with ``texts`` (each followed by the tokenizer's EOS, as the model ends an answer)."""
    import hf_speculative as hfs

    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] + eos for t in texts or []]
    return hfs.SuffixDrafter().warm(encoded)


def _suffix_stats(drafter, hybrid=None) -> dict:
    """SuffixDecoding's structure and match lengths; in a hybrid, each part's rows drafted and left out by its gate."""
    index = drafter.index
    stats = {
        "suffix_structure": {"outputs": len(index), "tokens": index.num_tokens, "bytes": index.nbytes},
        "suffix_match_lengths": {str(k): v for k, v in sorted(drafter.match_lengths.items())},
    }
    if hybrid is not None:
        parts = [type(d).__name__ for d in hybrid.drafters]
        stats["hybrid_rows_drafted"] = dict(zip(parts, hybrid.drafted))
        stats["hybrid_rows_gated_out"] = dict(zip(parts, hybrid.skipped))
        # what the gate weighed: each part's drafting cost per step (plain steps) on the target's cost curve, and
        # where that curve came from (a measured curve, the kernel table's or the default)
        stats["hybrid_drafting_cost"] = dict(zip(parts, [round(c, 4) for c in getattr(hybrid, "_costs", [])]))
        curve = getattr(hybrid, "_curve", None)
        stats["hybrid_cost_curve"] = {
            "source": (getattr(curve, "meta", None) or {}).get("source", "measured"),
            **({f"c({n})": round(float(curve(n)), 4) for n in (1, 8, 16, 32)} if curve is not None else {}),
        }
    return stats


def _training_free_drafter(name: str, warm_texts: list[str] | None = None, tokenizer=None):
    """Tree prompt lookup; Token Recycling (its adjacency matrix learns from the verified logits across the
    evaluated prompts, cold at the first); SuffixDecoding warmed with ``warm_texts`` (and learning the evaluated
    outputs as it goes); or a hybrid (`HybridDrafter`): prompt lookup with Token Recycling, or with SuffixDecoding."""
    import hf_speculative as hfs

    if name in SUFFIX_DRAFTERS:
        suffix = _suffix_drafter(warm_texts, tokenizer)
        if name == "suffix":
            return suffix, f"suffix decoding (warmed with {len(suffix.index)} training answers)"
        return hfs.HybridDrafter([hfs.PromptLookupDrafter(), suffix]), "hybrid (prompt lookup + suffix decoding)"
    if name == "prompt-lookup":
        return hfs.PromptLookupDrafter(), "tree prompt lookup"
    if name == "engine":  # the engine's loop with nothing drafted: what speculation adds is measured against it
        from hf_speculative.bench.root_only import ENGINE_LABEL, RootOnlyDrafter

        return RootOnlyDrafter(), ENGINE_LABEL
    if name == "hf-prompt-lookup":  # no drafter of ours: generate(prompt_lookup_num_tokens=...)
        return None, f"transformers prompt lookup ({HF_PROMPT_LOOKUP_TOKENS} tokens)"
    if name == "token-recycling":
        return hfs.TokenRecyclingDrafter(), "token recycling"
    if name == "hybrid":
        return hfs.HybridDrafter(
            [hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter()]
        ), "hybrid (prompt lookup + token recycling)"
    raise ValueError(f"drafter must be one of {TRAINING_FREE}, got {name!r}")


def _load_streaming(
    folder: Path, info: dict, tokenizer, base, pruning_threshold: float | None, gen: dict, engine_only: bool = False
) -> DownstreamModel:
    """A ``streaming`` folder: plain is the joint forward one token at a time, speculative the streams' own drafting
    (``engine_only``: the joint forward's one-token steps through the engine, nothing drafted)."""
    from hf_speculative.bench.root_only import ENGINE_CALL, ENGINE_LABEL, RootOnlyDrafter
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import LlamaForSpeculativeStreaming

    ss = LlamaForSpeculativeStreaming.from_pretrained(folder, base_model=base)
    ss.streams.to(device=base.device)
    if pruning_threshold is not None:
        ss.config.pruning_threshold = pruning_threshold
    name = "speculative streaming (shared mode, self-drafting)"
    if ss.config.pruning_layer is not None and ss.config.pruning_threshold > 0:
        name = f"speculative streaming (shared mode, self-drafting, tree pruning after layer {ss.config.pruning_layer} at {ss.config.pruning_threshold:g})"
    drafting = {"assistant_model": RootOnlyDrafter(), **ENGINE_CALL} if engine_only else {}
    return DownstreamModel(
        info,
        tokenizer,
        plain=lambda ids, n: ss.generate_autoregressive(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, **gen
        ),
        speculative=lambda ids, n: ss.generate(ids, max_new_tokens=n, **drafting, **gen),
        drafter=ENGINE_LABEL if engine_only else name,
        extra_parameters=0 if engine_only else ss.num_stream_parameters(),
        device=base.device,
    )


def load_downstream(
    folder: str | Path,
    device: str | None = None,
    dtype: torch.dtype = torch.float32,
    drafter: str = "prompt-lookup",
    pruning_threshold: float | None = None,
    warm_texts: list[str] | None = None,
    target: tuple | None = None,
) -> DownstreamModel:
    """Load a ``downstream train`` folder: its base (``"reference"``: the reference package) and what the folder adds.
    ``drafter``: the training-free drafting of a ``lora`` folder (`TRAINING_FREE`; a suffix drafter is warmed with
    ``warm_texts``); other folders draft with what they trained, and with ``"hybrid-suffix"`` with what they trained
    and SuffixDecoding in one merged tree (`HybridDrafter`; Medusa-2 and EAGLE folders; ``"hybrid-suffix-ungated"``:
    the same with the hybrid's gate off, the trained drafter drafting for every row on every step). ``pruning_threshold``: a streaming folder with a pruning early exit decodes with this
    threshold instead of its own (0: no pruning). ``target``: ``(model, tokenizer)`` of a ``lora`` or ``eagle``
    folder already loaded (its adapter merged), shared instead of loading another copy (`compare`)."""
    import hf_speculative as hfs
    from hf_speculative.bench.reference import resolve_model

    folder = Path(folder)
    info = read_downstream_info(folder)
    method = info["method"]
    hybrid_suffix = drafter.startswith("hybrid-suffix") and method in TRAINED_DRAFTER_METHODS
    gate = drafter != "hybrid-suffix-ungated"  # ungated: the trained drafter drafts for every row on every step
    engine_only = drafter == "engine"  # any folder: its model's one-token steps through the engine
    if drafter != "prompt-lookup" and method != "lora" and not (hybrid_suffix or engine_only):
        raise ValueError(
            f"--drafter {drafter} applies to a 'lora' folder (engine to every folder, hybrid-suffix to a "
            f"{', '.join(TRAINED_DRAFTER_METHODS)} folder too); {folder} drafts with its own {method} drafter"
        )
    if pruning_threshold is not None and (method != "streaming" or not (info.get("training") or {}).get("pruning")):
        raise ValueError(
            f"--pruning-threshold applies to a streaming folder trained with --pruning-layer; {folder} has no pruning early exit"
        )
    if target is not None and method not in SHARED_TARGET_METHODS:
        raise ValueError(f"a shared target serves lora, eagle and medusa folders, not {method}")
    base, tokenizer = target or resolve_model(info["base_model"], dtype=dtype, device=device)
    gen = dict(do_sample=False, return_dict_in_generate=True)

    if method == "streaming":
        return _load_streaming(folder, info, tokenizer, base, pruning_threshold, gen, engine_only)
    if method == "medusa2":
        from hf_speculative.drafters.medusa.training_medusa2 import load_medusa2

        model, heads = load_medusa2(folder, base, merge=True)
        drafter, name, extra = heads, "medusa-2 heads", sum(p.numel() for p in heads.parameters())
        if engine_only:
            (drafter, name), extra = _training_free_drafter("engine"), 0
    elif method == "eagle":
        from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter

        model = base if target is not None else _merged(base, folder, folder_adapter(folder, method))
        eagle = EagleDrafter.from_pretrained(folder, base_model=model).to(device=model.device, dtype=model.dtype).eval()
        drafter, name, extra = eagle, "eagle-3", sum(p.numel() for p in eagle.parameters())
    elif method == "medusa":
        from hf_speculative.drafters.medusa.modeling_medusa import MedusaHeadsModel

        model = base if target is not None else _merged(base, folder, folder_adapter(folder, method))
        heads = MedusaHeadsModel.from_pretrained(folder)
        heads.attach_base_model(model)
        heads = heads.to(device=model.device, dtype=model.dtype).eval()
        drafter, name, extra = heads, "medusa heads", sum(p.numel() for p in heads.parameters())
    else:  # lora: training-free drafting on the fine-tuned model
        model = base if target is not None else _merged(base, folder)
        (drafter, name), extra = _training_free_drafter(drafter, warm_texts, tokenizer), 0
    if hybrid_suffix:
        suffix = _suffix_drafter(warm_texts, tokenizer)
        drafter = hfs.HybridDrafter([drafter, suffix], gate=gate)
        name = f"hybrid ({name} + suffix decoding{'' if gate else ', ungated'})"
    hfs.enable(model)
    suffix = next((d for d in getattr(drafter, "parts", [drafter]) if isinstance(d, hfs.SuffixDrafter)), None)
    hybrid = drafter if isinstance(drafter, hfs.HybridDrafter) else None
    drafting = (
        {"assistant_model": drafter} if drafter is not None else {"prompt_lookup_num_tokens": HF_PROMPT_LOOKUP_TOKENS}
    )
    return DownstreamModel(
        info,
        tokenizer,
        plain=lambda ids, n: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, **gen),
        speculative=lambda ids, n: model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, **drafting, **gen
        ),
        drafter=name,
        extra_parameters=extra,
        device=model.device,
        drafter_stats=(lambda: _suffix_stats(suffix, hybrid)) if suffix is not None else None,
        model=model,
    )


def compute_metric(task: str, predictions: list[str], references: list[list[str]]) -> dict:
    """The task's metric through `evaluate` (the local modules of `hf_speculative.bench.metrics`): ``rougeL`` and
    ``rouge1`` (best reference per prediction) for E2E NLG and DialogSum, ``exact_match`` for WikiSQL."""
    from hf_speculative.bench.metrics import load_metric

    from .tasks import get_task

    spec = get_task(task)
    result = load_metric(spec.metric).compute(predictions=predictions, references=references)
    return {k: round(float(result[k]), 4) for k in spec.metric_keys}


def _decode_interleaved(loaded: DownstreamModel, prompts: list[torch.Tensor], n_new: int, progress: bool, desc: str):
    """Decode each prompt plainly and speculatively, the order alternating from prompt to prompt: ``(seconds and
    new tokens per kind, plain texts, number of identical outputs, accepted lengths, target forwards, tree sizes)``."""
    times = {"plain": 0.0, "speculative": 0.0}
    tokens = {"plain": 0, "speculative": 0}
    texts, same, accepted, forwards, nodes = [], 0, [], 0, []
    iterator = enumerate(prompts)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(prompts), desc=desc, unit="prompt")
    for i, ids in iterator:
        outs = {}
        for kind in ("plain", "speculative") if i % 2 == 0 else ("speculative", "plain"):
            fn = loaded.plain if kind == "plain" else loaded.speculative
            if loaded.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(ids, n_new)
            if loaded.device.type == "cuda":
                torch.cuda.synchronize()
            times[kind] += time.perf_counter() - t0
            outs[kind] = out.sequences[0, ids.shape[1] :].cpu()
            tokens[kind] += outs[kind].numel()
            stats = getattr(out, "speculative_stats", None)  # None: transformers' own decoding
            if kind == "speculative" and stats is not None:
                accepted += list(stats.accepted_lengths)
                nodes += list(getattr(stats, "tree_sizes", []))
                forwards += getattr(stats, "num_target_forwards", len(stats.accepted_lengths))
        same += int(torch.equal(outs["plain"], outs["speculative"]))
        texts.append(loaded.tokenizer.decode(outs["plain"], skip_special_tokens=True).strip())
    return times, tokens, texts, same, accepted, forwards, nodes


def _decoding_train_seconds(training: dict, drafter: str) -> float | None:
    """The folder's training time, plus a pruning early exit's extraction and training when this decoding uses it."""
    train_seconds = training.get("train_seconds")
    pruning = training.get("pruning") or {}
    if train_seconds is not None and pruning and "tree pruning" in drafter:  # the early exit is part of this decoding
        train_seconds = round(train_seconds + pruning["extract_seconds"] + pruning["train_seconds"], 1)
    return train_seconds


@torch.inference_mode()
def evaluate_folder(
    folder: str | Path,
    task: str,
    data_dir,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    device: str | None = None,
    progress: bool = True,
    drafter: str = "prompt-lookup",
    pruning_threshold: float | None = None,
    warm_answers=None,
) -> dict:
    """Decode the test prompts of ``task`` with the folder's plain and speculative greedy decoding, interleaved per
    prompt (the order alternates from prompt to prompt; one warm-up prompt first, not counted); returns the eval
    record (`hf_speculative.commands.downstream` writes it as JSON). The training time is the folder's, a pruning
    early exit's extraction and training included. ``warm_answers``: a chat jsonl whose assistant turns warm the
    suffix drafters instead of the task's training references (the fine-tuned model's own answers to training
    prompts, an EAGLE folder's ``self_distilled.jsonl``)."""
    from hf_speculative.bench.harness import machine_info
    from hf_speculative.training.data import encode_chat

    from .tasks import get_task

    spec = get_task(task)
    warm_texts = None
    if warm_answers is not None and drafter not in SUFFIX_DRAFTERS:
        raise ValueError(f"--warm-answers warms a suffix drafter ({', '.join(SUFFIX_DRAFTERS)}), not {drafter!r}")
    if drafter in SUFFIX_DRAFTERS:
        warm_texts = chat_answers(warm_answers) if warm_answers else training_targets(task, data_dir)
    loaded = load_downstream(
        folder, device=device, drafter=drafter, pruning_threshold=pruning_threshold, warm_texts=warm_texts
    )
    if loaded.info["task"] != task:
        print(f"note: {folder} was trained on {loaded.info['task']!r}, evaluated on {task!r}")
    records = spec.load(data_dir, "test")[: limit or None]
    if not records:
        raise ValueError(f"no test prompts for {task} in {data_dir}")
    n_new = max_new_tokens or spec.max_new_tokens
    tok = loaded.tokenizer
    prompts = [torch.tensor([encode_chat(tok, r.messages)], device=loaded.device) for r in records]
    loaded.plain(prompts[0], 8)  # warm-up
    loaded.speculative(prompts[0], 8)
    desc = f"eval {loaded.info['method']} on {task}"
    times, tokens, texts, same, accepted, forwards, nodes = _decode_interleaved(loaded, prompts, n_new, progress, desc)
    plain_tps = tokens["plain"] / max(times["plain"], 1e-9)
    spec_tps = tokens["speculative"] / max(times["speculative"], 1e-9)
    training = loaded.info.get("training") or {}
    train_seconds = _decoding_train_seconds(training, loaded.drafter)
    return {
        "task": task,
        "method": loaded.info["method"],
        "folder": str(folder),
        "drafter": loaded.drafter,
        "warmed_with": (str(warm_answers) if warm_answers else "training references") if warm_texts else None,
        "n": len(records),
        "tau": round(sum(accepted) / len(accepted), 4) if accepted else None,
        "speedup": round(spec_tps / plain_tps, 4),
        "lossless_rate": round(same / len(records), 4),
        "metric": compute_metric(task, texts, [list(r.reference) for r in records]),
        "extra_parameters": loaded.extra_parameters,
        "lora_parameters": training.get("lora_parameters"),
        "train_seconds": train_seconds,
        "train_steps": training.get("steps"),
        "train_device": training.get("device"),
        "plain_tokens_per_s": round(plain_tps, 3),
        "speculative_tokens_per_s": round(spec_tps, 3),
        "new_tokens": tokens,
        "target_forwards": forwards,
        "verified_nodes_per_step": round(sum(nodes) / len(nodes), 2) if nodes else None,
        "max_new_tokens": n_new,
        "machine": machine_info(loaded.device),
        **(loaded.drafter_stats() if loaded.drafter_stats is not None else {}),
        "samples": [
            {"prompt": r.prompt[-200:], "output": t, "reference": list(r.reference)[0]}
            for r, t in zip(records[:3], texts[:3])
        ],
    }
