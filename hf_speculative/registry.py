"""The drafter registry: every drafter registers itself in its own package, with what the rest of the library
needs to know of it, as dotted names that are imported only when used (so that registering imports nothing):

- its config and model classes, which `hf_speculative.auto` registers with transformers' ``AutoConfig`` /
  ``AutoModel``;
- its public names, which ``import hf_speculative as hfs`` exposes (``hfs.MedusaHeadsModel``; by default its
  config and model classes);
- its training commands, which ``hf-speculative train`` lists;
- its model card (``card.yaml`` in its folder, and ``card.CARD_FACTS``: what the card computes from the drafter;
  found without being named);
- an assistant adapter: a function ``(target, assistant_model) -> TreeDrafter | None`` that `generate()` asks
  when ``assistant_model`` is not a drafter model (a plain causal LM, say).

Adding a drafter touches its own folder only::

    # hf_speculative/drafters/mine/__init__.py (or any module imported before generate())
    from hf_speculative.registry import register_drafter

    register_drafter(
        "mine", __name__,
        config="configuration_mine.MineConfig", model="modeling_mine.MineDrafter",
        train_commands=("hf_speculative.drafters.mine.command_train",),
    )

The library's own drafters are found by importing the packages below `hf_speculative.drafters` (light: a package's
``__init__`` registers and imports nothing else), which ``import hf_speculative`` does; each registers and declares
its lazily imported names in one call (`hf_speculative.drafters.lazy.lazy_drafter`).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DrafterEntry", "register_drafter", "drafter_entries", "load_object"]


@dataclass(frozen=True)
class DrafterEntry:
    """One drafter's registration (see the module docstring); a dotted name without a package is read relative to
    `package`."""

    name: str
    package: str
    config: str | None = None
    model: str | None = None
    public: dict[str, str] = field(default_factory=dict)
    train_commands: tuple[str, ...] = ()
    card: str | None = None
    card_facts: str | None = None
    assistant: str | None = None

    def qualified(self, dotted: str) -> str:
        """``dotted`` (``"module.name"``) as a full dotted name: relative to `package` unless it is absolute already."""
        root = self.package.split(".")[0]
        return dotted if dotted == root or dotted.startswith(root + ".") else f"{self.package}.{dotted}"

    def load(self, dotted: str) -> Any:
        """The object that ``dotted`` names (see `qualified`)."""
        return load_object(self.qualified(dotted))


_ENTRIES: dict[str, DrafterEntry] = {}


def register_drafter(name: str, package: str, **fields: Any) -> DrafterEntry:
    """Register (or replace) drafter ``name`` of ``package`` (see the module docstring for the fields)."""
    if "public" in fields:
        fields["public"] = dict(fields["public"])
    else:  # by default the config and model classes are the public names
        dotted = [fields[key] for key in ("config", "model") if fields.get(key)]
        fields["public"] = {ref.rpartition(".")[2]: ref.rpartition(".")[0] for ref in dotted}
    fields["train_commands"] = tuple(fields.get("train_commands", ()))
    folder = _folder(package)
    if "card" not in fields and folder is not None and (folder / "card.yaml").is_file():
        fields["card"], fields["card_facts"] = "card.yaml", "card.CARD_FACTS"
    entry = DrafterEntry(name=name, package=package, **fields)
    clash = {n: e.name for e in _ENTRIES.values() if e.name != name for n in e.public if n in entry.public}
    if clash:
        raise ValueError(
            f"drafter {name!r} registers public names that {sorted(set(clash.values()))} already own: {sorted(clash)}"
        )
    _ENTRIES[name] = entry
    return entry


def _folder(package: str) -> Path | None:
    """The folder of ``package`` (being imported or imported already), without importing anything."""
    module = sys.modules.get(package)
    path = getattr(module, "__file__", None)
    return Path(path).parent if path and path.endswith("__init__.py") else None


def drafter_entries() -> list[DrafterEntry]:
    """Every registered drafter, in registration order."""
    return list(_ENTRIES.values())


def load_object(dotted: str) -> Any:
    """``package.module.name`` -> the object (the module is imported)."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)
