"""The documentation a user reads first: links that resolve, card snippets that match their renderers and load the
reference target offline, and product text free of process words."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "model_cards").rglob("README.md")),
    *sorted((ROOT / "examples").rglob("*.md")),
    *sorted((ROOT / "scripts").rglob("*.md")),
]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"(?<![\w/.~-])((?:docs|scripts|examples|model_cards|hf_speculative|tests)/[A-Za-z0-9_./*-]+)")


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_repo_paths_resolve(path):
    text = path.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:|^#", target):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            missing.append(target)
    for name in REPO_PATH.findall(text):
        name = name.rstrip(".,")
        if not (list(ROOT.glob(name)) if "*" in name else (ROOT / name).exists()):
            missing.append(name)
    assert not missing, f"{path.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize(
    "folder", sorted(p for p in (ROOT / "model_cards").iterdir() if p.is_dir()), ids=lambda p: p.name
)
def test_card_usage_is_the_renderers_and_loads_the_base_offline(folder):
    from hf_speculative.model_card import REFERENCE_BASE_MODEL, card_kind, usage_snippet

    if (folder / "downstream.json").exists():  # a task fine-tuned arm: its card reproduces its row
        from downstream.model_card import _loading
        from downstream.training import read_downstream_info

        info, text = read_downstream_info(folder), (folder / "README.md").read_text(encoding="utf-8")
        assert _loading(f"model_cards/{folder.name}", info["task"], info["method"]) in text
        assert f"python benchmarks/run_downstream.py eval model_cards/{folder.name} --task {info['task']}" in text
        assert "/work/" not in text  # paths as a user's clone has them
        return
    config = json.loads((folder / "config.json").read_text())
    if config.get("drafter_type") == "token_recycling":  # no weights to render a card from: warm-recycling writes it
        text = (folder / "README.md").read_text(encoding="utf-8")
        assert "= load_reference_model()" in text
        assert f'TokenRecyclingDrafter.from_pretrained("model_cards/{folder.name}")' in text
        return
    base = config["base_model_name_or_path"]
    snippet = usage_snippet(card_kind(config), base, f"model_cards/{folder.name}")
    assert snippet in (folder / "README.md").read_text(encoding="utf-8")
    assert base == REFERENCE_BASE_MODEL and "= load_reference_model()" in snippet
    code = [line for line in snippet.splitlines() if not line.lstrip().startswith("#")]
    assert not any("AutoModelForCausalLM.from_pretrained" in line for line in code)  # the Hub form only as a comment
    assert "apply_chat_template" in snippet and "print(tok.decode(" in snippet


def test_usage_snippet_for_another_base_loads_it_from_the_hub():
    from hf_speculative.model_card import usage_snippet

    snippet = usage_snippet("medusa_heads", "org/some-llama", None)
    assert 'AutoModelForCausalLM.from_pretrained("org/some-llama"' in snippet
    assert 'AutoTokenizer.from_pretrained("org/some-llama")' in snippet
    assert "load_reference_model" not in snippet and "<this folder or its Hub repo id>" in snippet


def test_no_process_words_in_the_product():
    words = re.compile(r"issue ?#?\d|\bsessions?\b|\bthe\s+lead\b", re.IGNORECASE)
    files = [ROOT / "README.md", ROOT / "setup.cfg"]
    for folder in ("docs", "model_cards", "examples", "scripts", "benchmarks", "hf_speculative"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".md", ".py", ".sh", ".yaml", ".cfg"}]
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in words.finditer(p.read_text(encoding="utf-8"))
    ]
    assert not found, found
    named = [
        p.name
        for p in ROOT.rglob("*")
        if ".git" not in p.parts and re.search(r"issue|(?<![a-z])bench1\d|(?<![a-z])batch1\d", p.name, re.IGNORECASE)
    ]
    assert not named, named


def test_module_table_matches_the_package():
    """Every row of the module table (docs/architecture.md) names a module or package that exists, and every
    top-level module and subpackage of hf_speculative (and every engine/ and drafters/ module) has a row."""
    table = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = table[: table.index("## Outside the package")]
    rows = {m.rstrip("/") for m in re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)}
    package = ROOT / "hf_speculative"
    for name in rows:
        assert (package / name).exists(), f"docs/architecture.md's module table names {name}, which does not exist"
    expected = {p.name for p in package.iterdir() if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    for sub in ("drafters", "engine"):
        expected |= {
            f"{sub}/{p.name}"
            for p in (package / sub).iterdir()
            if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())
        }
    missing = sorted(expected - rows - {"drafters"})
    assert not missing, f"modules without a row in docs/architecture.md's module table: {missing}"
