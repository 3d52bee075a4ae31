"""``push_to_hub`` for every drafter: the checkpoint as ``save_pretrained`` writes it, plus the drafter's own model
card (`hf_speculative.model_card`), whose YAML header carries what the Hub indexes (``base_model``, ``library_name: hf_speculative``,
``pipeline_tag``, ``tags``); transformers' own ``push_to_hub`` would write its generic card instead."""

from __future__ import annotations

import tempfile
from pathlib import Path

__all__ = ["DrafterHubMixin"]


class DrafterHubMixin:
    """Mixed into a drafter's `PreTrainedModel` (before it); its card template is its folder's ``card.yaml`` (`hf_speculative.model_card.cards`)."""

    def model_card(self) -> str:
        """The README.md of this drafter (markdown with a YAML header)."""
        from ..model_card import drafter_card

        return str(drafter_card(self))

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        **save_kwargs,
    ):
        """Create ``repo_id`` (if needed) and upload the checkpoint with its model card in one commit; returns
        the commit info of `huggingface_hub.HfApi.upload_folder`."""
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, **save_kwargs)
            (Path(folder) / "README.md").write_text(self.model_card(), encoding="utf-8")
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                commit_message=commit_message or f"Upload {type(self).__name__}",
                revision=revision,
                create_pr=create_pr,
            )
