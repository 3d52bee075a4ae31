"""Prompt sets for benchmarks: where the shared data live, and turning records into model inputs.

The data are never copied into the package. ``$HF_SPECULATIVE_DATA`` (default ``/work/shared/data``)
points at the folder described in its README (MT-Bench, EAGLE gsm8k/humaneval, ShareGPT, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..training.data import Record, encode_chat, load_records

__all__ = ["data_dir", "PROMPT_SETS", "resolve_prompt_path", "load_prompts", "first_per_category", "BenchPrompt", "prepare_prompts"]


def data_dir() -> Path:
    return Path(os.environ.get("HF_SPECULATIVE_DATA", "/work/shared/data"))


#: short names accepted by ``--prompts`` besides a path
PROMPT_SETS = {
    "mt_bench": "mt_bench/question.jsonl",
    "mt-bench": "mt_bench/question.jsonl",
    "gsm8k": "eagle_prompts/gsm8k.jsonl",
    "humaneval": "eagle_prompts/humaneval.jsonl",
    "sharegpt": "sharegpt/ShareGPT_V3_filtered_1000.json",
    "alpaca": "alpaca/alpaca_data_cleaned_1000.json",
    "dialogsum": "dialogsum/DialogSum_Data.zip",
    "e2e_nlg": "e2e_nlg/testset_w_refs.csv",
    "wikisql": "wikisql/dev.jsonl",
}

DEFAULT_PROMPTS = "mt_bench"


def resolve_prompt_path(name_or_path: str | os.PathLike | None) -> Path:
    """A path, or one of :data:`PROMPT_SETS` under :func:`data_dir`."""
    name = DEFAULT_PROMPTS if name_or_path is None else str(name_or_path)
    if name in PROMPT_SETS:
        return data_dir() / PROMPT_SETS[name]
    return Path(name)


def load_prompts(name_or_path=None, limit: int | None = None, **kwargs) -> list[Record]:
    return load_records(resolve_prompt_path(name_or_path), limit=limit, **kwargs)


def first_per_category(records: list[Record], n: int) -> list[Record]:
    """The first ``n`` records of every category, in their original order."""
    seen: dict[str, int] = {}
    out = []
    for rec in records:
        if seen.get(rec.category, 0) < n:
            seen[rec.category] = seen.get(rec.category, 0) + 1
            out.append(rec)
    return out


@dataclass
class BenchPrompt:
    """One record, chat-formatted and tokenized ahead of timing."""

    record: Record
    input_ids: torch.LongTensor  # (1, prompt_len)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def category(self) -> str:
        return self.record.category


def prepare_prompts(records: list[Record], tokenizer, device="cpu") -> list[BenchPrompt]:
    """Apply the chat template to each record's first turn and tokenize (outside any timed region)."""
    out = []
    for rec in records:
        ids = encode_chat(tokenizer, rec.messages, add_generation_prompt=True)
        out.append(BenchPrompt(rec, torch.tensor([ids], dtype=torch.long, device=device)))
    return out
