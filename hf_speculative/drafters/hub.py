"""``push_to_hub`` for every drafter: the checkpoint as ``save_pretrained`` writes it, plus the drafter's own model
card (`hf_speculative.model_card`), whose YAML header carries what the Hub indexes (``base_model``, ``library_name: hf_speculative``,
``pipeline_tag``, ``tags``); transformers' own ``push_to_hub`` would write its generic card instead. `drafter_folder`
finds the folder of a drafter that loads without transformers' machinery (the model-free ones): a local folder, or
a Hub repo's files downloaded through huggingface_hub. `require_weights` stops a local folder that holds a drafter's
config but no weights (a card of ``model_cards/`` whose weights the repository does not keep) with the command that
rebuilds them."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

__all__ = ["DrafterHubMixin", "drafter_folder", "rebuild_command", "require_weights", "WEIGHT_FILES"]

#: the weight files `PreTrainedModel.from_pretrained` reads from a folder (one file or a sharded one's index)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: where a card records the command that made its weights: the bash block of its ``## Weights`` section (a card whose
#: weights are not kept, ``scripts/slim_cards.py``), else its training record's ``- command:`` (inline or a block)
_WEIGHTS_SECTION = re.compile(r"^## Weights\n(.*?)(?=^## |\Z)", re.S | re.M)
_BASH_BLOCK = re.compile(r"```bash\n(.+?)\n```", re.S)
_RECORDED_COMMANDS = (
    re.compile(r"^- command: `([^`]+)`", re.M),
    re.compile(r"^- command:\s*```(?:bash)?\n(.+?)\n```", re.S | re.M),
)


#: what ``from_pretrained`` takes for loading itself (not a setting of the model-free drafter it builds)
LOADER_ARGUMENTS = frozenset(
    {
        "trust_remote_code",
        "adapter_kwargs",
        "cache_dir",
        "force_download",
        "local_files_only",
        "token",
        "revision",
        "subfolder",
        "proxies",
        "code_revision",
        "_from_auto",
        "_from_pipeline",
        "_commit_hash",
    }
)
#: the arguments of ``from_pretrained`` (``AutoModel``'s included) that the Hub download takes
_DOWNLOAD_ARGUMENTS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "proxies")


def drafter_folder(name_or_path: str | os.PathLike, filenames: Sequence[str], what: str, **loader_kwargs) -> Path:
    """The local folder of a saved drafter: ``name_or_path`` when it is a folder here, else the files ``filenames``
    of the Hub repo of that id, downloaded (or read from the local cache in offline mode) through huggingface_hub.

    Raises:
        FileNotFoundError: a missing folder, or a Hub id that cannot be loaded now (`hf_speculative.hub.resolve_name_or_path`:
            offline mode with nothing cached, or no network).
        NotADirectoryError: a file where the folder should be.
        OSError: the download failed (no such repo, no access); the message names the repo.
    """
    from ..hub import hub_offline, resolve_name_or_path

    resolved = resolve_name_or_path(name_or_path, what=what)
    path = Path(resolved)
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{what} {str(path)!r} is a file; give the folder save_pretrained wrote")
    from huggingface_hub import snapshot_download

    kwargs = {k: loader_kwargs[k] for k in _DOWNLOAD_ARGUMENTS if loader_kwargs.get(k) is not None}
    if hub_offline():
        kwargs["local_files_only"] = True
    subfolder = str(loader_kwargs.get("subfolder") or "").strip("/")
    patterns = [f"{subfolder}/{name}" if subfolder else name for name in filenames]
    try:
        local = Path(snapshot_download(resolved, allow_patterns=patterns, **kwargs))
    except (OSError, ValueError) as error:  # huggingface_hub's errors (not found, no access, offline) are OSErrors
        raise OSError(f"could not load the {what} {resolved!r} from the Hugging Face Hub: {error}") from error
    return local / subfolder if subfolder else local


def rebuild_command(folder: str | os.PathLike) -> str | None:
    """The command that made the weights of the drafter in ``folder``, as its card (``README.md``: the bash block of
    its ``## Weights`` section, else the first ``- command:`` of its training record) or else its config's training
    record (``training.command``) records it; None when none does."""
    folder = Path(folder)
    card = folder / "README.md"
    text = card.read_text(encoding="utf-8") if card.is_file() else ""
    section = _WEIGHTS_SECTION.search(text)
    match = _BASH_BLOCK.search(section.group(1)) if section else None
    match = match or next(filter(None, (pattern.search(text) for pattern in _RECORDED_COMMANDS)), None)
    if match:
        return match.group(1).strip()
    try:
        training = json.loads((folder / "config.json").read_text()).get("training")
    except (OSError, ValueError, AttributeError):  # no config, not JSON or not an object: transformers says so
        return None
    command = training.get("command") if isinstance(training, dict) else None
    return command.strip() if isinstance(command, str) and command.strip() else None


def require_weights(path: str | os.PathLike | None, what: str, subfolder: str | None = None) -> None:
    """Raise `FileNotFoundError` when ``path`` (resolved; its ``subfolder``) is a local folder with a ``config.json``
    and none of the `WEIGHT_FILES`; the message names the folder and the command that rebuilds its weights
    (`rebuild_command`). Anything else (a Hub id, a folder with weights, no config) passes: transformers decides."""
    if path is None:
        return
    folder = Path(path) / subfolder if subfolder else Path(path)
    if not (folder / "config.json").is_file() or any((folder / name).is_file() for name in WEIGHT_FILES):
        return
    command = rebuild_command(folder)
    rebuild = (
        f"its weights are not kept beside its card; the command that trained them rebuilds them (its README.md, "
        f"section 'Weights'): {command}"
        if command
        else "give the folder that save_pretrained wrote, weights included"
    )
    raise FileNotFoundError(
        f"the {what} folder {str(folder)!r} holds a config.json but no weights (no model.safetensors or "
        f"pytorch_model.bin): {rebuild}"
    )


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
