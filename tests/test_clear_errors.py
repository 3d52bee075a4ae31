"""Bad input fails at once with a message that names it: missing folders, an unreachable Hub, empty prompts."""

import json
import socket
import subprocess
import sys
import time

import pytest
import torch
from conftest import tiny_model
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

import hf_speculative as hfs
from hf_speculative import hub
from hf_speculative.bench.harness import load_drafter
from hf_speculative.bench.reference import resolve_model

DRAFTER_LOADERS = {
    "medusa": lambda path: hfs.MedusaHeadsModel.from_pretrained(path),
    "parallel": lambda path: hfs.ParallelDrafter.from_pretrained(path),
    "streaming": lambda path: hfs.LlamaForSpeculativeStreaming.from_pretrained(path),
    "token recycling": lambda path: hfs.TokenRecyclingDrafter.from_pretrained(path),
    "suffix": lambda path: hfs.SuffixDrafter.from_pretrained(path),
    "bench --drafter": lambda path: load_drafter(path),
    "bench --model": lambda path: resolve_model(path),
}


@pytest.fixture
def no_hub(monkeypatch):
    """Any Hub lookup fails the test."""
    monkeypatch.setattr(hub, "hub_reachable", lambda *a, **k: pytest.fail("a path-like name reached the Hub lookup"))


@pytest.mark.parametrize(
    "name, is_path",
    [
        ("./x", True),
        ("../x", True),
        ("/abs/x", True),
        ("~/x", True),
        ("a/b/c", True),
        ("a b", True),
        ("a--b/c", True),
        ("gpt2", False),
        ("org/model-name.v1", False),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", False),
    ],
)
def test_looks_like_path(name, is_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.looks_like_path(name) is is_path


def test_first_component_that_is_a_local_folder_makes_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not hub.looks_like_path("model_cards/typo")  # could be a Hub id ...
    (tmp_path / "model_cards").mkdir()
    assert hub.looks_like_path("model_cards/typo")  # ... but not where model_cards/ is a folder


@pytest.mark.parametrize("loader", DRAFTER_LOADERS)
@pytest.mark.parametrize("name", ["model_cards/typo", "./typo", "../typo", "/no/such/drafter", "~/no-such-drafter-xyz"])
def test_a_missing_folder_raises_at_once_naming_it(loader, name, tmp_path, monkeypatch, no_hub):
    (tmp_path / "model_cards").mkdir()
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="does not exist") as err:
        DRAFTER_LOADERS[loader](name)
    assert time.perf_counter() - start < 2.0
    assert repr(name) in str(err.value)


def test_relative_folders_resolve_against_the_current_directory(tmp_path, monkeypatch, no_hub):
    model = tiny_model()
    hfs.MedusaHeadsModel.from_base_model(model, num_heads=2).save_pretrained(tmp_path / "heads")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert hub.resolve_name_or_path("../heads") == str(tmp_path / "heads")
    heads = hfs.MedusaHeadsModel.from_pretrained("../heads", base_model=model)
    assert heads.config.num_heads == 2
    assert type(load_drafter("../heads", model)).__name__ == "MedusaHeadsModel"
    hfs.TokenRecyclingDrafter(num_successors=2).save_pretrained(tmp_path / "recycling")  # a model-free drafter's folder
    recycling = load_drafter("../recycling", model)  # `bench --drafter` takes it as it is (no .to / .eval)
    assert type(recycling).__name__ == "TokenRecyclingDrafter" and recycling.num_successors == 2


def test_hub_probe_answers_from_a_closed_and_an_open_port(no_network, monkeypatch):
    start = time.perf_counter()
    assert hub.hub_reachable(timeout=2.0) is False
    assert time.perf_counter() - start < 3.0
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub.hub_reachable(timeout=2.0) is True


@pytest.mark.parametrize("loader", ["medusa", "bench --drafter", "bench --model"])
def test_a_hub_name_without_network_fails_in_seconds(loader, no_network):
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="cannot be reached") as err:
        DRAFTER_LOADERS[loader]("someone-xyz/not-a-real-drafter")
    assert time.perf_counter() - start < 5.0
    assert "no network" in str(err.value) and "HF_HUB_OFFLINE=1" in str(err.value)
    assert "'someone-xyz/not-a-real-drafter' does not exist" in str(err.value)


def test_offline_mode_leaves_cached_hub_names_to_the_cache(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "hub_reachable", lambda *a, **k: pytest.fail("offline mode needs no probe"))
    monkeypatch.setattr(
        hub, "_cached_snapshot", lambda repo_id, repo_type: "/cache/snapshot" if repo_id == "org/model" else None
    )
    assert hub.resolve_name_or_path("org/model") == "org/model"
    with pytest.raises(FileNotFoundError, match="'org/other' does not exist .*offline mode is on"):
        hub.resolve_name_or_path("org/other")


