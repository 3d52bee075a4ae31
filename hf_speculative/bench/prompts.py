"""Prompt sets for benchmarks: the built-in sets, files and `datasets` ids, and turning records into model inputs.

``--prompts`` (and :func:`load_prompts`) takes

- a built-in set name (:data:`PROMPT_SETS`; the files ship in ``hf_speculative/bench/data/``, with their
  sources and licenses in the README there): ``mt_bench`` (the default: MT-Bench's 80 questions),
  ``alpaca``, ``dialogsum``, ``e2e_nlg``, ``wikisql`` (40 held-out prompts each), ``heldout`` (those four
  together), ``gsm8k``, ``humaneval``;
- a file in any format of :mod:`hf_speculative.training.data` (MT-Bench jsonl, ShareGPT, Alpaca, ...);
- a `datasets` id, ``NAME[:SPLIT]``, or a folder written by ``Dataset.save_to_disk``; its rows go through
  the same loaders as a file in their format, or, for other layouts, a ``prompt``/``question``/
  ``instruction``/``text`` column.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..hub import looks_like_path, resolve_name_or_path
from ..training.data import Record, encode_chat, load_records

__all__ = [
    "BUILTIN_DIR",
    "PROMPT_SETS",
    "HELDOUT_SETS",
    "DEFAULT_PROMPTS",
    "builtin_prompt_path",
    "describe_prompts",
    "load_prompts",
    "records_from_dataset",
    "first_per_category",
    "spread_over_categories",
    "BenchPrompt",
    "prepare_prompts",
]

#: the folder of the built-in prompt files (package data)
BUILTIN_DIR = Path(__file__).resolve().parent / "data"

#: built-in set name -> file in :data:`BUILTIN_DIR`
PROMPT_SETS = {
    "mt_bench": "mt_bench.jsonl",
    "alpaca": "alpaca.json",
    "dialogsum": "dialogsum.jsonl",
    "e2e_nlg": "e2e_nlg.csv",
    "wikisql": "wikisql.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "humaneval": "humaneval.jsonl",
}
_ALIASES = {"mt-bench": "mt_bench", "e2e": "e2e_nlg", "e2e-nlg": "e2e_nlg"}

#: the held-out task sets that ``heldout`` mixes (category = set name)
HELDOUT_SETS = ("alpaca", "dialogsum", "e2e_nlg", "wikisql")

DEFAULT_PROMPTS = "mt_bench"

_FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".zip")  # a name ending so is a file, never a dataset id
_TEXT_COLUMNS = ("prompt", "question", "instruction", "input", "text", "query")


def _set_name(name: str) -> str | None:
    name = _ALIASES.get(name, name)
    return name if name in PROMPT_SETS or name == "heldout" else None


def builtin_prompt_path(name: str) -> Path:
    """The file of one built-in set (``KeyError`` listing the names for anything else)."""
    key = _set_name(name)
    if key is None or key == "heldout":
        raise KeyError(f"{name!r} is not a single-file built-in prompt set; built in: {', '.join(PROMPT_SETS)}")
    return BUILTIN_DIR / PROMPT_SETS[key]


def describe_prompts(name_or_path: str | os.PathLike | None) -> str:
    """A short label of a ``--prompts`` value for reports: ``"mt_bench (built-in)"``, a path or a dataset id."""
    name = DEFAULT_PROMPTS if name_or_path is None else os.fspath(name_or_path)
    key = _set_name(name)
    return f"{key} (built-in)" if key is not None else name


def load_prompts(name_or_path: str | os.PathLike | None = None, limit: int | None = None, **kwargs) -> list[Record]:
    """Records of a built-in set, a prompt file, a saved dataset folder or a `datasets` id (see the module doc).

    Raises:
        FileNotFoundError: a path-like name that does not exist (no Hub lookup).
        OSError: a dataset id while the Hub cannot be reached (and ``HF_HUB_OFFLINE`` is not set).
    """
    name = DEFAULT_PROMPTS if name_or_path is None else os.fspath(name_or_path)
    key = _set_name(name)
    if key == "heldout":
        records = [
            replace(r, id=f"{s}/{r.id}", category=s)
            for s in HELDOUT_SETS
            for r in load_records(BUILTIN_DIR / PROMPT_SETS[s])
        ]
        return records if limit is None else records[:limit]
    if key is not None:
        return load_records(BUILTIN_DIR / PROMPT_SETS[key], limit=limit, **kwargs)
    path = Path(name).expanduser()
    if path.is_file():
        return load_records(path, limit=limit, **kwargs)
    if not path.exists() and (looks_like_path(name.partition(":")[0]) or path.suffix in _FILE_SUFFIXES):
        raise FileNotFoundError(
            f"prompt file {name!r} does not exist (looked for {path.absolute()}); built-in sets: "
            f"{', '.join([*PROMPT_SETS, 'heldout'])}"
        )
    records = records_from_dataset(_load_dataset(name), name=path.name if path.exists() else name)
    return records if limit is None else records[:limit]


def _pick_split(dataset_dict, wanted: str | None):
    if wanted is not None:
        return dataset_dict[wanted]
    for split in ("test", "validation", "train"):
        if split in dataset_dict:
            return dataset_dict[split]
    return dataset_dict[next(iter(dataset_dict))]


def _load_dataset(name: str):
    """A `datasets.Dataset`: ``load_from_disk`` for a folder, else ``load_dataset(NAME, split=SPLIT)``."""
    import datasets

    if Path(name).expanduser().is_dir():
        loaded = datasets.load_from_disk(str(Path(name).expanduser()))
        return _pick_split(loaded, None) if isinstance(loaded, datasets.DatasetDict) else loaded
    repo, _, split = name.partition(":")
    source = resolve_name_or_path(repo, what="prompt data set", repo_type="dataset")  # fast failure without a network
    return _pick_split(datasets.load_dataset(source), split or None)


def records_from_dataset(dataset, name: str = "dataset") -> list[Record]:
    """Records from the rows of a `datasets.Dataset` (or any sequence of dicts).

    Rows in a format of :mod:`hf_speculative.training.data` (``turns``, ``messages``, ``conversations``,
    ``dialogue``, ``table_id`` + ``question``, ``instruction``, ``mr`` + ``ref``) are read by the same
    loader as a file of that format (written once to a temporary file); other rows need one of the columns
    ``prompt``, ``question``, ``instruction``, ``input``, ``text`` or ``query``.
    """
    rows = [dict(row) for row in dataset]
    if not rows:
        return []
    keys = set(rows[0])
    if keys & {"turns", "messages", "conversations", "dialogue"} or {"table_id", "question"} <= keys:
        return _through_loader(rows, ".jsonl")
    if "instruction" in keys:
        return _through_loader(rows, ".json")
    if {"mr", "ref"} <= keys:
        return _through_loader(rows, ".csv")
    column = next((c for c in _TEXT_COLUMNS if c in keys), None)
    if column is None:
        raise ValueError(f"{name}: no prompt column; want one of {_TEXT_COLUMNS} or a known format, got {sorted(keys)}")
    return [
        Record(id=str(row.get("id", i)), turns=[str(row[column])], category=str(row.get("category", name)))
        for i, row in enumerate(rows)
    ]


def _through_loader(rows: list[dict], suffix: str) -> list[Record]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"rows{suffix}"
        with open(path, "w", encoding="utf-8", newline="") as f:
            if suffix == ".jsonl":
                f.writelines(json.dumps(row, default=str) + "\n" for row in rows)
            elif suffix == ".json":
                json.dump(rows, f, default=str)
            else:
                writer = csv.DictWriter(f, fieldnames=["mr", "ref"], extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
        return load_records(path)


def first_per_category(records: list[Record], n: int) -> list[Record]:
    """The first ``n`` records of every category, in their original order."""
    seen: dict[str, int] = {}
    out = []
    for rec in records:
        if seen.get(rec.category, 0) < n:
            seen[rec.category] = seen.get(rec.category, 0) + 1
            out.append(rec)
    return out


def spread_over_categories(records: list[Record], n: int) -> list[Record]:
    """``n`` records taken round robin over the categories (in the order they first appear; within a category in
    the original order): ``--limit 2`` on a set of several categories gives one prompt from each of the first two."""
    if n < 0:
        raise ValueError(f"the number of prompts must be >= 0, got {n}")
    groups: dict[str, list[Record]] = {}
    for rec in records:
        groups.setdefault(rec.category, []).append(rec)
    out: list[Record] = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        out.extend(g[i] for g in groups.values() if i < len(g))
    return out[:n]


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
