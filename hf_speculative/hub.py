"""Local folders and Hub names: tell them apart before loading, and fail fast with a message that says why.

``from_pretrained`` treats any name that is not an existing folder as a Hub repo id. A typo in a folder
(``model_cards/medusa-smolm2``) then costs half a minute of Hub retries and ends in "couldn't connect",
and without a network a real Hub id does the same. :func:`resolve_name_or_path` runs before every load of
ours (drafters' ``from_pretrained``, the bench's ``--model`` and ``--drafter``, ``--prompts``, the demo). It leaves
transformers' own ``AutoConfig`` / ``AutoModel*.from_pretrained`` alone: ``import hf_speculative`` only registers
classes with them.

- an existing path, absolute or relative to the current directory, comes back as an absolute path;
- a name that can only be a path (``./x``, ``../x``, ``/x``, ``~/x``, two or more separators, a first
  component that is a local folder, characters a Hub id cannot have) raises ``FileNotFoundError``
  naming the folder, with no Hub lookup;
- a Hub id is returned unchanged when the Hub answers a TCP connect within a few seconds, or when it is
  cached (offline mode, ``HF_HUB_OFFLINE=1``, uses the cache only); otherwise it is a missing folder as
  far as this machine can tell: the same ``FileNotFoundError`` naming it, which adds that the Hub cannot be
  reached (or offline mode is on) and nothing of that name is cached. So a missing folder gives one error,
  from whatever directory it is run.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["looks_like_path", "resolve_name_or_path", "hub_offline", "hub_reachable", "missing_folder"]


def _is_repo_id(text: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def looks_like_path(name: str | os.PathLike) -> bool:
    """True when ``name`` can only mean a local path, never a Hub repo id."""
    text = os.fspath(name)
    if isinstance(name, Path) or text.startswith(("./", "../", "/", "~", ".\\", "..\\")) or text in (".", ".."):
        return True
    if os.sep != "/" and os.sep in text:
        return True
    if not _is_repo_id(text):
        return True
    first = text.split("/", 1)[0]
    return "/" in text and Path(first).is_dir()  # "model_cards/typo" in the repo root


def hub_offline() -> bool:
    """Offline mode as huggingface_hub and transformers read it: ``huggingface_hub.constants.HF_HUB_OFFLINE`` (read when
    huggingface_hub is imported), or ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set in the environment since (which
    that constant does not see: hence the environment read)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    return any(
        os.environ.get(v, "").strip().upper() in constants.ENV_VARS_TRUE_VALUES
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub endpoint opens within ``timeout`` seconds (name lookup included).

    With a proxy configured the answer is ``True``: the proxy decides, and huggingface_hub talks to it.
    """
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(_endpoint())
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if host is None:
        return False
    result: list[bool] = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo has no timeout of its own
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result and result[0])


def _cached_snapshot(repo_id: str, repo_type: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    for filename in ("config.json", "README.md", "dataset_info.json"):
        found = try_to_load_from_cache(repo_id, filename, repo_type=repo_type)
        if isinstance(found, str):
            return str(Path(found).parent)
    return None


def missing_folder(name_or_path: str | os.PathLike, what: str = "model", why: str = "") -> FileNotFoundError:
    """The one error for a local folder that does not exist: names it as given and where it was looked for."""
    text = os.fspath(name_or_path)
    where = Path(text).expanduser().absolute()
    return FileNotFoundError(f"{what} folder {text!r} does not exist (looked for {where}){why}")


def resolve_name_or_path(
    name_or_path: str | os.PathLike | None, what: str = "model", repo_type: str = "model"
) -> str | None:
    """An absolute local path, or a Hub id that can be loaded now; raise at once otherwise.

    Args:
        name_or_path: a folder or file (relative paths resolve against the current directory) or a Hub repo id.
        what: what is being loaded, for the message ("drafter", "model", "prompt data set").
        repo_type: the Hub repo type of an id ("model" or "dataset").

    Raises:
        FileNotFoundError: a path-like name that does not exist; a Hub-id-like name that is no local folder while
            the Hub cannot be reached (or offline mode is on) and nothing of it is cached.
    """
    if name_or_path is None:  # from_pretrained(None, config=..., state_dict=...)
        return None
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        return str(path.resolve())
    if looks_like_path(name_or_path):
        raise missing_folder(text, what)
    if hub_offline():
        if repo_type != "model" or _cached_snapshot(text, repo_type) is not None:
            return text  # the cache answers (datasets keep their own cache: the library decides)
        raise missing_folder(
            text, what, f", and offline mode is on (HF_HUB_OFFLINE=1) with no Hub repo {text!r} in the cache"
        )
    if hub_reachable():
        return text
    cached = _cached_snapshot(text, repo_type)
    if cached is not None:
        return cached
    raise missing_folder(
        text,
        what,
        f", and as a Hub repo id it cannot be downloaded: the Hugging Face Hub ({_endpoint()}) cannot be reached (no "
        "network) and nothing of it is cached. Give a local folder, or set HF_HUB_OFFLINE=1 to use the local cache only.",
    )
