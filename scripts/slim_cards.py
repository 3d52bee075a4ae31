"""Keep the repository's drafter folders within the weight budget.

The folders in ``KEEP`` (the drafters the README and the demo use) keep their weights, floating-point tensors stored
in bfloat16; every other folder under ``model_cards/`` keeps its card, ``config.json`` and the command that rebuilds
its weights, and its weight files are removed (``git rm``). Each card says which of the two it is. Run from the
repository root: ``python scripts/slim_cards.py [--dry-run]``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
CARDS = ROOT / "model_cards"
#: The drafters whose weights stay in the repository: the demo's Medusa heads, the README's Token Recycling matrix
#: and the smallest self-drafting folder.
KEEP = (
    "medusa-smollm2-135m-instruct",
    "speculative-streaming-smollm2-135m-instruct",
    "token-recycling-smollm2-135m-instruct",
)
#: The best trained drafter per task that fits the weight budget beside ``KEEP``, each on its task's LoRA model: E2E
#: NLG's EAGLE-3 (a 2,048-token draft vocabulary: 12 MiB in bfloat16) and WikiSQL's Medusa heads (2.6 MiB). EAGLE-3
#: took the room of the GPU-trained E2E NLG arms of the H100 run of 2026-11-28 (docs/gpu.md), which decoded at
#: 0.88-1.00x their own plain decoding on the 2-core CPU; their cards keep their numbers and rebuild commands.
#: WikiSQL's EAGLE-3 (`eagle3-smollm2-135m-wikisql`, 12 MiB) is faster there than the heads but does not fit beside
#: E2E NLG's; its card keeps the command that rebuilds it.
TASK_DRAFTERS = ("eagle3-smollm2-135m-e2e-nlg", "medusa-smollm2-135m-wikisql")
KEEP += TASK_DRAFTERS
#: The task LoRA adapters (docs/downstream.md, the ``lora`` arms): each task's fine-tuned model (the E2E NLG EAGLE-3
#: arm trains on its ``--adapter``); a folder of only ``adapter/`` (no drafter, no ``config.json``).
TASK_ADAPTERS = ("lora-smollm2-135m-dialogsum", "lora-smollm2-135m-e2e-nlg", "lora-smollm2-135m-wikisql")
KEEP += TASK_ADAPTERS
#: Folders whose tensors are counts or indices (no rounding allowed): left as they are.
EXACT = ("token-recycling-smollm2-135m-instruct",)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
MARK = "## Weights"


def weight_files(folder: Path) -> list[Path]:
    """Every weight file under ``folder``."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def rebuild_command(card: str) -> str:
    """The training command the card records (the first ``- command:``, inline or in the code block after it)."""
    match = re.search(r"- command: `([^`]+)`", card) or re.search(r"- command:\s*```(?:bash)?\n(.+?)\n```", card, re.S)
    if not match:
        raise ValueError("the card records no training command")
    return match.group(1).strip()


def to_bfloat16(path: Path) -> None:
    """Rewrite one safetensors file with its float32 tensors in bfloat16 (integer tensors kept)."""
    tensors = load_file(str(path))
    tensors = {k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in tensors.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def set_config_dtype(folder: Path, dtype: str) -> None:
    """Record the stored dtype in ``config.json`` (``dtype``, as transformers 5 writes it)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = dtype
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def with_section(card: str, section: str) -> str:
    """``card`` with ``section`` before its first ``## `` heading (an earlier weights section replaced)."""
    card = re.sub(rf"\n{MARK}\n.*?(?=\n## |\Z)", "", card, flags=re.S)  # the last section too
    head, sep, tail = card.partition("\n## ")
    return f"{head.rstrip()}\n\n{section.strip()}\n{sep}{tail}"


def kept_section(folder: Path, exact: bool) -> str:
    """The card section of a folder that keeps its weights."""
    size = sum(p.stat().st_size for p in weight_files(folder)) / 2**20
    if exact:
        return f"{MARK}\n\nIn this folder ({size:.1f} MiB): integer tables and counts, stored exactly.\n"
    adapters = [p for p in weight_files(folder) if p.name.startswith("adapter_model.")]
    if adapters and len(adapters) == len(weight_files(folder)):  # a LoRA arm: the fine-tuned model, no drafter
        names = ", ".join(f"`{p.relative_to(folder).as_posix()}`" for p in adapters)
        return (
            f"{MARK}\n\nIn this folder ({size:.1f} MiB), stored in bfloat16 (trained in float32): the LoRA adapter of the "
            f"fine-tuned model ({names}); PEFT loads it onto the float32 base. Rounding the adapter changes the "
            "fine-tuned model itself slightly, so its plain decoding may differ from the float32 model's in places (the "
            "measurements below were taken with the float32 adapter). Its speculative decoding still matches its own "
            "plain decoding token for token.\n"
        )
    if adapters:  # a fine-tuned arm: its LoRA changes the model that verifies, not only what is drafted
        names = ", ".join(f"`{p.relative_to(folder).as_posix()}`" for p in adapters)
        return (
            f"{MARK}\n\nIn this folder ({size:.1f} MiB), stored in bfloat16 (trained in float32): the drafting weights "
            f"and the LoRA adapter of the fine-tuned model ({names}). Rounding the drafting weights changes only what is "
            "proposed; rounding the adapter changes the fine-tuned model itself slightly, so this folder's plain "
            "decoding may differ from the float32 model's in places. Its speculative decoding still matches its own "
            "plain decoding token for token (the lossless column below).\n"
        )
    return (
        f"{MARK}\n\nIn this folder ({size:.1f} MiB), stored in bfloat16 (trained in float32; the rounding changes "
        "only what the drafter proposes, never the verified output). Loaded next to a target, the drafter runs in "
        "the target's dtype and device (docs/drafter_placement.md): float32 beside a float32 target.\n"
    )


def removed_section(card: str) -> str:
    """The card section of a folder whose weights are not in the repository."""
    return (
        f"{MARK}\n\nThe weights are not in this repository (it keeps only the drafters its README and demo use, to "
        "stay small); this folder holds the card and its config. The command that trained them rebuilds them "
        "(the training data as the card describes; labelled shards: docs/training_data.md):\n\n"
        f"```bash\n{rebuild_command(card)}\n```\n"
    )


def slim(folder: Path, dry_run: bool) -> str:
    """Convert or remove one folder's weights and rewrite its card; returns what was done."""
    card_path = folder / "README.md"
    card, files = card_path.read_text(encoding="utf-8"), weight_files(folder)
    if folder.name in KEEP:
        exact = folder.name in EXACT
        if not dry_run and not exact:
            for path in files:
                to_bfloat16(path)
            if (folder / "config.json").is_file():  # an adapter-only folder has no config
                set_config_dtype(folder, "bfloat16")
        section, action = kept_section(folder, exact), "kept" + ("" if exact else " (bfloat16)")
    else:
        section, action = removed_section(card), f"removed {len(files)} weight file(s)"
        if not dry_run and files:
            subprocess.run(["git", "rm", "-q", "--", *map(str, files)], cwd=ROOT, check=True)
    if not dry_run:
        card_path.write_text(with_section(card, section), encoding="utf-8")
    return action


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    args = parser.parse_args()
    for folder in sorted(p for p in CARDS.iterdir() if (p / "README.md").is_file()):
        print(f"{folder.name}: {slim(folder, args.dry_run)}")


if __name__ == "__main__":
    main()
