"""``downstream compare``: several arms on one fine-tuned model in one process, beside its plain greedy decoding.

``downstream eval`` measures one arm against plain decoding per run, so two arms' speedups carry two runs' noise.
Here every test prompt is decoded plainly and by every arm, the order rotating from prompt to prompt, so that each
arm's tokens/s and the plain tokens/s come from the same minutes of the same process. An arm is ``FOLDER`` (what
the folder drafts with) or ``FOLDER:DRAFTER`` (``downstream eval --drafter``): a ``lora`` folder's training-free
drafting, ``engine`` (nothing drafted: the engine's own share), ``hf-prompt-lookup`` (transformers' own), or an
``eagle`` or ``medusa`` folder with ``hybrid-suffix``. Every arm must decode the same model: ``lora`` folders, and
``eagle`` and ``medusa`` folders whose ``base_adapter`` is that folder's adapter; or one ``medusa2`` or ``streaming``
folder, which holds a model of its own, with its ``:engine`` arm (that model's one-token steps through the engine).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .drafter_names import SUFFIX_DRAFTERS, TRAINING_FREE
from .evaluation import (
    SHARED_TARGET_METHODS,
    chat_answers,
    compute_metric,
    folder_adapter,
    load_downstream,
    training_targets,
)
from .training import read_downstream_info

__all__ = ["parse_arm", "compare_arms", "markdown_comparison"]


def parse_arm(text: str) -> tuple[str, str]:
    """``FOLDER[:DRAFTER]`` -> ``(folder, drafter)``; the folder's own drafting is ``"prompt-lookup"`` (the default of
    `load_downstream`, which non-``lora`` folders ignore)."""
    folder, sep, drafter = text.rpartition(":")
    if sep and drafter in TRAINING_FREE:
        return folder, drafter
    return text, "prompt-lookup"


def _target_model(folder: Path) -> str:
    """What names the model a folder decodes: the adapter whose merged model a ``lora``, ``eagle`` or ``medusa``
    folder decodes (a ``lora`` folder's own, the others' ``base_adapter``); a ``medusa2`` or ``streaming`` folder has
    a model of its own, the folder itself."""
    method = read_downstream_info(folder)["method"]
    if method not in SHARED_TARGET_METHODS:
        return f"{method} folder {folder.resolve()}"
    return f"adapter {(folder / folder_adapter(folder, method)).resolve()}"


def _load_arms(arms: list[tuple[str, str]], task: str, data_dir, device, warm_answers) -> list:
    """Each arm loaded (`load_downstream`), after checking they all decode one model (a ``medusa2`` or ``streaming``
    folder's own model: that folder's arms, its drafter and ``:engine``)."""
    models = {_target_model(Path(folder)) for folder, _ in arms}
    if len(models) != 1:
        raise ValueError(
            f"the arms decode different models ({sorted(models)}); compare runs arms on one fine-tuned model: lora, "
            "eagle and medusa folders on one adapter, or one medusa2 or streaming folder with its :engine arm"
        )
    loaded, target = [], None
    for folder, drafter in arms:
        warm = None
        if drafter in SUFFIX_DRAFTERS:
            warm = chat_answers(warm_answers) if warm_answers else training_targets(task, data_dir)
        arm = load_downstream(folder, device=device, drafter=drafter, warm_texts=warm, target=target)
        if arm.info["method"] in SHARED_TARGET_METHODS:
            target = target or (arm.model, arm.tokenizer)  # one copy of the model serves every arm
        loaded.append(arm)
    return loaded


def _tally(row: dict, out, seconds: float, n_prompt: int) -> torch.Tensor:
    """Add one decoding to an arm's running totals; returns its new tokens."""
    new = out.sequences[0, n_prompt:].cpu()
    row["seconds"] += seconds
    row["tokens"] += new.numel()
    stats = getattr(out, "speculative_stats", None)
    if stats is not None:
        row["accepted"] += list(stats.accepted_lengths)
        row["nodes"] += list(getattr(stats, "tree_sizes", []))
    return new


def _decode_rotating(plain, loaded: list, prompts: list[torch.Tensor], n_new: int, progress: bool):
    """Every prompt decoded plainly and by every arm, the order rotating per prompt: per-kind totals and plain texts."""
    rows = [{"seconds": 0.0, "tokens": 0, "accepted": [], "nodes": [], "same": 0} for _ in range(len(loaded) + 1)]
    texts = []
    iterator = enumerate(prompts)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, total=len(prompts), desc="compare", unit="prompt")
    fns = [plain] + [arm.speculative for arm in loaded]
    for i, ids in iterator:
        outs = {}
        for k in [(i + j) % len(fns) for j in range(len(fns))]:
            t0 = time.perf_counter()
            out = fns[k](ids, n_new)
            outs[k] = _tally(rows[k], out, time.perf_counter() - t0, ids.shape[1])
        for k in range(1, len(fns)):
            rows[k]["same"] += int(torch.equal(outs[k], outs[0]))
        texts.append(loaded[0].tokenizer.decode(outs[0], skip_special_tokens=True).strip())
    return rows, texts


