"""Target-labelled training data: the target runs once, teacher-forced, over the training conversations, and
what the drafters learn from goes to safetensors shards under a cache folder.

Per token (flattened over conversations, one shard every ``shard_tokens`` tokens):

==================  ==============  ===========================================================================
tensor              shape / dtype   meaning
==================  ==============  ===========================================================================
``input_ids``       (N,) int32      the conversation, the target's chat template on every turn
``labels``          (N,) int32      ``input_ids`` on assistant tokens, ``-100`` elsewhere
``offsets``         (C + 1,) int64  conversation c spans ``offsets[c]:offsets[c + 1]`` of the shard
``hidden_<i>``      (N, H) float16  ``output_hidden_states[i]`` (0 = embeddings, ``num_hidden_layers`` = the
                                    post-norm final state that the ``lm_head`` reads: Medusa-1, ParallelSpec;
                                    low/mid/high layers for EAGLE-3)
``topk_ids``        (N, k) int32    the target's k most likely next tokens after ``..t`` (predicting t + 1)
``topk_logprobs``   (N, k) float16  their log-probabilities (``log_softmax`` over the full vocabulary): the
                                    teacher of the KD loss (Medusa-2 self-distillation, SPIRe's distillation)
==================  ==============  ===========================================================================

``manifest.json`` (rewritten atomically after each shard) holds the settings, the shards with their token and
conversation counts, and ``next_record``: a killed run resumes after the last finished shard. Under
``torch.distributed`` / ``accelerate`` (``RANK``, ``WORLD_SIZE``), process r labels records ``i % world == r``
into ``out_dir/rank<r>``; :class:`LabelledShards` reads either layout.

    hf-speculative label --model reference --data sharegpt --max-tokens 2000000
"""

from __future__ import annotations

import bisect
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch
from transformers.utils import logging

from ..paths import atomic_path, cache_root, model_key, write_atomically
from .data import Record, load_records
from .trainer import HiddenStates, encode_record

__all__ = [
    "DEFAULT_LAYERS",
    "label_conversations",
    "label_records",
    "labelled_cache_dir",
    "LabelledShards",
]

DEFAULT_LAYERS = (2, 15, 26, 27, -1)
"""``output_hidden_states`` indices stored by default; ``-1`` stands for ``num_hidden_layers`` (the final,
post-norm state). Indices past the model's depth are dropped."""

logger = logging.get_logger(__name__)

_SETTINGS = ("model_key", "layers", "top_k", "max_length", "data", "autocast")


def labelled_cache_dir(model, data: str = "sharegpt", max_length: int = 1024) -> Path:
    """``$HF_SPECULATIVE_CACHE/labelled/<model key>-<data>``."""
    return cache_root() / "labelled" / f"{model_key(model, max_length)}-{Path(str(data)).stem}"


def _resolve_layers(layers: Iterable[int], num_layers: int) -> list[int]:
    out = []
    for i in layers:
        i = num_layers if i == -1 else int(i)
        if 0 <= i <= num_layers and i not in out:
            out.append(i)
    return sorted(out)


def _dist_rank() -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)`` from the environment, not accelerate's PartialState: labelling needs no process group."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _write_json_atomic(path: Path, obj) -> None:
    write_atomically(path, json.dumps(obj, indent=1))


def _labelling_settings(
    model,
    layers: list[int],
    top_k: int,
    max_length: int,
    data: str,
    autocast: torch.dtype | None,
    rank: int,
    world: int,
) -> dict:
    """The settings recorded in (and checked against) ``manifest.json``."""
    num_layers = model.config.num_hidden_layers
    return {
        "model_key": model_key(model, max_length),
        "model": str(getattr(model.config, "_name_or_path", "")) or type(model).__name__,
        "layers": layers,
        "top_k": top_k,
        "max_length": max_length,
        "data": str(data),
        "data_fingerprint": data_fingerprint(data),
        "autocast": None if autocast is None else str(autocast).removeprefix("torch."),
        "num_hidden_layers": num_layers,
        "hidden_size": model.config.hidden_size,
        "rank": rank,
        "world_size": world,
    }


def data_fingerprint(data) -> str | None:
    """A data file's size and content hash (read in 1 MiB chunks), so a manifest knows its data under another path
    (a relative path from another directory, a copy); None for a named data set (``"sharegpt"``) or a missing file."""
    import hashlib

    path = Path(str(data))
    if not path.is_file():
        return None
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f"{path.stat().st_size}:{digest.hexdigest()}"


