"""The GPU kit (scripts/gpu/): its smoke run end to end on CPU, the packing plan's call sizes and command length,
and the GGUF parts and data reassembled as the machine does it."""

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import bundle  # noqa: E402
import kit  # noqa: E402
import pack  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("kit")
    rc = kit.main(["--smoke", "--work", str(root / "work"), "--out", str(root / "out")])
    return rc, root


def test_smoke_run_trains_benchmarks_and_writes_back(smoke):
    rc, root = smoke
    results = json.loads((root / "out" / "results.json").read_text())
    assert rc == 0, [s for s in results["steps"] if s.get("status") == "failed"]
    assert [s["step"] for s in results["steps"]] == ["setup", *(name for name, _ in kit.STEPS)]
    b1 = results["bench"]["bench-heldout-b1"]["methods"]
    assert {"plain", "hf-prompt-lookup", "hf-assisted", "tree-prompt-lookup", "token-recycling", "eagle3"} <= set(b1)
    assert "2" in results["bench"]["bench-heldout-b2"]["batches"]  # batch 8 on the GPU, 2 in the smoke run
    assert set(results["downstream"]) == {
        "medusa2-smollm2-135m-e2e-nlg-gpu",
        "speculative-streaming-smollm2-135m-e2e-nlg-gpu",
    }
    assert "# GPU kit run:" in (root / "out" / "results.md").read_text()


def test_smoke_run_returns_few_small_files_that_restore_the_drafters(smoke, tmp_path):
    _, root = smoke
    files = list((root / "out").iterdir())
    assert len(files) + 1 <= 8  # + log.txt, which the device command writes
    assert all(f.stat().st_size <= 15 * 2**20 for f in files)
    folders = bundle.read_bundle(root / "out", tmp_path)
    assert {f.name for f in folders} == {p.name for p in (root / "work" / "drafters").iterdir()}
    from hf_speculative.drafters.eagle import EagleDrafter

    eagle = EagleDrafter.from_pretrained(tmp_path / "eagle3-smollm2-135m-instruct-gpu")
    assert eagle.config.is_eagle3


def test_shards_hold_at_most_the_limit(tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "d" / "a").mkdir(parents=True)
    save_file({f"w{i}": torch.zeros(256, 1024) for i in range(6)}, str(tmp_path / "d" / "a" / "model.safetensors"))
    (tmp_path / "d" / "a" / "config.json").write_text("{}")
    files = bundle.write_bundle(tmp_path / "d", tmp_path / "o", max_shard_mib=1.1)
    shards = [f for f in files if f.suffix == ".safetensors"]
    assert len(shards) == 3 and all(f.stat().st_size <= 1.1 * 2**20 for f in shards)  # float32 travels as bfloat16
    bundle.read_bundle(tmp_path / "o", tmp_path / "r")
    assert (tmp_path / "r" / "a" / "config.json").is_file() and (tmp_path / "r" / "a" / "model.safetensors").is_file()


def test_dry_run_calls_fit_and_the_command_is_short(capsys):
    assert pack.main(["--dry-run"]) == 0
    text = capsys.readouterr().out
    sizes = [float(line.split("= ")[1].split(" MiB")[0]) for line in text.splitlines() if line.startswith("call ")]
    assert len(sizes) >= 2 and all(s < 60 for s in sizes)  # the 98 MB GGUF takes two calls at least
    assert len(pack.device_command(9)) <= 2000
    assert "--no-index" in pack.device_command(9) and "kit.py --minutes 9" in pack.device_command(9)


