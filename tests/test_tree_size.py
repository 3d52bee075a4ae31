"""The repository stays small enough to travel: the tracked tree within 40 MiB (it goes with every GPU kit call,
``scripts/gpu/pack.py``), drafter weights within their budget, and every drafter folder either holds its weights or
says how to rebuild them."""

import subprocess
from pathlib import Path

import pytest
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
TREE_BUDGET_MIB = 40
#: The weights under model_cards/ (bfloat16 where trained in float32; scripts/slim_cards.py KEEP): the drafters the
#: README and the demo use (4.9 MiB), the three task LoRA adapters of docs/downstream.md (4.7 MiB each, 14.1 MiB;
#: TASK_ADAPTERS), and the best trained drafter per task that fits (TASK_DRAFTERS): E2E NLG's EAGLE-3 (12.0 MiB with a
#: 2,048-token draft vocabulary) and WikiSQL's Medusa heads (2.6 MiB; WikiSQL's faster EAGLE-3 would take another 12.0
#: MiB), in room the docs' result records made when they were gzipped: 33.7 MiB today.
WEIGHTS_BUDGET_MIB = 34
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def tracked_sizes() -> dict[str, int]:
    """Size of every tracked file present in the working tree; skips where this is not a git checkout."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available here")
    names = [n for n in out.decode().split("\0") if n]
    return {n: (ROOT / n).stat().st_size for n in names if (ROOT / n).is_file()}


def test_tracked_tree_within_budget():
    sizes = tracked_sizes()
    total = sum(sizes.values()) / 2**20
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= TREE_BUDGET_MIB, f"tracked tree {total:.1f} MiB > {TREE_BUDGET_MIB} MiB; largest: {largest}"


def test_weights_within_budget_and_only_in_model_cards():
    weights = {n: s for n, s in tracked_sizes().items() if n.endswith(WEIGHT_SUFFIXES)}
    assert all(n.startswith("model_cards/") for n in weights), sorted(weights)
    total = sum(weights.values()) / 2**20
    assert total <= WEIGHTS_BUDGET_MIB, f"drafter weights {total:.1f} MiB > {WEIGHTS_BUDGET_MIB} MiB: {sorted(weights)}"


def card_folders():
    return sorted(p for p in (ROOT / "model_cards").iterdir() if (p / "README.md").is_file())


@pytest.mark.parametrize("folder", card_folders(), ids=lambda p: p.name)
def test_card_says_where_its_weights_are(folder):
    card = (folder / "README.md").read_text(encoding="utf-8")
    files = [p for p in folder.rglob("*") if p.name.endswith(WEIGHT_SUFFIXES)]
    assert "## Weights" in card
    if files:
        assert "In this folder" in card and "not in this repository" not in card
    else:
        assert "The weights are not in this repository" in card
        rebuild = card.split("## Weights", 1)[1]  # the command that rebuilds them: the package's, or a study's script
        assert "```bash\nhf-speculative " in rebuild or "```bash\npython benchmarks/" in rebuild


@pytest.mark.parametrize("folder", [p for p in card_folders() if list(p.glob("*.safetensors"))], ids=lambda p: p.name)
def test_kept_weights_hold_no_tensor_of_the_target(folder):
    for path in folder.rglob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            # a LoRA adapter's factors (``...q_proj.lora_A.weight``) name the layer they adapt, not a tensor of it
            keys = [k for k in f.keys() if ".lora_" not in k]
            shared = [k for k in keys if "embed_tokens" in k or k.startswith(("model.layers.", "base_lm_head"))]
        assert not shared, f"{path.relative_to(ROOT)} stores tensors the drafter shares with its target: {shared}"


@pytest.mark.parametrize("saved_dtype", ["float32", "bfloat16"])
def test_drafter_folders_load_in_either_stored_dtype(saved_dtype, tmp_path):
    """A folder stored in bfloat16 (as the repository keeps them) or float32 (as training writes them) loads beside a
    float32 target, runs in the target's dtype, and greedy output stays the target's."""
    import torch
    from conftest import tiny_model

    import hf_speculative as hfs

    target = hfs.enable(tiny_model(seed=3))
    hfs.MedusaHeadsModel.from_base_model(target, num_heads=3).to(getattr(torch, saved_dtype)).save_pretrained(tmp_path)
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path, base_model=target)
    assert {p.dtype for p in heads.parameters()} == {torch.float32}
    ids = torch.tensor([[1, 5, 9, 5, 9, 5]])
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(ids, assistant_model=heads, max_new_tokens=12, do_sample=False), plain)


def test_a_cards_weights_section_is_replaced_wherever_it_stands():
    """`scripts/slim_cards.py` rewrites a card's ``## Weights`` section in place, the last section of a card too (it
    used to add a second one there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("slim_cards", ROOT / "scripts" / "slim_cards.py")
    slim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(slim)
    section = f"{slim.MARK}\n\nnew text\n"
    for card in (
        "# card\n\nintro\n\n## Weights\n\nold text\n\n## Measured\n\ntable\n",
        "# card\n\nintro\n\n## Measured\n\ntable\n\n## Weights\n\nold text\n",
    ):
        rewritten = slim.with_section(card, section)
        assert rewritten.count("## Weights") == 1 and "new text" in rewritten and "old text" not in rewritten
        assert "## Measured\n\ntable" in rewritten