def _changed_settings(manifest: dict, settings: dict) -> list[str]:
    """The checked settings that differ; the data counts as the same when its path differs but its content does not."""
    changed = [k for k in _SETTINGS if manifest.get(k) != settings[k]]
    # a manifest written before fingerprints were recorded: its data file's own, where that path still reads
    recorded = manifest.get("data_fingerprint") or data_fingerprint(manifest.get("data") or "")
    same_file = recorded is not None and recorded == settings["data_fingerprint"]
    return [k for k in changed if not (k == "data" and same_file)]


def _read_manifest(path: Path) -> dict | None:
    """The manifest at ``path``; None (with a warning) when it is damaged: the folder is labelled again from the
    first record, each shard replacing the old one of its name."""
    try:
        manifest = json.loads(path.read_text())
        if isinstance(manifest, dict) and isinstance(manifest.get("shards"), list):
            return manifest
        error = "not a labelling manifest"
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON (a truncated file)
        error = f"{type(e).__name__}: {e}"
    logger.warning_once(f"ignoring the damaged {path} ({error}): labelling this folder again from the first record")
    return None


def _open_manifest(out_dir: Path, settings: dict) -> dict:
    """The manifest of a run to resume (its settings must match ``settings``), or a fresh one."""
    manifest_path = out_dir / "manifest.json"
    manifest = _read_manifest(manifest_path) if manifest_path.is_file() else None
    if manifest is not None:
        changed = _changed_settings(manifest, settings)
        if changed:
            diff = "; ".join(f"{k}: {manifest.get(k)!r} there, {settings[k]!r} here" for k in changed)
            raise ValueError(f"{out_dir} holds data labelled with other settings ({diff}); use another folder")
    else:
        manifest = {
            **settings,
            "shards": [],
            "next_record": 0,
            "num_conversations": 0,
            "total_tokens": 0,
            "bytes": 0,
            "bytes_per_million_tokens": None,
            "tokens_per_second": None,
        }
    return manifest