def test_packed_parts_reassemble_on_the_machine(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(bytes(range(256)) * 4000)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("e2e_nlg/devset.csv")
        info.size = 7
        tar.addfile(info, io.BytesIO(b"mr,ref\n"))
    calls = pack.plan_calls(gguf.stat().st_size, {"data.tar.gz": len(buf.getvalue())}, tree=59.0, minutes=9)
    assert len(calls) == 2  # half a MiB of room per call here
    pack.write_calls(calls, gguf, buf.getvalue(), [], root=tmp_path / "repo")
    carry = tmp_path / "repo" / pack.CARRY
    assert kit.reassemble_gguf(carry, tmp_path / "site").read_bytes() == gguf.read_bytes()
    kit.unpack_data(carry, tmp_path / "data")
    assert (tmp_path / "data" / "e2e_nlg" / "devset.csv").read_text() == "mr,ref\n"


def test_bench_methods_and_prompts_fit_the_slot():
    methods = [
        "plain",
        "eagle3",
        "hybrid:pl+tr+eagle3",
        "engine",
        "tree-prompt-lookup",
        "parallel",
        "token-recycling",
        "hybrid:pl+tr",
        "hf-prompt-lookup",
        "hf-assisted",
    ]
    for seconds in (10, 25, 40, 60, 90, 300):
        for batch in (None, 8):
            chosen, prompts = kit.plan_bench(seconds, methods, batch)
            assert chosen == methods[: len(chosen)] and len(chosen) >= 2 and prompts >= (batch or 1)
            gens = len(chosen) * prompts / (batch or 1)
            if len(chosen) > kit.BENCH_CORE_METHODS or prompts > (batch or 1):  # more than the least: it fits
                assert kit.BENCH_FIXED_S + gens * (kit.BENCH_BATCH_GEN_S if batch else kit.BENCH_GEN_S) <= seconds
    assert kit.plan_bench(25, methods) == (methods[:5], 1)  # the core on one prompt
    assert kit.plan_bench(300, methods) == (methods, kit.BENCH_MAX_PROMPTS)
    assert kit.plan_bench(300, methods[:8], 8)[1] == 8 * kit.BENCH_MAX_BATCHES


def test_each_step_gets_its_share_of_what_is_left(tmp_path):
    run = kit.Run(smoke=False, minutes=5, work=tmp_path, out=tmp_path)
    left = [200.0]
    run.left = lambda: left[0] + kit.WRITE_BACK_S
    todo = kit.parse_steps("bench-heldout,distill,label")
    assert todo == ["distill", "label", "bench-heldout"]  # the kit's order
    first = kit.slot_for(run, "distill", todo)
    assert first == pytest.approx(200 * kit.SHARES["distill"] / sum(kit.SHARES[n] for n in todo))
    left[0] -= first / 2  # distill ended early: the later steps share what it left
    assert kit.slot_for(run, "label", todo[1:]) > 200 * kit.SHARES["label"] / sum(kit.SHARES[n] for n in todo)
    with pytest.raises(SystemExit, match="unknown step"):
        kit.parse_steps("distill,bench")


def test_eval_skips_arms_whose_training_failed_or_wrote_no_folder(tmp_path, monkeypatch):
    run = kit.Run(smoke=False, minutes=5, work=tmp_path, out=tmp_path)
    run.steps = [{"step": "streaming", "status": "failed"}, {"step": "medusa2", "status": "ok"}]
    (run.drafters / kit.ARMS["streaming"]).mkdir(parents=True)
    (run.drafters / kit.ARMS["streaming"] / "downstream.json").write_text("{}")  # an older run's folder
    (run.drafters / kit.ARMS["medusa2"]).mkdir()  # stopped before its downstream.json
    monkeypatch.setattr(kit, "study", lambda *argv: pytest.fail(f"evaluated {argv}"))
    record = kit.evaluate_arms(run, 60.0)
    assert record["arms"] == [] and set(record["skipped"]) == set(kit.ARMS.values())
    assert (
        "failed" in record["skipped"][kit.ARMS["streaming"]]
        and "downstream.json" in record["skipped"][kit.ARMS["medusa2"]]
    )


def test_a_stopped_bench_keeps_what_it_wrote(tmp_path):
    run = kit.Run(smoke=True, minutes=5, work=tmp_path, out=tmp_path)
    (tmp_path / "bench-heldout-b1.json").write_text(
        json.dumps({"setting": {"partial": True, "n_prompts": 1}, "methods": {}})
    )
    (tmp_path / "bench-mt_bench-b1.json").write_text('{"setting": {"par')  # stopped while writing
    kit._keep_bench(run, tmp_path / "bench-heldout-b1.json")
    kit._keep_bench(run, tmp_path / "bench-mt_bench-b1.json")
    assert list(run.results["bench"]) == ["bench-heldout-b1"]
    from report import markdown

    text = markdown(
        {
            "machine": {"device": "d", "date": "t", "torch": "x", "transformers": "y"},
            "minutes": 5,
            "smoke": True,
            "dtype": "bfloat16",
            "steps": [],
            **run.results,
        }
    )
    assert "partial: the first 1 prompts" in text


def test_a_short_rerun_names_its_steps():
    command = pack.device_command(4.5, "distill,label,eagle3,streaming,medusa2,bench-heldout")
    assert "kit.py --minutes 4.5 --steps distill,label,eagle3,streaming,medusa2,bench-heldout --carry" in command
    assert len(command) <= 2000


def test_gpu_steps_size_their_commands_to_the_slot(tmp_path, monkeypatch):
    """The GPU run's command lines (captured, nothing runs): budgets inside the slot, the bench sized to it."""
    calls = []

    def capture(*argv):
        calls.append([str(a) for a in argv])
        out = argv[argv.index("--output") + 1] if "--output" in argv else argv[argv.index("--out") + 1]
        Path(out).write_text(json.dumps({"setting": {}, "methods": {}}) if "bench" in argv else "{}\n")

    monkeypatch.setattr(kit, "cli", capture)
    monkeypatch.setattr(kit, "study", capture)
    run = kit.Run(smoke=False, minutes=5, work=tmp_path, out=tmp_path)
    run.drafters.mkdir(parents=True)

    def value(flag):
        return float(calls[-1][calls[-1].index(flag) + 1])

    kit.distill(run, 60.0)
    assert value("--time-budget") <= 60 - kit.DISTILL_LOAD_S and value("--max-new-tokens") == kit.DISTILL_NEW_TOKENS
    kit.label(run, 16.0)
    assert value("--max-tokens") <= kit.LABEL_TOKENS_PER_S * 16
    for step, fn in [
        ("eagle3", kit.train_eagle3),
        ("streaming", lambda r, s: kit.train_downstream(r, s, "streaming")),
        ("medusa2", lambda r, s: kit.train_downstream(r, s, "medusa2")),
        ("parallel", kit.train_parallel),
    ]:
        fn(run, 40.0)
        assert value("--time-budget") + kit.OVERHEAD_S[step] <= 40
        if step in kit.ARMS:
            assert value("--calibration-prompts") == kit.DOWNSTREAM_CALIBRATION_PROMPTS
    kit.bench(run, 30.0, "heldout")
    line = calls[-1]
    assert value("--limit") >= 1 and value("--max-new-tokens") == kit.BENCH_NEW_TOKENS and "--no-numerics-floor" in line
    assert line[line.index("--methods") + 1].split(",")[0] == "plain" and "bench-heldout-b1" in run.results["bench"]