@pytest.mark.parametrize("offline", [True, False])
def test_a_missing_folder_is_one_error_from_any_directory(offline, tmp_path, monkeypatch, no_network):
    """``model_cards/typo`` in the folder that holds model_cards/ and in one that does not: the same error type and
    the same message up to where it looked, in offline mode and without a network."""
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "project" / "model_cards").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    messages = []
    for cwd in ("project", "elsewhere"):
        monkeypatch.chdir(tmp_path / cwd)
        for load in (DRAFTER_LOADERS["medusa"], DRAFTER_LOADERS["token recycling"], DRAFTER_LOADERS["bench --drafter"]):
            start = time.perf_counter()
            with pytest.raises(FileNotFoundError) as err:
                load("model_cards/typo")
            assert time.perf_counter() - start < 5.0
            messages.append(str(err.value))
    heads = {m.split(" (looked for ")[0].split("'model_cards/typo'")[1] for m in messages}
    assert heads == {" does not exist"}, messages
    assert all(f"looked for {tmp_path}" in m for m in messages)


AUTO_CLASSES = ("AutoConfig", "AutoModel", "AutoModelForCausalLM")

FROM_PRETRAINED_BEFORE_AND_AFTER_IMPORT = f"""
import json
import transformers
classes = [getattr(transformers, name) for name in {AUTO_CLASSES!r}]
before = [c.__dict__.get("from_pretrained") for c in classes]
functions = [c.from_pretrained.__func__ for c in classes]
described = [[f.__module__, f.__qualname__, f.__code__.co_filename, hasattr(f, "__wrapped__")] for f in functions]
import hf_speculative
changed = [c.__name__ for c, b in zip(classes, before) if c.__dict__.get("from_pretrained") is not b]
print(json.dumps({{"changed": changed, "described": described}}))
"""


def _describe_from_pretrained(cls) -> list:
    function = cls.from_pretrained.__func__
    return [function.__module__, function.__qualname__, function.__code__.co_filename, hasattr(function, "__wrapped__")]


def test_import_leaves_transformers_from_pretrained_alone():
    """``import hf_speculative`` registers classes and replaces nothing: in a fresh process the Auto classes'
    ``from_pretrained`` are the same objects before and after the import, and here (imported) they are the functions
    a process that never imported hf_speculative has."""
    run = subprocess.run(
        [sys.executable, "-c", FROM_PRETRAINED_BEFORE_AND_AFTER_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    fresh = json.loads(run.stdout.strip().splitlines()[-1])
    assert fresh["changed"] == []
    here = [_describe_from_pretrained(cls) for cls in (AutoConfig, AutoModel, AutoModelForCausalLM)]
    assert here == fresh["described"]
    assert all(module.startswith("transformers.") and "hf_speculative" not in path for module, _, path, _ in here)


def test_a_registered_drafter_still_loads_through_the_auto_classes(tmp_path):
    hfs.MedusaHeadsModel.from_base_model(tiny_model(), num_heads=2).save_pretrained(tmp_path / "heads")
    assert type(AutoModel.from_pretrained(tmp_path / "heads")).__name__ == "MedusaHeadsModel"
    assert AutoConfig.from_pretrained(tmp_path / "heads").model_type == "medusa_heads"


def test_the_cli_prints_a_missing_folder_as_one_line(tmp_path, monkeypatch, capsys, no_hub):
    from hf_speculative import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hf_speculative.bench.reference.resolve_model", lambda *a, **k: pytest.fail("model loaded"))
    assert cli.main(["bench", "--methods", "plain,x", "--drafter", "x=./missing", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("hf-speculative bench: error: drafter folder './missing' does not exist")


def test_bench_command_checks_drafters_and_prompts_before_loading_the_model(tmp_path, monkeypatch, capsys, no_hub):
    from hf_speculative import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hf_speculative.bench.reference.resolve_model", lambda *a, **k: pytest.fail("model loaded"))
    assert cli.main(["bench", "--methods", "plain,x", "--drafter", "x=./missing", "--limit", "1"]) == 2
    assert "'./missing'" in capsys.readouterr().err
    assert cli.main(["bench", "--methods", "plain", "--prompts", "./typo.jsonl", "--limit", "1"]) == 2
    assert "typo.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("shape, message", [((1, 0), "no tokens"), ((0, 5), "empty batch"), ((0, 0), "empty batch")])
def test_empty_prompt_or_batch_raises_value_error(shape, message):
    model = hfs.enable(tiny_model())
    ids = torch.zeros(shape, dtype=torch.long)
    for drafter in (hfs.PromptLookupDrafter(), hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)):
        with pytest.raises(ValueError, match=message):
            model.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)
        with pytest.raises(ValueError, match=message):
            model.generate(input_ids=ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)


def test_empty_prompt_to_a_self_drafting_model():
    ss = hfs.LlamaForSpeculativeStreaming.from_base_model(tiny_model(), num_streams=2, num_msa_layers=1)
    with pytest.raises(ValueError, match="no tokens"):
        ss.generate(torch.zeros((1, 0), dtype=torch.long), max_new_tokens=4)
