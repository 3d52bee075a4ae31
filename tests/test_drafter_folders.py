"""Every folder in model_cards/ loads the way its card and the README say, after ``import hf_speculative`` and with no
``trust_remote_code``: a folder with weights through ``AutoModel.from_pretrained``, a LoRA arm's adapter through PEFT
onto the reference model, a card that keeps only its config through ``AutoConfig.from_pretrained`` (its
``from_pretrained`` then fails naming the command that rebuilds the weights); and every card names only commands and
data a user has. Each folder's weights are loaded once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, PretrainedConfig

import hf_speculative as hfs
from hf_speculative.drafters.hub import rebuild_command, require_weights
from hf_speculative.training.data import encode_chat

ROOT = Path(__file__).resolve().parents[1]
CARDS = sorted(p for p in (ROOT / "model_cards").iterdir() if p.is_dir())
WEIGHTS = (".safetensors", ".bin")


def _has_weights(folder: Path) -> bool:
    return any(p.name.endswith(WEIGHTS) for p in folder.iterdir() if p.is_file())


@pytest.mark.parametrize(
    "folder", [f for f in CARDS if (f / "config.json").is_file() and _has_weights(f)], ids=lambda p: p.name
)
def test_a_folder_with_weights_loads_with_auto_model(folder):
    model = AutoModel.from_pretrained(folder)
    assert type(model).__module__.startswith("hf_speculative."), type(model)
    assert type(model).config_class.model_type == json.loads((folder / "config.json").read_text())["model_type"]


@pytest.mark.parametrize("folder", [f for f in CARDS if (f / "config.json").is_file()], ids=lambda p: p.name)
def test_every_drafter_config_loads_with_auto_config(folder):
    config = AutoConfig.from_pretrained(folder)
    assert type(config) is not PretrainedConfig and type(config).__module__.startswith("hf_speculative."), type(config)


@pytest.mark.parametrize("folder", [f for f in CARDS if not (f / "config.json").is_file()], ids=lambda p: p.name)
def test_a_folder_without_config_is_an_adapter_of_the_target(folder):
    """The LoRA arms add an adapter to the base model (``load_downstream``), no drafter of their own."""
    assert (folder / "adapter" / "adapter_config.json").is_file() and (folder / "downstream.json").is_file()


@pytest.mark.parametrize(
    "folder", [f for f in CARDS if (f / "config.json").is_file() and not _has_weights(f)], ids=lambda p: p.name
)
def test_a_card_without_weights_fails_naming_the_command_that_rebuilds_them(folder):
    """``AutoModel`` and the drafter's own class stop before loading anything (no target, no random weights), with the
    folder and the command of its card's ``## Weights`` section in the message."""
    command = rebuild_command(folder)
    assert command and command.startswith(("hf-speculative ", "python benchmarks/run_downstream.py ")), command
    drafter_class = getattr(hfs, json.loads((folder / "config.json").read_text())["architectures"][0])
    for load in (AutoModel.from_pretrained, drafter_class.from_pretrained):
        with pytest.raises(FileNotFoundError) as error:
            load(folder)
        message = str(error.value)
        assert folder.name in message and "no weights" in message and command in message, message


def test_a_folder_with_weights_or_without_a_config_is_left_to_transformers(tmp_path):
    hfs.TokenRecyclingDrafter(num_successors=4).save_pretrained(tmp_path / "kept")
    require_weights(tmp_path / "kept", "drafter")  # weights present
    require_weights(tmp_path, "drafter")  # no config.json: transformers' own error
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="save_pretrained wrote"):  # no card: no command to name
        require_weights(tmp_path, "drafter")


@pytest.fixture(scope="module")
def load_task_adapter():
    """Loads a LoRA folder's adapter onto one reference model (PEFT, by the folder's name); the model loads once."""
    from peft import PeftModel

    from hf_speculative.bench import load_reference_model

    held = {}

    def load(folder: Path):
        path = str(folder / "adapter")
        if "model" not in held:
            held["model"] = PeftModel.from_pretrained(load_reference_model()[0], path, adapter_name=folder.name)
        else:
            held["model"].load_adapter(path, adapter_name=folder.name)
        return held["model"]

    return load


