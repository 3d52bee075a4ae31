"""Drafter folders to a few files and back: what comes back from the GPU machine is at most 8 files of 16 MiB.

``write_bundle`` puts every tensor of every ``*.safetensors`` under a folder of drafter folders into safetensors
shards of at most ``max_shard_mib`` (keys ``<relative file path>::<tensor name>``, float32 stored as bfloat16) and
every other small file (configs, cards, JSON records) into one ``drafters.tar.gz``. ``read_bundle`` restores the
folders: ``python scripts/gpu/bundle.py restore FILES_DIR OUT_DIR``.
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SEP = "::"
SKIP_DIRS = ("trainer_state", "checkpoint-")


def _wanted(path: Path, root: Path) -> bool:
    """Files worth bringing back: not trainer checkpoints."""
    return path.is_file() and not any(part.startswith(SKIP_DIRS) for part in path.relative_to(root).parts)


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors file under ``root``, keyed by file and name; float32 as bfloat16."""
    out = {}
    for path in sorted(p for p in root.rglob("*.safetensors") if _wanted(p, root)):
        rel = path.relative_to(root).as_posix()
        for name, t in load_file(str(path)).items():
            out[f"{rel}{SEP}{name}"] = t.to(torch.bfloat16) if t.dtype == torch.float32 else t
    return out


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive groups of tensors, each at most ``max_bytes`` (a larger single tensor raises)."""
    shards, current, size = [], {}, 0
    for key, t in tensors.items():
        n = t.numel() * t.element_size()
        if n > max_bytes:
            raise ValueError(f"{key} alone is {n / 2**20:.1f} MiB, over the shard size")
        if current and size + n > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key], size = t.contiguous(), size + n
    return shards + ([current] if current else [])


def write_bundle(root: Path, out: Path, max_shard_mib: float = 15.0, max_files: int = 5) -> list[Path]:
    """Bundle the drafter folders under ``root`` into ``out``; returns the files written (at most ``max_files``)."""
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # a shard's header and alignment take a little beyond its tensors
    shards = _shards(_tensors(root), int(max_shard_mib * 2**20) - 2**16)
    if len(shards) + 1 > max_files:
        raise ValueError(f"{len(shards)} shards and the archive exceed {max_files} files")
    written = []
    for i, shard in enumerate(shards):
        written.append(out / f"drafters-{i + 1:02d}-of-{len(shards):02d}.safetensors")
        save_file(shard, str(written[-1]), metadata={"format": "pt"})
    written.append(out / "drafters.tar.gz")
    with tarfile.open(written[-1], "w:gz") as tar:
        for path in sorted(p for p in root.rglob("*") if _wanted(p, root) and p.suffix != ".safetensors"):
            tar.add(path, arcname=path.relative_to(root).as_posix())
    return written


def read_bundle(files: Path, out: Path) -> list[Path]:
    """Restore the drafter folders from ``files`` (a folder holding what `write_bundle` wrote) into ``out``."""
    files, out = Path(files), Path(out)
    with tarfile.open(files / "drafters.tar.gz") as tar:
        tar.extractall(out, filter="data")
    by_file: dict[str, dict[str, torch.Tensor]] = {}
    for shard in sorted(files.glob("drafters-*.safetensors")):
        for key, t in load_file(str(shard)).items():
            rel, _, name = key.partition(SEP)
            by_file.setdefault(rel, {})[name] = t
    for rel, tensors in by_file.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / rel), metadata={"format": "pt"})
    return sorted({out / Path(rel).parts[0] for rel in by_file} | {p for p in out.iterdir() if p.is_dir()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["restore"])
    parser.add_argument("files", help="the folder holding the returned files")
    parser.add_argument("out", help="where the drafter folders are restored")
    args = parser.parse_args()
    for folder in read_bundle(Path(args.files), Path(args.out)):
        print(folder)


if __name__ == "__main__":
    main()