def _encode(tokenizer, record: Record, max_length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(input_ids, labels)`` as int32 of a record's answered turns (`encode_record`), or None: nothing to learn."""
    encoded = encode_record(tokenizer, record, max_length) if record.answers else None
    return None if encoded is None else (encoded[0].to(torch.int32), encoded[1].to(torch.int32))


def _label_tokens(
    model, x: torch.Tensor, y: torch.Tensor, layers: list[int], top_k: int, autocast: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """One conversation's tensors (see the module docstring): the target's hidden states and top-k teacher."""
    device = model.device
    backbone = getattr(model, model.base_model_prefix)
    lm_head = model.get_output_embeddings()
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        out = backbone(input_ids=x[None].long().to(device), output_hidden_states=True, use_cache=False)
    final = out.hidden_states[model.config.num_hidden_layers][0]
    logits = lm_head(final.to(lm_head.weight.dtype)).float()
    top = logits.topk(top_k, dim=-1)
    top_logprobs = top.values - torch.logsumexp(logits, dim=-1, keepdim=True)
    parts = {
        "input_ids": x,
        "labels": y,
        "topk_ids": top.indices.to("cpu", torch.int32),
        "topk_logprobs": top_logprobs.to("cpu", torch.float16),
    }
    for i in layers:
        parts[f"hidden_{i}"] = out.hidden_states[i][0].to("cpu", torch.float16)
    return parts


def _progress_bar(progress: bool, total: int | None, initial: int):
    """A tqdm bar on stderr counting labelled tokens, or ``None`` without ``progress``."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="tok", unit_scale=True, desc="labelling", file=sys.stderr)


class _ShardBuffer:
    """The conversations labelled since the last shard; :meth:`flush` writes them as the next shard and rewrites
    the manifest."""

    def __init__(self, out_dir: Path, manifest: dict):
        self.out_dir, self.manifest = out_dir, manifest
        self.t_start, self.tokens_this_run = time.perf_counter(), 0
        self._clear()

    def _clear(self) -> None:
        self.tensors: dict[str, list[torch.Tensor]] = {}
        self.ids: list[str] = []
        self.records: list[int] = []
        self.tokens = 0

    def add(self, parts: dict[str, torch.Tensor], record_id: str, index: int) -> None:
        """Buffer one labelled conversation (``parts`` from :func:`_label_tokens`) of record ``index``."""
        for k, v in parts.items():
            self.tensors.setdefault(k, []).append(v)
        self.ids.append(record_id)
        self.records.append(index)
        self.tokens += len(parts["input_ids"])
        self.tokens_this_run += len(parts["input_ids"])

    def _write_shard(self) -> None:
        """Save the buffered conversations as the next shard and add it to the manifest (not yet written)."""
        from safetensors.torch import save_file

        manifest, out_dir = self.manifest, self.out_dir
        lengths = [len(x) for x in self.tensors["input_ids"]]
        tensors = {name: torch.cat(parts).contiguous() for name, parts in self.tensors.items()}
        tensors["offsets"] = torch.tensor([0] + lengths).cumsum(0)
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        with atomic_path(out_dir / name) as tmp:
            save_file(tensors, str(tmp), metadata={"ids": json.dumps(self.ids)})
        size = (out_dir / name).stat().st_size
        manifest["shards"].append(
            {
                "file": name,
                "tokens": self.tokens,
                "conversations": len(self.ids),
                "bytes": size,
                "records": self.records,
            }
        )
        manifest["total_tokens"] += self.tokens
        manifest["num_conversations"] += len(self.ids)
        manifest["bytes"] += size
        manifest["bytes_per_million_tokens"] = round(manifest["bytes"] / manifest["total_tokens"] * 1e6)

    def flush(self, next_record: int) -> None:
        """Write the buffer (if any) as a shard, then the manifest with ``next_record`` to resume from."""
        if self.ids:
            self._write_shard()
            elapsed = time.perf_counter() - self.t_start
            if self.tokens_this_run and elapsed > 0:
                self.manifest["tokens_per_second"] = round(self.tokens_this_run / elapsed, 1)
            self._clear()
        self.manifest["next_record"] = next_record
        _write_json_atomic(self.out_dir / "manifest.json", self.manifest)


@torch.no_grad()
def label_conversations(
    model,
    tokenizer,
    records: Sequence[Record],
    out_dir: str | Path,
    layers: Iterable[int] = DEFAULT_LAYERS,
    top_k: int = 20,
    max_tokens: int | None = None,
    max_length: int = 1024,
    shard_tokens: int = 65536,
    progress: bool = True,
    data: str = "",
    autocast: torch.dtype | None = None,
) -> dict:
    """Label ``records`` with the target ``model`` into shards under ``out_dir`` (module docstring); the manifest.

    Each record's answered turns (:meth:`Record.dialogue`) go through the chat template, cut at ``max_length``
    tokens; records without an answer or without an assistant token are skipped. Labelling stops once the
    shards hold ``max_tokens`` tokens (per process under ``torch.distributed``); a rerun with the same settings
    resumes where the last finished shard ended, so raising ``max_tokens`` adds to the data.

    ``autocast`` (e.g. ``torch.bfloat16`` on a CPU with bf16 support, about 2x faster): the decoder layers run
    under ``torch.autocast``; the ``lm_head`` and the log-softmax stay in float32. On SmolLM2-135M this kept
    99% top-1 agreement with the float32 target and a KL of 3e-4 nats per token.
    """
    rank, world = _dist_rank()
    out_dir = Path(out_dir)
    if world > 1:
        out_dir = out_dir / f"rank{rank}"
        max_tokens = None if max_tokens is None else -(-max_tokens // world)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = _resolve_layers(layers, model.config.num_hidden_layers)
    settings = _labelling_settings(model, layers, top_k, max_length, data, autocast, rank, world)
    manifest = _open_manifest(out_dir, settings)
    _say_resume(progress, manifest, len(records), max_tokens)

    bar = _progress_bar(progress, max_tokens, manifest["total_tokens"])
    buf = _ShardBuffer(out_dir, manifest)
    index = manifest["next_record"]
    try:
        for index in range(manifest["next_record"], len(records)):
            if max_tokens is not None and manifest["total_tokens"] + buf.tokens >= max_tokens:
                break
            if index % world != rank:
                continue
            encoded = _encode(tokenizer, records[index], max_length)
            if encoded is None:
                continue
            buf.add(_label_tokens(model, *encoded, layers, top_k, autocast), records[index].id, index)
            if bar is not None:
                bar.update(len(encoded[0]))
            if buf.tokens >= shard_tokens:
                buf.flush(index + 1)
        else:
            index = len(records)
        buf.flush(index)
    finally:
        if bar is not None:
            bar.close()
    return manifest


def _say_resume(progress: bool, manifest: dict, num_records: int, max_tokens: int | None) -> None:
    """On stderr (with ``progress``), what a rerun finds in its folder and what it does next (a killed run loses only
    the shard it was writing)."""
    if not (progress and manifest["total_tokens"]):
        return
    found = f"resuming: {manifest['total_tokens']:,} tokens in {len(manifest['shards'])} finished shards"
    if manifest["next_record"] >= num_records or (max_tokens is not None and manifest["total_tokens"] >= max_tokens):
        print(f"{found}; nothing left to label", file=sys.stderr)
    else:
        print(
            f"{found}; labelling again from record {manifest['next_record']:,} of {num_records:,} (a shard that was "
            "being written when the last run stopped is labelled again)",
            file=sys.stderr,
        )


@torch.no_grad()
def label_records(
    model,
    tokenizer,
    records: Sequence[Record],
    layers: Iterable[int] = DEFAULT_LAYERS,
    top_k: int = 20,
    max_tokens: int | None = None,
    max_length: int = 1024,
    autocast: torch.dtype | None = None,
) -> HiddenStates:
    """The labelling of `label_conversations` in memory, for data that fit in it: the same tensors per token (the
    target's top-k teacher, the hidden states ``layers`` in float16, labels on the answers), as the
    `HiddenStates` that `LabelledShards.to_hidden_states` reads back (``hidden``: the final post-norm state; the
    other layers in ``layers``). Stops before the record that would pass ``max_tokens`` tokens."""
    final = model.config.num_hidden_layers
    layers = _resolve_layers(layers, final)
    parts, offsets, ids = [], [0], []
    for record in records:
        encoded = _encode(tokenizer, record, max_length)
        if encoded is None:
            continue
        if max_tokens is not None and ids and offsets[-1] + len(encoded[0]) > max_tokens:
            break
        parts.append(_label_tokens(model, *encoded, sorted({*layers, final}), top_k, autocast))
        offsets.append(offsets[-1] + len(encoded[0]))
        ids.append(record.id)
    if not ids:
        raise ValueError("no record with an assistant answer to label")
    cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    extra = {i: cat[f"hidden_{i}"] for i in layers if i != final}
    return _labelled_states(cat, cat[f"hidden_{final}"], extra, offsets, ids)


def _labelled_states(cat: dict, hidden: torch.Tensor, layers: dict, offsets: list[int], ids: list[str]) -> HiddenStates:
    """The `HiddenStates` of labelled conversations: ``cat`` holds their tokens' ``input_ids``, ``labels`` and the
    teacher's ``topk_ids`` / ``topk_logprobs`` end to end; ``hidden`` and ``layers`` (none when empty) their states;
    ``offsets`` where each conversation starts, ``ids`` their ids."""
    return HiddenStates(
        hidden=hidden,
        input_ids=cat["input_ids"].long(),
        labels=cat["labels"].long(),
        offsets=torch.tensor(offsets),
        ids=ids,
        topk_ids=cat["topk_ids"],
        topk_logprobs=cat["topk_logprobs"],
        layers=layers or None,
    )


class LabelledShards:
    """Read what :func:`label_conversations` wrote (one folder, or its ``rank<r>`` sub-folders).

    Conversations are numbered in shard order (``0 .. num_conversations - 1``); tensors are read through
    safetensors' memory map, only for the conversations and layers asked for.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        manifests = (
            [self.folder / "manifest.json"]
            if (self.folder / "manifest.json").is_file()
            else sorted(self.folder.glob("rank*/manifest.json"), key=lambda p: int(p.parent.name[4:]))
        )
        if not manifests:
            raise FileNotFoundError(f"no manifest.json in {self.folder} (nor in rank*/)")
        self.manifests = [json.loads(p.read_text()) for p in manifests]
        self.manifest = self.manifests[0]
        self.shards: list[tuple[Path, dict]] = [
            (p.parent / s["file"], s) for p, m in zip(manifests, self.manifests) for s in m["shards"]
        ]
        self._first_conv = [0]
        for _, s in self.shards:
            self._first_conv.append(self._first_conv[-1] + s["conversations"])

    @property
    def num_tokens(self) -> int:
        return sum(s["tokens"] for _, s in self.shards)

    @property
    def num_conversations(self) -> int:
        return self._first_conv[-1]

    @property
    def layers(self) -> list[int]:
        return list(self.manifest["layers"])

    @property
    def top_k(self) -> int:
        return int(self.manifest["top_k"])

    @property
    def final_layer(self) -> int:
        """The index of the post-norm final state (``num_hidden_layers``)."""
        return int(self.manifest["num_hidden_layers"])

    def split(self, holdout: int) -> tuple[list[int], list[int]]:
        """(train, held-out) conversation indices: the last ``holdout`` conversations are held out."""
        n = self.num_conversations
        cut = max(0, n - holdout)
        return list(range(cut)), list(range(cut, n))

    def held_out_records(self) -> list[Record]:
        """The data source's held-out conversations, which were never labelled (for ``--data sharegpt``, the
        last :data:`~hf_speculative.training.data.SHAREGPT_HOLDOUT` of the file: tree calibration and tau)."""
        data = self.manifest.get("data") or ""
        if data != "sharegpt":
            raise ValueError(f"no held-out set known for data {data!r}")
        return load_records("sharegpt-heldout")

    def _plan_by_shard(self, wanted: Iterable[int]) -> list[tuple[int, list[int]]]:
        """Group the ``wanted`` conversations by shard, keeping their order: ``(shard, local indices)`` runs."""
        plan: list[tuple[int, list[int]]] = []
        for c in wanted:
            s = bisect.bisect_right(self._first_conv, c) - 1
            if not 0 <= s < len(self.shards):
                raise IndexError(f"conversation {c} out of range ({self.num_conversations})")
            if not plan or plan[-1][0] != s:
                plan.append((s, []))
            plan[-1][1].append(c - self._first_conv[s])
        return plan

    def _read_conversations(
        self, plan: list[tuple[int, list[int]]], names: dict, max_tokens: int | None
    ) -> tuple[dict, list[int], list[str]]:
        """Read the tensors ``names`` of the planned conversations, stopping before ``max_tokens`` is passed:
        ``(parts per key, offsets, conversation ids)``."""
        from safetensors import safe_open

        parts: dict = {k: [] for k in names}
        offsets, ids = [0], []
        total = 0
        done = False
        for s, local in plan:
            path, _ = self.shards[s]
            with safe_open(str(path), framework="pt") as f:
                shard_ids = json.loads(f.metadata()["ids"])
                off = f.get_tensor("offsets").tolist()
                spans = []
                for c in local:
                    n = off[c + 1] - off[c]
                    if max_tokens is not None and total + n > max_tokens:
                        done = True
                        break
                    total += n
                    spans.append((off[c], off[c + 1]))
                    offsets.append(offsets[-1] + n)
                    ids.append(shard_ids[c])
                for key, name in names.items():
                    sl = f.get_slice(name)
                    parts[key].extend(sl[a:b] for a, b in spans)
            if done:
                break
        return parts, offsets, ids

    def to_hidden_states(
        self,
        layer: int | None = None,
        extra_layers: Sequence[int] = (),
        max_tokens: int | None = None,
        conversations: Iterable[int] | None = None,
    ) -> HiddenStates:
        """The labelled conversations as :class:`HiddenStates`, with the teacher (``topk_ids``,
        ``topk_logprobs``).

        ``layer``: the ``output_hidden_states`` index in ``hidden`` (default: the final post-norm state);
        ``extra_layers`` go to ``HiddenStates.layers``; ``conversations``: indices to take (default all), in
        order; ``max_tokens``: stop before the conversation that would pass this many tokens.
        """
        layer = self.final_layer if layer is None else (self.final_layer if layer == -1 else layer)
        extra = [self.final_layer if i == -1 else i for i in extra_layers]
        for i in [layer, *extra]:
            if i not in self.layers:
                raise KeyError(f"layer {i} not labelled (have {self.layers})")
        wanted = range(self.num_conversations) if conversations is None else conversations
        names = {
            "hidden": f"hidden_{layer}",
            "input_ids": "input_ids",
            "labels": "labels",
            "topk_ids": "topk_ids",
            "topk_logprobs": "topk_logprobs",
            **{i: f"hidden_{i}" for i in extra},
        }
        parts, offsets, ids = self._read_conversations(self._plan_by_shard(wanted), names, max_tokens)
        if not ids:
            raise ValueError("no labelled conversation selected")
        # one key at a time, its pieces dropped once joined: the peak is the states plus one key, not twice them
        cat = {k: torch.cat(parts.pop(k)) for k in list(parts)}
        return _labelled_states(cat, cat["hidden"], {i: cat[i] for i in extra}, offsets, ids)
