"""Self-distillation (Medusa, Cai et al. 2024, section 2.3.2).

When the target's own training data are not available, or a drafter should learn the target's
*own* distribution, let the target answer a set of prompts and train the drafter on those answers.
This module runs the target with plain :meth:`transformers.GenerationMixin.generate` (never a
speculative loop), batched with left padding, and writes chat-format jsonl::

    {"id": "...", "messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}],
     "num_new_tokens": 187, "finish_reason": "stop"}

The output is resumable: ids already in the file are skipped, and each record is appended and
flushed as soon as it is done, so an interrupted run loses at most one batch.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .data import Record, encode_chat_batch

__all__ = ["DistillStats", "order_by_length", "read_done_ids", "self_distill"]


@dataclass
class DistillStats:
    """What one :func:`self_distill` call did."""

    written: int = 0
    skipped: int = 0
    new_tokens: int = 0
    wall_time_s: float = 0.0
    too_long: int = 0  # records left out: their first prompt is longer than ``max_prompt_tokens``

    def __str__(self) -> str:
        rate = self.new_tokens / self.wall_time_s if self.wall_time_s else 0.0
        long = f", {self.too_long} left out as too long" if self.too_long else ""
        return (
            f"wrote {self.written} records ({self.skipped} already done{long}), {self.new_tokens} new tokens "
            f"in {self.wall_time_s:.0f} s ({rate:.1f} tokens/s)"
        )


def order_by_length(
    records: Sequence[Record], tokenizer, sort_window: int = 0, max_prompt_tokens: int | None = None
) -> tuple[list[Record], int]:
    """The records to answer, in answering order, and how many were left out.

    Left padding makes every row of a batch as long as its longest prompt: one ShareGPT first turn of 3.5K tokens
    among 32 of a few dozen makes the whole batch decode over 3.5K positions. Records whose first prompt has more than
    ``max_prompt_tokens`` tokens are left out. With ``sort_window`` > 0, each run of ``sort_window`` records (in the
    given order) is sorted by its first prompt's length, so batches hold prompts of similar lengths. The records kept,
    and the order of the windows, stay as given.
    """
    if not sort_window and max_prompt_tokens is None:
        return list(records), 0
    lengths = [len(tokenizer(r.prompt, add_special_tokens=False)["input_ids"]) for r in records]
    kept = [(n, i) for i, n in enumerate(lengths) if max_prompt_tokens is None or n <= max_prompt_tokens]
    if sort_window:
        kept = [x for w in range(0, len(kept), sort_window) for x in sorted(kept[w : w + sort_window])]
    return [records[i] for _, i in kept], len(records) - len(kept)


def read_done_ids(path: str | Path) -> set[str]:
    """Ids already in an output jsonl. A torn last line (an interrupted write) is cut off the file."""
    path = Path(path)
    if not path.exists():
        return set()
    done: set[str] = set()
    good_bytes = 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # torn write at the end of the file
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            done.add(str(row["id"]))
            good_bytes += len(raw)
    if good_bytes != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return done


def _generate_batch(model, tokenizer, conversations, generation_kwargs) -> list[tuple[str, int, str]]:
    import transformers

    enc = encode_chat_batch(tokenizer, conversations, padding_side="left")
    enc = {k: v.to(model.device) for k, v in enc.items()}
    with torch.inference_mode():
        if "assistant_model" in generation_kwargs:  # the engine's batched speculative decoding (`enable`d model)
            out = model.generate(**enc, **generation_kwargs)
        else:  # plain transformers generate, even on a model that hf_speculative.enable() patched
            out = transformers.GenerationMixin.generate(model, **enc, **generation_kwargs)
    new = out[:, enc["input_ids"].shape[1] :]
    eos = generation_kwargs["eos_token_id"]
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
    pad = generation_kwargs["pad_token_id"]
    results = []
    for row in new.tolist():
        n, reason = len(row), "length"
        for i, tok in enumerate(row):
            if tok in eos_ids:
                n, reason = i + 1, "stop"
                break
        ids = [t for t in row[:n] if t not in eos_ids and (reason == "stop" or t != pad)]
        text = tokenizer.decode(ids, skip_special_tokens=True).strip()
        results.append((text, n, reason))
    return results


def _generation_kwargs(
    model, tokenizer, max_new_tokens: int, temperature: float, top_p: float | None, assistant_model=None
) -> dict:
    """``generate`` keyword arguments: greedy at ``temperature`` 0, sampling (with ``top_p``) above; the drafter."""
    gen_kwargs = dict(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else model.generation_config.pad_token_id,
    )
    if temperature > 0:
        gen_kwargs["temperature"] = temperature
        if top_p is not None:
            gen_kwargs["top_p"] = top_p
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    if assistant_model is not None:
        gen_kwargs["assistant_model"] = assistant_model
    return gen_kwargs


def _answer_batch(
    model, tokenizer, batch: Sequence[Record], all_turns: bool, gen_kwargs: dict
) -> tuple[list[list[str]], list[int], list[str]]:
    """Answer the user turns of ``batch`` (all of them with ``all_turns``, else the first), turn by turn:
    ``(answers, new tokens, last finish reason)`` per record."""
    n_turns = max(len(r.turns) for r in batch) if all_turns else 1
    answers: list[list[str]] = [[] for _ in batch]
    tokens = [0] * len(batch)
    reasons = [""] * len(batch)
    for t in range(n_turns):
        active = [i for i, r in enumerate(batch) if t < (len(r.turns) if all_turns else 1)]
        convs = [batch[i].conversation(t + 1, answers[i]) for i in active]
        for i, (text, n, reason) in zip(active, _generate_batch(model, tokenizer, convs, gen_kwargs)):
            answers[i].append(text)
            tokens[i] += n
            reasons[i] = reason
    return answers, tokens, reasons


def _append_answers(
    out, batch: Sequence[Record], answers: list[list[str]], tokens: list[int], reasons: list[str], stats: DistillStats
) -> None:
    """Append one jsonl row per answered record to ``out`` (flushed and synced) and count it in ``stats``."""
    for i, rec in enumerate(batch):
        n_answered = len(answers[i])
        messages = rec.conversation(n_answered, answers[i]) + [{"role": "assistant", "content": answers[i][-1]}]
        row = {
            "id": rec.id,
            "category": rec.category,
            "messages": messages,
            "num_new_tokens": tokens[i],
            "finish_reason": reasons[i],
        }
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        out.flush()
        os.fsync(out.fileno())
        stats.written += 1
        stats.new_tokens += tokens[i]


def _todo(records, output_path: Path, tokenizer, limit, sort_window, max_prompt_tokens):
    """The records still to answer, in answering order, and the stats so far (done and left-out records)."""
    done = read_done_ids(output_path)
    todo = [r for r in records if r.id not in done]
    stats = DistillStats(skipped=len(records) - len(todo))
    todo, stats.too_long = order_by_length(todo, tokenizer, sort_window, max_prompt_tokens)
    if limit is not None:
        todo = todo[: max(0, limit - len(done))]
    return todo, stats


def self_distill(
    model,
    tokenizer,
    records: Sequence[Record],
    output_path: str | Path,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float | None = None,
    batch_size: int = 1,
    all_turns: bool = False,
    limit: int | None = None,
    time_budget_s: float | None = None,
    seed: int | None = None,
    progress: bool = True,
    assistant_model=None,
    sort_window: int = 0,
    max_prompt_tokens: int | None = None,
) -> DistillStats:
    """Let ``model`` answer ``records`` and append chat-format jsonl to ``output_path``.

    Args:
        records: prompts; each record's user turns are answered by the model (the data set's own
            assistant turns are thrown away: that is the point of self-distillation).
        max_new_tokens: per assistant turn.
        temperature: 0 decodes greedily; above 0 samples with this temperature (and ``top_p``).
        batch_size: prompts per ``generate`` call, left-padded.
        all_turns: answer every user turn in order (multi-turn conversations); otherwise only the first.
        limit: stop after this many records *in total* in the output file (done ones count).
        time_budget_s: start no batch after this many seconds, nor one that would end after them if it took as long
            as the batch before it.
        seed: torch seed for sampling.
        assistant_model: a drafter (a warmed `SuffixDrafter`, the model `enable`d): the same answers; beats plain at batch 8, not at 32.
        sort_window / max_prompt_tokens: batches of prompts of similar lengths, and too long prompts left out
            (`order_by_length`; ``limit`` counts the records kept, in the order they are answered).
    """
    from tqdm.auto import tqdm

    (output_path := Path(output_path)).parent.mkdir(parents=True, exist_ok=True)
    todo, stats = _todo(records, output_path, tokenizer, limit, sort_window, max_prompt_tokens)
    if seed is not None:
        torch.manual_seed(seed)
    gen_kwargs = _generation_kwargs(model, tokenizer, max_new_tokens, temperature, top_p, assistant_model)
    model.eval()
    start = time.perf_counter()
    bar = tqdm(total=len(todo), desc="self-distill", disable=not progress, unit="prompt")
    last = 0.0  # the seconds of the batch before
    with open(output_path, "a", encoding="utf-8") as out:
        for b in range(0, len(todo), batch_size):
            if time_budget_s is not None and time.perf_counter() - start + last > time_budget_s:
                break
            batch = todo[b : b + batch_size]
            began = time.perf_counter()
            answers, tokens, reasons = _answer_batch(model, tokenizer, batch, all_turns, gen_kwargs)
            last = time.perf_counter() - began
            _append_answers(out, batch, answers, tokens, reasons, stats)
            bar.update(len(batch))
            bar.set_postfix(tok_s=f"{stats.new_tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    stats.wall_time_s = time.perf_counter() - start
    return stats