@pytest.mark.parametrize("folder", [f for f in CARDS if not (f / "config.json").is_file()], ids=lambda p: p.name)
def test_a_lora_folder_ships_its_adapter_and_peft_loads_every_tensor(folder, load_task_adapter):
    """Stored in bfloat16, loaded onto the float32 reference model as float32, every tensor of the file in place."""
    stored = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    params = dict(load_task_adapter(folder).named_parameters())
    for key, tensor in stored.items():
        loaded = params[key.replace(".weight", f".{folder.name}.weight")]
        assert loaded.dtype == torch.float32 and torch.equal(loaded, tensor.float()), key


@pytest.mark.parametrize("folder", CARDS, ids=lambda p: p.name)
def test_cards_name_only_data_a_user_has(folder):
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "shared/data" not in card and "../shared" not in card and "/work/" not in card


def test_card_renderers_write_the_public_data_set_for_the_projects_copy():
    from downstream.model_card import render_model_card

    info = {
        "task": "e2e_nlg",
        "method": "lora",
        "data": "../shared/data/e2e_nlg",
        "command": "hf-speculative downstream train --task e2e_nlg --method lora --data ../shared/data/e2e_nlg --out x",
    }
    card = str(render_model_card(info, None, "model_cards/lora-x"))
    assert "shared/data" not in card and "--data path/to/e2e_nlg" in card and "tuetschek/e2e-dataset" in card


def test_token_recycling_folder_round_trips_through_auto_model(tmp_path):
    drafter = hfs.TokenRecyclingDrafter(num_successors=4, max_nodes=12)
    drafter._ensure_matrix(32, torch.device("cpu"))
    drafter.update(torch.tensor([3, 5]), torch.tensor([[1, 2, 3, 4], [6, 7, 8, 9]]))
    drafter.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, hfs.TokenRecyclingDrafter) and loaded.max_nodes == 12
    assert torch.equal(loaded.adjacency, drafter.adjacency)
    assert AutoConfig.from_pretrained(tmp_path).num_successors == 4


def test_token_recycling_folder_saved_before_it_had_a_model_type_still_loads(tmp_path):
    hfs.TokenRecyclingDrafter(num_successors=4).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert hfs.TokenRecyclingDrafter.from_pretrained(tmp_path).num_successors == 4


def _chat_ids(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([encode_chat(tokenizer, [{"role": "user", "content": text}])])


@pytest.fixture(scope="module")
def reference():
    from hf_speculative.bench import load_reference_model

    model, tokenizer = load_reference_model()
    return hfs.enable(model), tokenizer


@pytest.mark.parametrize(
    "folder", [f for f in CARDS if (f / "config.json").is_file() and _has_weights(f)], ids=lambda p: p.name
)
def test_a_folder_with_weights_decodes_exactly(folder, reference):
    """Greedy speculative decoding with the folder's drafter, float32, equals plain decoding of the model it drafts for:
    the reference model, or for a task folder its fine-tuned model (`load_downstream`, as `downstream eval` runs it)."""
    if (folder / "downstream.json").is_file():
        from downstream.evaluation import load_downstream

        arm = load_downstream(folder)
        ids = _chat_ids(
            arm.tokenizer,
            "Write one or two sentences describing a restaurant from this meaning representation: name[The Mill], "
            "eatType[pub], food[Italian], area[riverside]",
        )
        plain, speculative = arm.plain(ids, 24).sequences, arm.speculative(ids, 24).sequences
    else:
        from hf_speculative.bench.harness import load_drafter

        model, tokenizer = reference
        ids = _chat_ids(tokenizer, "Name three primary colours and say why they are called primary.")
        plain = model.generate(ids, max_new_tokens=24, do_sample=False)
        speculative = model.generate(
            ids, assistant_model=load_drafter(str(folder), model), max_new_tokens=24, do_sample=False
        )
    assert speculative.shape[1] > ids.shape[1] and torch.equal(speculative, plain)
