"""Self-distilled training answers for a drafter of a fine-tuned model (Medusa, Cai et al. 2024, Sec. 2.3.2).

A drafter is asked, at decoding time, to guess what the *fine-tuned model* will write, not what the data set's
references say. Its training answers are therefore the model's own greedy answers to the training prompts,
generated in batches (`hf_speculative.training.distill.self_distill`, resumable) and cached beside the run.

A task with few distinct training prompts (E2E NLG's training file has 547 meaning representations, with about nine
references each) gets more prompts the same way its own were written: `synthetic_e2e_prompts` draws meaning
representations from the training MRs' slot sets and slot values. No test MR is used to build them; the few that
happen to equal a test MR are dropped, so no test prompt is ever answered for training.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from pathlib import Path

from hf_speculative.training.data import E2E_INSTRUCTION, Record

__all__ = ["e2e_mr", "self_distilled_records", "synthetic_e2e_prompts", "unique_prompts"]

_SLOT = re.compile(r"([^,\[\]]+)\[([^\]]*)\]")
_MR_PREFIX, _MR_SUFFIX = E2E_INSTRUCTION.split("{mr}")


def e2e_mr(prompt: str) -> str:
    """The meaning representation inside an E2E NLG prompt."""
    if not (prompt.startswith(_MR_PREFIX) and prompt.endswith(_MR_SUFFIX)):
        raise ValueError(f"not an E2E NLG prompt: {prompt[:80]!r}")
    return prompt[len(_MR_PREFIX) : len(prompt) - len(_MR_SUFFIX)]


def _prompt_id(prompt: str) -> str:
    """A record id from the prompt's text, so a cached answer always belongs to the same prompt."""
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:16]


def _slots(mr: str) -> list[tuple[str, str]]:
    return [(k.strip(), v.strip()) for k, v in _SLOT.findall(mr)]


def unique_prompts(records: list[Record]) -> list[Record]:
    """One record per distinct first user turn, in order of first appearance, without answers."""
    seen: dict[str, Record] = {}
    for r in records:
        if r.turns[0] not in seen:
            seen[r.turns[0]] = Record(id=_prompt_id(r.turns[0]), turns=list(r.turns[:1]), category=r.category)
    return list(seen.values())


#: word lists of `made_up_name`: venue names that occur in no E2E NLG file (a made-up name equal to a held-out MR's
#: value is never used)
_ADJECTIVES = (
    "Amber",
    "Brass",
    "Copper",
    "Crooked",
    "Drunken",
    "Dusty",
    "Fat",
    "Flying",
    "Happy",
    "Hidden",
    "Hungry",
    "Iron",
    "Jolly",
    "Lazy",
    "Lucky",
    "Merry",
    "Northern",
    "Painted",
    "Quiet",
    "Rusty",
    "Salty",
    "Sleepy",
    "Smoky",
    "Velvet",
    "Wandering",
    "Whistling",
    "Wild",
    "Wooden",
)
_NOUNS = (
    "Anchor",
    "Badger",
    "Barrel",
    "Bell",
    "Bridge",
    "Candle",
    "Compass",
    "Dragon",
    "Falcon",
    "Fiddle",
    "Fox",
    "Garden",
    "Hare",
    "Harbour",
    "Heron",
    "Kettle",
    "Lantern",
    "Lion",
    "Magpie",
    "Mariner",
    "Meadow",
    "Oak",
    "Otter",
    "Pelican",
    "Pepper",
    "Pigeon",
    "Raven",
    "Saddle",
    "Spoon",
    "Stag",
    "Swan",
    "Teapot",
    "Thistle",
    "Tiger",
    "Walrus",
    "Willow",
)
_SURNAMES = (
    "Abbott",
    "Barlow",
    "Carver",
    "Dalton",
    "Ellis",
    "Fletcher",
    "Garner",
    "Hollis",
    "Ingram",
    "Jarvis",
    "Keller",
    "Lomax",
    "Marlowe",
    "Norris",
    "Osborne",
    "Pryce",
    "Quincy",
    "Rowan",
    "Sutton",
    "Thorne",
    "Underwood",
    "Vance",
    "Whitaker",
    "Yates",
)
_KINDS = ("Kitchen", "Bistro", "Grill", "Tavern", "Diner", "Brasserie", "Canteen", "Eatery", "Inn", "Cafe", "Arms")
_FOREIGN = (
    "Bellavista",
    "Casa Nostra",
    "Chez Margot",
    "El Faro",
    "Il Giardino",
    "La Cantina",
    "La Luna",
    "Le Petit Four",
    "Osteria Sole",
    "Sakura",
    "Shanghai Garden",
    "Taj Mahal Palace",
    "Trattoria Roma",
    "Little Saigon",
    "Wasabi Bar",
)


