"""The downstream tasks of Speculative Streaming's Table 1 (Bhendawade et al., 2024, Sec. 4.1): E2E NLG (meaning
representation -> text), WikiSQL (question + table schema -> SQL, standing in for SqlContext) and DialogSum
(dialogue -> summary).

Each task reads its files where they are (``--data DIR``, nothing is copied into the package) through the shared
loaders of `hf_speculative.training.data`, and gives

* training records: one `Record` per (prompt, reference) pair, the reference as the assistant answer;
* test records: one `Record` per test prompt with all its references (``reference``: a list of strings).

Prompts are one user turn with a short task instruction, formatted by the target's chat template, the same for
every arm. Splits are fixed (no randomness at load time beyond a fixed seed):

=============  =====================================================  ===========================================
task           train                                                  test
=============  =====================================================  ===========================================
``e2e_nlg``    ``devset.csv``: 4,672 (MR, reference) pairs              ``testset_w_refs.csv``: 630 MRs, all refs
``wikisql``    ``dev.jsonl`` + ``dev_results.jsonl`` joined by          the questions of a fixed 10% of the tables
               ``question_id``; the other 90% of the tables             (split by ``table_id``: no test table is seen)
``dialogsum``  ``DialogSum_Data.zip``: train split (12,460)             test split (500 dialogues, 3 summaries each)
=============  =====================================================  ===========================================
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hf_speculative.training.data import DIALOGSUM_INSTRUCTION, Record, load_dialogsum, load_e2e_nlg

__all__ = ["TASKS", "DownstreamTask", "get_task", "load_task", "wikisql_records", "wikisql_schema", "calibration_split"]

WIKISQL_INSTRUCTION = (
    "Write the SQL query that answers the question over this table.\n\n{schema}\n\nQuestion: {question}"
)
WIKISQL_TEST_SHARE = 0.1  # share of the tables (and their questions) held out as the test part
SPLIT_SEED = 0


@dataclass(frozen=True)
class DownstreamTask:
    """One task: how to read its files, its metric and its decoding length.

    Args:
        name: the ``--task`` name.
        files: the files ``--data DIR`` must hold (checked before loading).
        metric: the `hf_speculative.bench.metrics` module name (``"rouge"`` or ``"sql_exact_match"``).
        metric_keys: the keys of the metric's result reported in the eval JSON.
        max_new_tokens: the decoding length of ``downstream eval`` (longer than almost every reference).
        max_length: the training tokens per example (prompt + answer).
        loader: ``loader(data_dir, split) -> list[Record]``, split ``"train"`` or ``"test"``.
    """

    name: str
    files: tuple[str, ...]
    metric: str
    metric_keys: tuple[str, ...]
    max_new_tokens: int
    max_length: int
    loader: Callable[[Path, str], list[Record]] = field(repr=False)

    def load(self, data_dir: str | Path, split: str) -> list[Record]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        data_dir = Path(data_dir)
        missing = [f for f in self.files if not (data_dir / f).is_file()]
        if missing:
            raise FileNotFoundError(f"--data {data_dir}: task {self.name!r} needs {', '.join(missing)} in that folder")
        return self.loader(data_dir, split)


def _pairs(records: list[Record]) -> list[Record]:
    """One training record per (prompt, reference) pair; the reference becomes the assistant answer."""
    out = []
    for r in records:
        refs = r.reference if isinstance(r.reference, list) else [r.reference]
        out += [
            Record(id=f"{r.id}-{k}", turns=r.turns, category=r.category, answers=[ref])
            for k, ref in enumerate(refs)
            if ref
        ]
    return out


def _e2e(data_dir: Path, split: str) -> list[Record]:
    if split == "train":
        return _pairs(load_e2e_nlg(data_dir / "devset.csv"))
    return load_e2e_nlg(data_dir / "testset_w_refs.csv")


def _dialogsum(data_dir: Path, split: str) -> list[Record]:
    records = load_dialogsum(data_dir / "DialogSum_Data.zip", split=split, instruction=DIALOGSUM_INSTRUCTION)
    return _pairs(records) if split == "train" else [_as_list(r) for r in records]


def _as_list(record: Record) -> Record:
    if not isinstance(record.reference, list):
        record.reference = [record.reference]
    return record


def wikisql_schema(table_id: str, questions: list[dict]) -> str:
    """A ``CREATE TABLE`` line for ``table_id``: the union of the columns its questions reference (``sql.sel``,
    ``sql.conds``), in order of first use (the public snapshot has no table headers)."""
    columns: dict[str, None] = {}
    for q in questions:
        sql = q["sql"]
        columns[sql["sel"]] = None
        for cond in sql.get("conds") or []:
            columns[cond[0]] = None
    cols = ", ".join(f'"{c}" TEXT' for c in columns)
    return f'CREATE TABLE "{table_id}" ({cols})'


def wikisql_records(data_dir: Path) -> tuple[list[Record], list[Record]]:
    """``(train, test)``: every question with its schema line and reference SQL, split by ``table_id`` (a fixed
    seeded shuffle of the sorted table ids; the last `WIKISQL_TEST_SHARE` of them are the test tables)."""
    rows = [
        json.loads(line) for line in (data_dir / "dev.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    sql = {}
    for line in (data_dir / "dev_results.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            sql[r["question_id"]] = r["query"]
    by_table: dict[str, list[dict]] = {}
    for row in rows:
        by_table.setdefault(row["table_id"], []).append(row)
    tables = sorted(by_table)
    random.Random(SPLIT_SEED).shuffle(tables)
    n_test = max(1, round(WIKISQL_TEST_SHARE * len(tables))) if len(tables) > 1 else 0
    test_tables = set(tables[len(tables) - n_test :])
    train, test = [], []
    for table_id in sorted(by_table):
        schema = wikisql_schema(table_id, by_table[table_id])
        for row in by_table[table_id]:
            query = sql.get(row["question_id"])
            if query is None:
                continue
            prompt = WIKISQL_INSTRUCTION.format(schema=schema, question=row["question"])
            rid = str(row["question_id"])
            if table_id in test_tables:
                test.append(Record(id=rid, turns=[prompt], category="wikisql", reference=[query]))
            else:
                train.append(Record(id=rid, turns=[prompt], category="wikisql", answers=[query]))
    return train, test


def _wikisql(data_dir: Path, split: str) -> list[Record]:
    train, test = wikisql_records(data_dir)
    return train if split == "train" else test


TASKS: dict[str, DownstreamTask] = {
    "e2e_nlg": DownstreamTask(
        "e2e_nlg", ("devset.csv", "testset_w_refs.csv"), "rouge", ("rougeL", "rouge1"), 80, 256, _e2e
    ),
    "wikisql": DownstreamTask(
        "wikisql", ("dev.jsonl", "dev_results.jsonl"), "sql_exact_match", ("exact_match",), 64, 384, _wikisql
    ),
    "dialogsum": DownstreamTask(
        "dialogsum", ("DialogSum_Data.zip",), "rouge", ("rougeL", "rouge1"), 96, 1024, _dialogsum
    ),
}


def get_task(name: str) -> DownstreamTask:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: use one of {sorted(TASKS)}")
    return TASKS[name]


def load_task(name: str, data_dir: str | Path, split: str) -> list[Record]:
    """The ``split`` (``"train"``/``"test"``) records of task ``name`` from the folder ``data_dir``."""
    return get_task(name).load(data_dir, split)


def calibration_split(records: list[Record], num: int, seed: int = SPLIT_SEED) -> tuple[list[Record], list[Record]]:
    """``(train, calibration)``: the pairs of ``num`` training prompts set aside (seeded) to calibrate a drafter's tree; the
    pairs of one prompt stay on one side, so calibration prompts are never trained on; at least one prompt is kept
    for training."""
    prompts = sorted({r.turns[0] for r in records})
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: min(num, len(prompts) - 1)])
    return [r for r in records if r.turns[0] not in held], [r for r in records if r.turns[0] in held]
