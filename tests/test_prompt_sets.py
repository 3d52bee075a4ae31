"""Built-in prompt sets (package data), prompt files, and `datasets` folders as ``--prompts``."""

import configparser
import fnmatch
import json
import time
from pathlib import Path

import pytest

from hf_speculative.bench.prompts import (
    BUILTIN_DIR,
    HELDOUT_SETS,
    PROMPT_SETS,
    describe_prompts,
    first_per_category,
    load_prompts,
    records_from_dataset,
    spread_over_categories,
)

ROOT = Path(__file__).resolve().parents[1]


def test_limit_spreads_over_the_categories_round_robin():
    records = load_prompts()  # MT-Bench: 10 prompts per category, one category after the other
    order = list(dict.fromkeys(r.category for r in records))
    two = spread_over_categories(records, 2)
    assert [r.category for r in two] == order[:2] and two[0] is records[0]
    ten = spread_over_categories(records, 10)
    assert [r.category for r in ten] == order + order[:2]
    assert ten[8] is [r for r in records if r.category == order[0]][1]  # then each category's second prompt
    assert (
        spread_over_categories(records, 1000) == spread_over_categories(records, 80)
        and len(spread_over_categories(records, 1000)) == 80
    )
    assert spread_over_categories(records, 0) == []


def test_default_is_the_80_mt_bench_questions():
    records = load_prompts()
    assert len(records) == 80 and records == load_prompts("mt_bench") == load_prompts("mt-bench")
    categories = {r.category for r in records}
    assert categories == {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
    assert all(len(r.turns) == 2 and r.prompt for r in records)
    assert len(first_per_category(records, 1)) == 8
    assert describe_prompts(None) == "mt_bench (built-in)"


@pytest.mark.parametrize("name", HELDOUT_SETS)
def test_held_out_task_sets_carry_references(name):
    records = load_prompts(name)
    assert len(records) == 40
    assert len({r.id for r in records}) == 40
    assert all(r.prompt.strip() and r.reference for r in records)


def test_task_set_formats():
    assert load_prompts("wikisql")[0].reference.startswith("SELECT")  # SQL from wikisql_results.jsonl
    assert len(load_prompts("dialogsum")[0].reference) == 3  # three reference summaries per test dialogue
    assert "meaning representation" in load_prompts("e2e_nlg")[0].prompt
    assert len(load_prompts("gsm8k")) == len(load_prompts("humaneval")) == 80


def test_heldout_mixes_the_four_task_sets():
    records = load_prompts("heldout")
    assert len(records) == 160 and len({r.id for r in records}) == 160
    assert [r.category for r in first_per_category(records, 1)] == list(HELDOUT_SETS)
    assert len(load_prompts("heldout", limit=5)) == 5


def test_package_data_globs_carry_every_builtin_file():
    """setup.cfg's [options.package_data] must name each data file, or a non-editable install lacks it."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["hf_speculative.bench"].split(",") if p.strip()]
    files = sorted(p.relative_to(BUILTIN_DIR.parent).as_posix() for p in BUILTIN_DIR.iterdir() if p.is_file())
    assert [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []
    assert all((BUILTIN_DIR / f).is_file() for f in PROMPT_SETS.values())


def test_a_prompt_file_relative_to_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "q.jsonl").write_text(json.dumps({"question_id": 7, "category": "x", "turns": ["Hi?"]}) + "\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    records = load_prompts("../q.jsonl")
    assert [(r.id, r.prompt) for r in records] == [("7", "Hi?")]
    assert describe_prompts("../q.jsonl") == "../q.jsonl"


@pytest.mark.parametrize("name", ["./missing.jsonl", "data/missing.jsonl", "missing.csv", "/no/such/prompts"])
def test_a_missing_prompt_file_names_itself(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hf_speculative.hub.hub_reachable", lambda *a, **k: pytest.fail("no Hub lookup for a path"))
    with pytest.raises(FileNotFoundError, match="missing|no/such") as err:
        load_prompts(name)
    assert "mt_bench" in str(err.value)  # lists the built-in sets


def test_a_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"question_id": [1, 2], "category": ["a", "b"], "turns": [["one?"], ["two?"]]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "mt"))
    records = load_prompts(str(tmp_path / "mt"))
    assert [(r.id, r.category, r.prompt) for r in records] == [("1", "a", "one?"), ("2", "b", "two?")]
    # a DatasetDict: the test split; a plain prompt column
    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"prompt": ["train"]}),
        test=datasets.Dataset.from_dict({"prompt": ["p0", "p1", "p2"]}),
    )
    splits.save_to_disk(str(tmp_path / "dd"))
    records = load_prompts(str(tmp_path / "dd"), limit=2)
    assert [(r.id, r.prompt, r.category) for r in records] == [("0", "p0", "dd"), ("1", "p1", "dd")]


def test_dataset_rows_go_through_the_file_loaders():
    alpaca = records_from_dataset([{"instruction": "Add", "input": "1 and 2", "output": "3"}])
    assert alpaca[0].prompt == "Add\n\n1 and 2" and alpaca[0].reference == "3"
    e2e = records_from_dataset([{"mr": "name[A]", "ref": "A."}, {"mr": "name[A]", "ref": "It is A."}])
    assert len(e2e) == 1 and e2e[0].reference == ["A.", "It is A."]
    dialog = records_from_dataset(
        [{"id": "d0", "dialogue": "#Person1#: Hi.", "summary": "They greet.", "topic": "greeting"}]
    )
    assert dialog[0].category == "greeting" and dialog[0].reference == "They greet."
    with pytest.raises(ValueError, match="no prompt column"):
        records_from_dataset([{"foo": 1}])


def test_a_dataset_id_without_network_fails_in_seconds(no_network):
    pytest.importorskip("datasets")
    start = time.perf_counter()
    with pytest.raises(OSError, match="cannot be reached"):
        load_prompts("someone-xyz/no-such-prompts:test")
    assert time.perf_counter() - start < 5.0