def _arm_record(arm, folder: str, drafter: str, row: dict, plain_tps: float, n: int) -> dict:
    tps = row["tokens"] / max(row["seconds"], 1e-9)
    training = arm.info.get("training") or {}
    named = arm.info["method"] == "lora" or drafter.startswith(("hybrid-suffix", "engine"))  # not the folder's own
    return {
        "arm": f"{folder}:{drafter}" if named else folder,
        "method": arm.info["method"],
        "drafter": arm.drafter,
        "tau": round(sum(row["accepted"]) / len(row["accepted"]), 4) if row["accepted"] else None,
        "tokens_per_s": round(tps, 3),
        "speedup": round(tps / plain_tps, 4),
        "lossless_rate": round(row["same"] / n, 4),
        "verified_nodes_per_step": round(sum(row["nodes"]) / len(row["nodes"]), 2) if row["nodes"] else None,
        "extra_parameters": arm.extra_parameters,
        "train_seconds": training.get("train_seconds"),
        "train_steps": training.get("steps"),
        **(arm.drafter_stats() if arm.drafter_stats is not None else {}),
    }


def sample_test_records(records: list, limit: int | None, spread: bool = False, first: int = 0) -> list:
    """The first ``limit`` test records, or with ``spread`` ``limit`` records evenly spaced over all of them (record
    ``i * len / limit``), the first ``first`` left out before either. A test file grouped by one field (E2E NLG's by
    venue: its first 30 MRs name two venues) is then sampled across its groups."""
    records = records[first:]
    if not limit or limit >= len(records):
        return list(records)
    if not spread:
        return list(records[:limit])
    return [records[i * len(records) // limit] for i in range(limit)]


def _prompts_label(n: int, spread: bool, first: int) -> str:
    """Which test prompts a comparison decoded, in words."""
    if spread:
        return f"{n} spread evenly over the test set" + (f" after the first {first}" if first else "")
    return f"{n} in order after the first {first}" if first else f"the first {n}"


@torch.inference_mode()
def compare_arms(
    arms: list[str],
    task: str,
    data_dir,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    device: str | None = None,
    progress: bool = True,
    warm_answers=None,
    spread: bool = False,
    first: int = 0,
) -> dict:
    """Decode the test prompts of ``task`` plainly and with every arm (``FOLDER[:DRAFTER]``), the order rotating per
    prompt, one warm-up prompt first; each arm's speedup is over the plain tokens/s of this run, and ``over_engine``
    over the ``engine`` arm's tokens/s when there is one. The prompts: the first ``limit``, or with ``spread``
    ``limit`` of them evenly spaced over the test set (`sample_test_records`), after the first ``first`` left out."""
    from hf_speculative.bench.harness import machine_info
    from hf_speculative.bench.shapes import peak_resident_memory
    from hf_speculative.training.data import encode_chat

    from .tasks import get_task

    spec = get_task(task)
    parsed = [parse_arm(a) for a in arms]
    if not parsed:
        raise ValueError("compare needs at least one arm")
    loaded = _load_arms(parsed, task, data_dir, device, warm_answers)
    records = sample_test_records(spec.load(data_dir, "test"), limit, spread, first)
    if not records:
        raise ValueError(f"no test prompts for {task} in {data_dir}")
    n_new = max_new_tokens or spec.max_new_tokens
    tok, plain = loaded[0].tokenizer, loaded[0].plain
    prompts = [torch.tensor([encode_chat(tok, r.messages)], device=loaded[0].device) for r in records]
    plain(prompts[0], 8)  # warm-up
    for arm in loaded:
        arm.speculative(prompts[0], 8)
    rows, texts = _decode_rotating(plain, loaded, prompts, n_new, progress)
    plain_tps = rows[0]["tokens"] / max(rows[0]["seconds"], 1e-9)
    out = [_arm_record(arm, f, d, row, plain_tps, len(records)) for arm, (f, d), row in zip(loaded, parsed, rows[1:])]
    engine = next((r["tokens_per_s"] for r, (_, d) in zip(out, parsed) if d == "engine"), None)
    for r in out:
        r["over_engine"] = round(r["tokens_per_s"] / engine, 4) if engine else None
    return {
        "task": task,
        "n": len(records),
        "prompts": _prompts_label(len(records), spread, first),
        "max_new_tokens": n_new,
        "plain_tokens_per_s": round(plain_tps, 3),
        "metric": compute_metric(task, texts, [list(r.reference) for r in records]),
        "warmed_with": str(warm_answers) if warm_answers else "training references",
        "arms": out,
        "peak_resident_bytes": peak_resident_memory(),
        "machine": machine_info(loaded[0].device),
    }


def markdown_comparison(result: dict) -> str:
    """The comparison as a markdown table: plain first, then each arm."""
    lines = [
        "| arm | tau | tok/s | over plain | over the engine alone | identical | nodes / step |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| plain `generate()` | 1.00 | {result['plain_tokens_per_s']:.1f} | 1.00x | - | - | - |",
    ]
    for r in result["arms"]:
        tau = f"{r['tau']:.2f}" if r["tau"] else "-"
        over = f"{r['over_engine']:.2f}x" if r["over_engine"] else "-"
        nodes = f"{r['verified_nodes_per_step']:.1f}" if r["verified_nodes_per_step"] else "-"
        lines.append(
            f"| {r['drafter']} | {tau} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {over} | "
            f"{r['lossless_rate'] * result['n']:.0f}/{result['n']} | {nodes} |"
        )
    if result.get("peak_resident_bytes"):
        lines.append(
            f"\nPeak resident memory of the process (one copy of the model, every arm's drafter): "
            f"{result['peak_resident_bytes'] / 2**30:.2f} GiB."
        )
    return "\n".join(lines) + "\n"