def made_up_name(rng: random.Random) -> str:
    """A venue name in one of a few shapes ("The Lazy Otter", "Marlowe's Kitchen", "Harbour Grill", "La Luna", "The
    Fox and Lantern"), from the word lists above."""
    shape = rng.randrange(6)
    if shape == 0:
        return f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    if shape == 1:
        return f"{rng.choice(_SURNAMES)}'s {rng.choice(_KINDS)}"
    if shape == 2:
        return f"{rng.choice(_NOUNS)} {rng.choice(_KINDS)}"
    if shape == 3:
        return rng.choice(_FOREIGN)
    if shape == 4:
        return f"The {rng.choice(_NOUNS)} and {rng.choice(_NOUNS)}"
    return f"The {rng.choice(_NOUNS)}"


#: the slots whose values are names (open sets: a test MR names venues no training MR has)
NAME_SLOTS = ("name", "near")


def synthetic_e2e_prompts(
    train: list[Record],
    n: int,
    seed: int = 0,
    exclude: set[str] | None = None,
    new_names: float = 0.5,
) -> list[Record]:
    """``n`` new E2E NLG prompts: each takes the slot set (in order) of a random training MR and fills every slot
    with a value drawn from that slot's values over the training MRs; a name slot (`NAME_SLOTS`) takes a
    `made_up_name` instead with probability ``new_names``, so that a drafter learns to copy names from the prompt
    rather than to remember the training set's twenty (``near`` never equals ``name``). Prompts equal to a training
    prompt or to one in ``exclude`` (the calibration and test prompts) are not returned, nor made-up names that
    occur in ``exclude``."""
    mrs = [_slots(e2e_mr(r.turns[0])) for r in unique_prompts(train)]
    values: dict[str, list[str]] = {}
    for slots in mrs:
        for k, v in slots:
            values.setdefault(k, []).append(v)
    held_values = {v for p in exclude or () for _, v in _slots(e2e_mr(p))}
    taken = {r.turns[0] for r in train} | set(exclude or ())
    rng = random.Random(seed)
    out: list[Record] = []
    for _ in range(50 * n):
        if len(out) >= n:
            break
        filled: list[tuple[str, str]] = []
        for k, _v in rng.choice(mrs):
            v, tries = None, 0
            while v is None or (k == "near" and filled and v == filled[0][1] and tries < 100):
                v, tries = rng.choice(values[k]), tries + 1
                if k in NAME_SLOTS and rng.random() < new_names:
                    v = made_up_name(rng)
                    v = None if v in held_values else v
            filled.append((k, v))
        prompt = E2E_INSTRUCTION.format(mr=", ".join(f"{k}[{v}]" for k, v in filled))
        if prompt not in taken:
            taken.add(prompt)
            out.append(Record(id=_prompt_id(prompt), turns=[prompt], category="e2e_nlg"))
    return out


def self_distilled_records(
    model,
    tokenizer,
    prompts: list[Record],
    path: str | Path,
    max_new_tokens: int,
    batch_size: int = 32,
    progress: bool = True,
) -> list[Record]:
    """``prompts`` answered greedily by ``model`` (cached in the jsonl ``path``; a rerun answers only what is missing),
    as training records whose assistant turn is the model's answer. Answers cut at ``max_new_tokens`` are kept.
    Plain batched decoding: at batch 32 it was faster than the engine with SuffixDecoding on WikiSQL prompts (59.5
    against 51.4 new tok/s, 2-core AMD EPYC, float32, `scripts/self_distill_speed.py`)."""
    from hf_speculative.training.distill import self_distill

    stats = self_distill(
        model, tokenizer, prompts, path, max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress
    )
    print(f"self-distilled answers: {stats}", file=sys.stderr)
    answers: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            answers[str(row["id"])] = row["messages"][-1]["content"]
    return [
        Record(id=r.id, turns=r.turns, category=r.category, answers=[answers[r.id]])
        for r in prompts
        if answers.get(r.id)
    ]
