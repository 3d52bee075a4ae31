"""``push_to_hub`` for every drafter, offline: ``huggingface_hub.HfApi`` upload calls mocked; the uploaded folder
reloads, and its model card's YAML (read with ``huggingface_hub.ModelCard``) carries what the Hub indexes."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import tiny_model
from huggingface_hub import HfApi, ModelCard

import hf_speculative as hfs

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A stand-in for the Hub: create_repo records the repo, upload_folder copies the folder it is given."""
    calls = {"repos": [], "uploads": []}

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        calls["repos"].append((repo_id, private, exist_ok))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, commit_message=None, revision=None, create_pr=False, **kwargs):
        target = tmp_path / "hub" / repo_id
        shutil.copytree(folder_path, target)
        calls["uploads"].append({"repo_id": repo_id, "commit_message": commit_message, "folder": target})
        return f"https://hub.invalid/{repo_id}/commit/0"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def _drafters(model):
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    parallel = hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2)
    streams = hfs.LlamaForSpeculativeStreaming.from_base_model(model, num_streams=2, num_msa_layers=2)
    return {"medusa": heads, "parallel": parallel, "streaming": streams}


@pytest.mark.parametrize(
    "kind,tag", [("medusa", "medusa"), ("parallel", "parallelspec"), ("streaming", "speculative-streaming")]
)
def test_push_to_hub_uploads_checkpoint_and_card(hub, kind, tag):
    model = tiny_model()
    drafter = _drafters(model)[kind]
    drafter.config.base_model_name_or_path = BASE
    assert drafter.push_to_hub(f"me/{kind}-drafter", private=True) == f"https://hub.invalid/me/{kind}-drafter/commit/0"
    assert hub["repos"] == [(f"me/{kind}-drafter", True, True)]
    (upload,) = hub["uploads"]
    folder = upload["folder"]
    assert (folder / "config.json").is_file() and (folder / "README.md").is_file()
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model == BASE
    assert card.data.library_name == "hf_speculative"
    assert card.data.pipeline_tag == "text-generation"
    assert "speculative-decoding" in card.data.tags and any(tag in t for t in card.data.tags), card.data.tags
    assert "transformers model that has been pushed" not in card.text  # ours, not transformers' generic card
    again = type(drafter).from_pretrained(folder, base_model=model)
    for (name, p), (_, q) in zip(drafter.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), name
