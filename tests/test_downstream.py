"""`benchmarks/run_downstream.py train|eval|table` on a tiny random Llama and a few rows of each task's format written
here: the task loaders and splits, training of every arm (loss falls), resumable checkpoints and the time budget,
the eval JSON (every field; speculative output identical to the model's own plain greedy output), the table."""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from downstream import calibration_split, load_task
from downstream.cli import main
from downstream.tasks import wikisql_records

from hf_speculative.bench.tiny import tiny_chat_tokenizer, tiny_llama

ANSWERS = [
    "the cat sat on the mat .",
    "the dog sat on the mat .",
    "a big red cat is good .",
    "the small blue dog was bad .",
    "i run and jump in the world .",
    "you tell me a short story .",
]
EVAL_FIELDS = ("tau", "speedup", "lossless_rate", "metric", "extra_parameters", "n", "method", "task", "machine")


# ------------------------------------------------------------------------------------------- tiny task files


def _e2e(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n_mr in (("devset.csv", 6), ("testset_w_refs.csv", 3)):
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["mr", "ref"])
        for i in range(n_mr):
            for k in range(2):  # two references per meaning representation
                w.writerow([f"name[cat {i}], food[red]", ANSWERS[(i + k) % len(ANSWERS)]])
        (folder / name).write_text(buf.getvalue(), encoding="utf-8")
    return folder


def _wikisql(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows, results = [], []
    for q in range(24):
        table = f"1-{q % 8}"
        cols = ["Player", "Team"] if q % 2 else ["Player", "No."]
        rows.append(
            {
                "table_id": table,
                "question": f"what is the cat {q} ?",
                "question_id": q,
                "sql": {"sel": cols[0], "conds": [[cols[1], "=", str(q)]], "agg": ""},
            }
        )
        results.append(
            {
                "question_id": q,
                "table_id": table,
                "query": f'SELECT "{cols[0]}" FROM "{table}" WHERE "{cols[1]}" = \'{q}\';',
            }
        )
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "dev_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results), encoding="utf-8")
    return folder


def _dialogsum(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train = [
        repr(
            {
                "fname": f"train_{i}",
                "dialogue": f"#Person1#: hello world {i} ?\n#Person2#: yes .",
                "summary": ANSWERS[i % 6],
                "topic": "t",
            }
        )
        for i in range(8)
    ]
    test = [
        repr(
            {
                "fname": f"test_{i}",
                "dialogue": "#Person1#: tell me ?",
                "summary1": ANSWERS[i],
                "summary2": ANSWERS[i + 1],
                "summary3": ANSWERS[i + 2],
                "topic1": "t",
            }
        )
        for i in range(3)
    ]
    with zipfile.ZipFile(folder / "DialogSum_Data.zip", "w") as zf:
        zf.writestr("DialogSum_Data/dialogsum.train.jsonl", "\n".join(train) + "\n")
        zf.writestr("DialogSum_Data/dialogsum.test.jsonl", "\n".join(test) + "\n")
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny base model folder (model + chat tokenizer) and one data folder per task."""
    root = tmp_path_factory.mktemp("downstream")
    tok = tiny_chat_tokenizer()
    model = tiny_llama(tokenizer=tok, num_layers=4, hidden_size=32, seed=0)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return {
        "root": root,
        "base": str(root / "base"),
        "e2e_nlg": _e2e(root / "e2e"),
        "wikisql": _wikisql(root / "wikisql"),
        "dialogsum": _dialogsum(root / "dialogsum"),
    }


def _train(work, task, method, out, *extra):
    argv = [
        "train",
        "--task",
        task,
        "--method",
        method,
        "--data",
        str(work[task]),
        "--out",
        str(out),
        "--model",
        work["base"],
        "--batch-size",
        "4",
        "--lr",
        "3e-2",
        "--calibration-prompts",
        "1",
        "--num-msa-layers",
        "2",
        "--tree-nodes",
        "6",
        "--no-progress",
        *extra,
    ]
    assert main(argv) == 0
    return json.loads((Path(out) / "downstream.json").read_text())


@pytest.fixture(scope="module")
def trained(work):
    """Every arm trained on the tiny E2E rows (EAGLE on the LoRA folder's model)."""
    folders = {}
    for method in ("lora", "streaming", "medusa2", "eagle"):
        out = work["root"] / f"e2e-{method}"
        extra = ["--adapter", str(folders["lora"]), "--eagle-draft-vocab", "40"] if method == "eagle" else []
        _train(work, "e2e_nlg", method, out, "--max-steps", "30", *extra)
        folders[method] = out
    return folders


# ------------------------------------------------------------------------------------------- data


def test_task_loaders_and_fixed_splits(work):
    train = load_task("e2e_nlg", work["e2e_nlg"], "train")
    test = load_task("e2e_nlg", work["e2e_nlg"], "test")
    assert len(train) == 12 and all(len(r.answers) == 1 for r in train)  # one record per (MR, reference) pair
    assert len(test) == 3 and all(len(r.reference) == 2 for r in test)  # grouped by MR, every reference
    assert "name[cat 0], food[red]" in test[0].prompt

    wtrain, wtest = wikisql_records(work["wikisql"])
    train_tables = {r.answers[0].split('FROM "')[1].split('"')[0] for r in wtrain}
    test_tables = {r.reference[0].split('FROM "')[1].split('"')[0] for r in wtest}
    assert wtest and not train_tables & test_tables  # split by table: no test table is trained on
    assert len(wtrain) + len(wtest) == 24
    # the schema: the union of the columns the table's questions use, as a CREATE TABLE line
    assert (
        'CREATE TABLE "1-1" ("Player" TEXT, "Team" TEXT)'
        in next(r for r in wtrain + wtest if '"1-1"' in r.prompt).prompt
    )
    assert wikisql_records(work["wikisql"])[1][0].id == wtest[0].id  # fixed

    dtrain = load_task("dialogsum", work["dialogsum"], "train")
    dtest = load_task("dialogsum", work["dialogsum"], "test")
    assert len(dtrain) == 8 and dtrain[0].answers == [ANSWERS[0]]
    assert len(dtest) == 3 and dtest[0].reference == ANSWERS[0:3]

    kept, calib = calibration_split(train, 2)
    assert calib and {r.prompt for r in kept}.isdisjoint({r.prompt for r in calib})
    with pytest.raises(FileNotFoundError, match="devset.csv"):
        load_task("e2e_nlg", work["wikisql"], "train")
    with pytest.raises(ValueError, match="unknown task"):
        load_task("sqlctx", work["wikisql"], "train")


# ------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("method", ["lora", "streaming", "medusa2", "eagle"])
def test_training_loss_falls(trained, method):
    info = json.loads((trained[method] / "downstream.json").read_text())
    record = info["training"]
    assert info["task"] == "e2e_nlg" and info["method"] == method
    assert record["steps"] == 30
    # the losses each arm trains on (Medusa-2's total grows with its lambda_0 warm-up: its parts fall)
    keys = {
        "lora": ["loss"],
        "streaming": ["loss_main", "loss_stream1"],
        "medusa2": ["loss_lm_ce", "loss_medusa"],
        "eagle": ["loss"],
    }[method]
    for key in keys:
        assert record["last_logged"][key] < record["first_logged"][key] - 0.02, key
    assert not (trained[method] / "trainer_state").exists()  # the Trainer's scratch folder is gone
    files = {p.relative_to(trained[method]).as_posix() for p in trained[method].rglob("*") if p.is_file()}
    expected = {
        "lora": {"adapter/adapter_model.safetensors"},
        "streaming": {"model.safetensors", "lora/adapter_model.safetensors"},
        "medusa2": {"model.safetensors", "adapter/adapter_model.safetensors"},
        "eagle": {"model.safetensors"},
    }[method]
    assert expected | {"training_curve.png"} <= files  # the curve stays beside the weights
    if method == "eagle":  # the LoRA folder's adapter, named relative to the EAGLE folder (no copy)
        config = json.loads((trained["eagle"] / "config.json").read_text())
        assert config["draft_vocab_size"] == 40 and record["settings"]["eagle_draft_vocab"] == 40  # --eagle-draft-vocab
        adapter = config["base_adapter"]
        assert adapter == "../e2e-lora/adapter" and (trained["eagle"] / adapter / "adapter_model.safetensors").is_file()


def test_eagle_needs_a_lora_folder(work, trained, tmp_path):
    with pytest.raises(ValueError, match="lora"):
        _train(work, "e2e_nlg", "eagle", tmp_path / "x", "--max-steps", "1", "--adapter", str(trained["streaming"]))
    with pytest.raises(ValueError, match="--adapter"):
        _train(work, "e2e_nlg", "eagle", tmp_path / "y", "--max-steps", "1")


@pytest.mark.parametrize("task", ["wikisql", "dialogsum"])
def test_every_arm_trains_and_evaluates_on_the_other_tasks(work, task, tmp_path):
    """Each arm on WikiSQL and DialogSum: a few steps of training, then ``downstream eval`` with the task's metric,
    lossless against the folder's own plain decoding."""
    keys = {"wikisql": {"exact_match"}, "dialogsum": {"rougeL", "rouge1"}}[task]
    for method in ("lora", "streaming", "medusa2", "eagle"):
        extra = ["--adapter", str(tmp_path / "lora")] if method == "eagle" else []
        info = _train(work, task, method, tmp_path / method, "--max-steps", "2", *extra)
        assert info["task"] == task and info["method"] == method and info["training"]["steps"] == 2
        out = tmp_path / f"{method}.json"
        argv = [
            "eval",
            str(tmp_path / method),
            "--task",
            task,
            "--data",
            str(work[task]),
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--output",
            str(out),
            "--no-progress",
        ]
        assert main(argv) == 0
        result = json.loads(out.read_text())
        assert result["task"] == task and result["n"] == 2 and result["lossless_rate"] == 1.0, (method, result)
        assert set(result["metric"]) == keys


def test_keep_state_lets_a_finished_run_train_on(work, tmp_path, capsys):
    """``--keep-state`` keeps the checkpoints of a finished run: ``--resume`` with more steps goes on from the last one
    (the step count adds up); without it the checkpoints are removed at the end."""
    out = tmp_path / "lora"
    first = _train(work, "e2e_nlg", "lora", out, "--max-steps", "2", "--save-steps", "1", "--keep-state")
    assert first["training"]["steps"] == 2 and (out / "trainer_state" / "checkpoint-2").is_dir()
    capsys.readouterr()
    more = _train(work, "e2e_nlg", "lora", out, "--max-steps", "3", "--save-steps", "1", "--resume")
    assert f"resuming from {out / 'trainer_state' / 'checkpoint-2'}" in capsys.readouterr().err
    assert more["training"]["steps"] == 3 and more["training"]["settings"]["resume"]
    assert not (out / "trainer_state").exists()


def test_resume_restores_trainable_weights(work, tmp_path):
    """A checkpoint holds the trainable tensors only (streams and the base's LoRA); a run stopped at step 2 and
    resumed starts from exactly those weights and continues to the planned step."""
    from transformers import TrainerCallback

    from hf_speculative.bench.reference import resolve_model
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import LlamaForSpeculativeStreaming
    from hf_speculative.drafters.streaming.training_speculative_streaming import (
        tokenize_records,
        train_speculative_streaming,
    )
    from hf_speculative.training.trainer import DrafterTrainer

    records = load_task("e2e_nlg", work["e2e_nlg"], "train")
    seen = {}

    class Probe(TrainerCallback):
        def __init__(self, ss, stop_at=None):
            self.ss, self.stop_at = ss, stop_at

        def on_train_begin(self, args, state, control, **kwargs):
            seen["begin"] = [p.detach().clone() for p in DrafterTrainer.trainable_tensors(self.ss)]

        def on_step_end(self, args, state, control, **kwargs):
            seen[state.global_step] = [p.detach().clone() for p in DrafterTrainer.trainable_tensors(self.ss)]
            if state.global_step == self.stop_at:
                control.should_training_stop = True

    def run(seed, resume=False, stop_at=None):
        model, tok = resolve_model(work["base"])
        torch.manual_seed(seed)
        ss = LlamaForSpeculativeStreaming.from_base_model(
            model, num_streams=2, num_msa_layers=2, mode="shared", lora_rank=4
        )
        trainer = train_speculative_streaming(
            ss,
            tokenize_records(tok, records),
            str(tmp_path / "ckpt"),
            max_steps=4,
            batch_size=4,
            learning_rate=1e-2,
            save_steps=2,
            resume=resume,
            callbacks=[Probe(ss, stop_at)],
            progress=False,
        )
        return trainer.state.global_step

    assert run(0, stop_at=2) == 2
    assert (tmp_path / "ckpt" / "checkpoint-2" / "trainable.safetensors").is_file()
    stopped = seen[2]
    assert run(1, resume=True) == 4  # another seed: only the checkpoint can make the weights equal
    assert all(torch.equal(a, b) for a, b in zip(seen["begin"], stopped))
    assert not all(torch.equal(a, b) for a, b in zip(seen[4], stopped))


def test_time_budget_stops_training(work, tmp_path):
    info = _train(work, "e2e_nlg", "lora", tmp_path / "b", "--max-steps", "500", "--time-budget", "0.5")
    assert 1 <= info["training"]["steps"] < 500


# ------------------------------------------------------------------------------------------- eval and table


@pytest.mark.parametrize("method", ["lora", "streaming", "medusa2", "eagle"])
def test_eval_json_is_complete_and_lossless(work, trained, method, tmp_path):
    out = tmp_path / f"{method}.json"
    argv = [
        "eval",
        str(trained[method]),
        "--task",
        "e2e_nlg",
        "--data",
        str(work["e2e_nlg"]),
        "--limit",
        "3",
        "--max-new-tokens",
        "12",
        "--output",
        str(out),
        "--no-progress",
        "--write-card",
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert all(k in result for k in EVAL_FIELDS)
    assert result["n"] == 3 and result["method"] == method
    assert result["lossless_rate"] == 1.0  # every speculative output equals the fine-tuned model's own plain one
    assert result["tau"] >= 1.0 and result["speedup"] > 0
    assert set(result["metric"]) == {"rougeL", "rouge1"} and all(0.0 <= v <= 1.0 for v in result["metric"].values())
    assert (result["extra_parameters"] > 0) == (method != "lora")
    card = (trained[method] / "README.md").read_text()
    assert "E2E NLG" in card and f"| {result['tau']:.2f} |" in card and "run_downstream.py train" in card


@pytest.mark.parametrize("drafter", ["token-recycling", "hybrid", "suffix", "hybrid-suffix", "engine"])
def test_training_free_arm_on_the_lora_model(work, trained, drafter, tmp_path):
    """Arm (e): the LoRA folder's model with Token Recycling, SuffixDecoding warmed with the training targets, or
    prompt lookup merged with either into one tree, exact against that model's plain decoding; refused (all but the
    engine alone) on a folder with its own drafter, and with a card."""
    out = tmp_path / f"{drafter}.json"
    argv = [
        "eval",
        str(trained["lora"]),
        "--task",
        "e2e_nlg",
        "--data",
        str(work["e2e_nlg"]),
        "--limit",
        "3",
        "--max-new-tokens",
        "12",
        "--output",
        str(out),
        "--no-progress",
        "--drafter",
        drafter,
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["method"] == "lora" and result["drafter"].startswith(drafter.split("-")[0])
    assert result["lossless_rate"] == 1.0 and result["tau"] >= 1.0 and result["extra_parameters"] == 0
    if "suffix" in drafter:  # warmed with the training targets, then each evaluated output learned
        assert result["suffix_structure"]["outputs"] > 3 and sum(result["suffix_match_lengths"].values()) > 0
        assert result["warmed_with"] == "training references"
    if drafter == "engine":  # nothing drafted: one token per target forward
        assert result["tau"] == 1.0
    if drafter != "engine":  # the engine alone runs on every folder's model (test_compare_a_model_of_its_own_...)
        refused = "streaming" if drafter == "hybrid-suffix" else "medusa2"  # a trained drafter merges with suffix only
        with pytest.raises(ValueError, match="applies to a 'lora' folder"):
            main([*argv[:1], str(trained[refused]), *argv[2:]])
    with pytest.raises(SystemExit, match="--write-card"):
        main([*argv, "--write-card"])


@pytest.mark.parametrize("gate", ["", "-ungated"])
def test_a_trained_drafter_merged_with_suffix_decoding(work, trained, tmp_path, gate):
    """``--drafter hybrid-suffix`` on an EAGLE folder: its drafter and SuffixDecoding warmed with the training targets
    in one tree, exact against the fine-tuned model's plain decoding; the hybrid's gate counts the rows EAGLE drafted
    for (``-ungated``: every row)."""
    out = tmp_path / "eagle-suffix.json"
    argv = ["eval", str(trained["eagle"]), "--task", "e2e_nlg", "--data", str(work["e2e_nlg"]), "--limit", "3"]
    argv += ["--max-new-tokens", "12", "--output", str(out), "--no-progress", "--drafter", f"hybrid-suffix{gate}"]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    name = "hybrid (eagle-3 + suffix decoding" + (", ungated)" if gate else ")")
    assert result["method"] == "eagle" and result["drafter"] == name
    assert result["lossless_rate"] == 1.0 and result["tau"] >= 1.0 and result["extra_parameters"] > 0
    assert result["suffix_structure"]["outputs"] > 3
    drafted, skipped = result["hybrid_rows_drafted"], result["hybrid_rows_gated_out"]
    assert drafted["SuffixDrafter"] > 0 and skipped["SuffixDrafter"] == 0  # the free part drafts every row
    assert drafted["EagleTreeDrafter"] + skipped["EagleTreeDrafter"] == drafted["SuffixDrafter"]
    if gate:  # ungated
        assert skipped["EagleTreeDrafter"] == 0
    # what the gate weighed: EAGLE costs drafting time, SuffixDecoding none, on a named cost curve
    cost = result["hybrid_drafting_cost"]
    assert cost["EagleTreeDrafter"] > 0 and cost["SuffixDrafter"] == 0
    curve = result["hybrid_cost_curve"]
    assert curve["source"] in ("measured", "kernel table", "default") and curve["c(1)"] > 0
    assert curve["c(32)"] >= curve["c(1)"]


def test_streaming_arm_with_tree_pruning_and_a_learning_curve(work, trained, tmp_path):
    """The paper's downstream mode: shared-mode streams plus a trained pruning early exit, with the learning curve
    (expected tau) at shares of the time budget; decoding stays exact with pruning on, and pruning verifies fewer
    nodes per step than the same folder without it."""
    out = tmp_path / "pruned"
    info = _train(
        work,
        "e2e_nlg",
        "streaming",
        out,
        "--max-steps",
        "100000",
        "--time-budget",
        "3",
        "--curve-points",
        "3",
        "--pruning-layer",
        "1",
        "--pruning-threshold",
        "0.2",
        "--pruning-budget",
        "1",
    )
    training = info["training"]
    pruning = training["pruning"]
    assert pruning["layer"] == 1 and pruning["threshold"] == 0.2 and pruning["steps"] >= 1
    assert pruning["held_out_top1_after"] is not None
    curve = training["learning_curve"]
    seconds = [p["train_seconds"] for p in curve]
    assert curve[0]["step"] == 0 and seconds[0] == 0.0 and seconds == sorted(seconds) and 2 <= len(curve) <= 4
    assert curve[-1]["step"] == training["steps"] and seconds[-1] >= 3.0
    assert all(p["expected_tau_calibrated"] >= 1.0 for p in curve)
    config = json.loads((out / "config.json").read_text())
    assert config["pruning_layer"] == 1 and config["pruning_threshold"] == 0.2
    # the tiny model, a few seconds trained, predicts nearly uniformly: an answer that it happens to end at once has no
    # tree step to count; without an end-of-sequence token every answer runs its 12 tokens (plain decoding too)
    generation = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": None}))
    nodes = {}
    for threshold in ("0.9", "0"):
        result_path = tmp_path / f"pruned_{threshold}.json"
        argv = [
            "eval",
            str(out),
            "--task",
            "e2e_nlg",
            "--data",
            str(work["e2e_nlg"]),
            "--limit",
            "3",
            "--max-new-tokens",
            "12",
            "--output",
            str(result_path),
            "--no-progress",
            "--pruning-threshold",
            threshold,
        ]
        assert main(argv) == 0
        result = json.loads(result_path.read_text())
        assert result["lossless_rate"] == 1.0
        assert ("tree pruning" in result["drafter"]) == (threshold != "0")
        # the early exit's extraction and training count when it prunes
        assert (result["train_seconds"] > training["train_seconds"]) == (threshold != "0")
        nodes[threshold] = result["verified_nodes_per_step"]
    assert nodes["0.9"] < nodes["0"]
    with pytest.raises(ValueError, match="no pruning early exit"):  # a streaming folder trained without one
        main([*argv[:1], str(trained["streaming"]), *argv[2:]])


def test_prune_adds_tree_pruning_to_a_trained_streaming_folder(work, trained, tmp_path):
    """``downstream prune`` gives a trained streaming folder its early exit in place: with pruning off the folder
    decodes exactly as before (its recorded rows still reproduce), with pruning on it verifies fewer nodes, and
    both are lossless."""
    import shutil

    folder = tmp_path / "streaming"
    shutil.copytree(trained["streaming"], folder)

    def evaluate(path, *extra):
        out = tmp_path / f"{path.name}{'_'.join(extra)}.json"
        argv = [
            "eval",
            str(path),
            "--task",
            "e2e_nlg",
            "--data",
            str(work["e2e_nlg"]),
            "--limit",
            "3",
            "--max-new-tokens",
            "12",
            "--output",
            str(out),
            "--no-progress",
            *extra,
        ]
        assert main(argv) == 0
        return json.loads(out.read_text())

    before = evaluate(folder)
    assert (
        main(
            [
                "prune",
                str(folder),
                "--data",
                str(work["e2e_nlg"]),
                "--pruning-layer",
                "1",
                "--pruning-threshold",
                "0.9",
                "--pruning-budget",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    pruning = json.loads((folder / "downstream.json").read_text())["training"]["pruning"]
    assert pruning["layer"] == 1 and pruning["steps"] >= 1 and "run_downstream.py prune" in pruning["command"]
    assert not (folder / "trainer_state").exists()
    off, on = evaluate(folder, "--pruning-threshold", "0"), evaluate(folder)
    assert (
        off["tau"] == before["tau"]
        and off["target_forwards"] == before["target_forwards"]
        and off["drafter"] == before["drafter"]
    )
    assert on["lossless_rate"] == off["lossless_rate"] == 1.0
    assert (
        on["verified_nodes_per_step"] < off["verified_nodes_per_step"] and "tree pruning after layer 1" in on["drafter"]
    )
    with pytest.raises(ValueError, match="a 'streaming' folder"):
        main(["prune", str(trained["lora"]), "--data", str(work["e2e_nlg"]), "--pruning-layer", "1"])


def test_table_renders(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    base = {"lossless_rate": 1.0, "n": 50, "train_seconds": 120.0, "drafter": "x"}
    rows = [
        {
            "task": "wikisql",
            "method": "streaming",
            "tau": 3.1,
            "speedup": 2.2,
            "metric": {"exact_match": 0.5},
            "extra_parameters": 12000,
            **base,
        },
        {
            "task": "e2e_nlg",
            "method": "lora",
            "tau": 1.4,
            "speedup": 1.1,
            "metric": {"rougeL": 0.45, "rouge1": 0.6},
            "extra_parameters": 0,
            **base,
        },
    ]
    for i, r in enumerate(rows):
        (results / f"{i}.json").write_text(json.dumps(r))
    (results / "other.json").write_text(json.dumps({"not": "an eval"}))
    md, png = tmp_path / "table.md", tmp_path / "plot.png"
    assert main(["table", "--results", str(results), "--output", str(md), "--plot", str(png)]) == 0
    lines = md.read_text().splitlines()
    assert len(lines) == 4  # header, rule, two rows (the non-eval JSON skipped)
    assert lines[2].startswith("| E2E NLG | LoRA") and "1.10x" in lines[2] and "rougeL 45.0" in lines[2]
    assert (
        "| WikiSQL | Speculative Streaming" in lines[3]
        and "3.10" in lines[3]
        and "12.0K" in lines[3]
        and "2.0 min" in lines[3]
    )
    assert png.stat().st_size > 1000


def test_time_budget_counts_earlier_runs_and_bounds_warmup(tmp_path):
    from types import SimpleNamespace

    from transformers import TrainerControl

    from hf_speculative.training.callbacks import TimeBudgetCallback, budget_warmup_steps

    assert budget_warmup_steps(100_000, 0.05) == 5000
    assert budget_warmup_steps(100_000, 0.05, time_budget=60) == 100  # many planned epochs must not stall the rate
    assert budget_warmup_steps(10, 0.05, time_budget=60) == 1
    checkpoint = tmp_path / "checkpoint-7"
    checkpoint.mkdir()
    args, state = (
        SimpleNamespace(output_dir=str(tmp_path), save_strategy="steps"),
        SimpleNamespace(global_step=7, max_steps=100),
    )
    earlier = TimeBudgetCallback(100.0, spent=42.0)
    earlier.on_save(args, state, TrainerControl())
    assert 42.0 <= TimeBudgetCallback.spent_in(checkpoint) < 43.0
    resumed = TimeBudgetCallback(42.5, spent=TimeBudgetCallback.spent_in(checkpoint))
    control = TrainerControl()
    resumed.on_train_begin(args, state, control)
    resumed.on_step_end(args, state, control)
    assert not control.should_training_stop or resumed.elapsed() > 42.5
    resumed.spent = 50.0
    resumed.on_step_end(args, state, control)
    assert control.should_training_stop and control.should_save  # the budget ended: stop, with a checkpoint to resume


def test_running_clock_leaves_out_the_time_a_process_is_stopped(tmp_path):
    """A training run paused with SIGSTOP while something else is timed keeps its time budget: its clock does not
    count the stop."""
    import signal
    import subprocess
    import sys
    import time

    if not hasattr(signal, "SIGSTOP"):
        pytest.skip("no SIGSTOP on this platform")
    child = (
        "import sys, time\n"
        "from hf_speculative.training.callbacks import RunningClock\n"
        "clock = RunningClock(tick=0.05, gap=0.3)\n"
        "wall, running = time.monotonic(), clock()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "print(time.monotonic() - wall, clock() - running, flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
    wall, running = map(float, out.split())
    assert wall >= 1.5
    assert running < wall - 1.2  # the 1.5 s stop is left out (less the up-to-0.3 s a stop may go unseen)


# ------------------------------------------------------------------------------------------- self-distilled answers


def test_drawn_e2e_prompts_use_training_slots_and_never_a_held_out_prompt():
    from downstream.self_distilled import e2e_mr, synthetic_e2e_prompts

    from hf_speculative.training.data import E2E_INSTRUCTION, Record

    mrs = ["name[A], food[x], near[B]", "name[B], food[y]", "name[C], area[z], near[A]"]
    train = [Record(id=str(i), turns=[E2E_INSTRUCTION.format(mr=mr)], answers=["a"]) for i, mr in enumerate(mrs)]
    held = E2E_INSTRUCTION.format(mr="name[A], food[y], near[The Fox]")
    values = {"name": {"A", "B", "C"}, "food": {"x", "y"}, "near": {"A", "B"}, "area": {"z"}}
    shapes = [["name", "food", "near"], ["name", "food"], ["name", "area", "near"]]
    made_up = 0
    for share in (0.0, 0.5):
        drawn = synthetic_e2e_prompts(train, 40, seed=1, exclude={held}, new_names=share)
        assert drawn == synthetic_e2e_prompts(train, 40, seed=1, exclude={held}, new_names=share)  # seeded
        assert 0 < len(drawn) <= 40 and len({r.id for r in drawn}) == len(drawn)
        for r in drawn:
            assert r.turns[0] not in {held, *(t.turns[0] for t in train)}
            slots = [s.split("[") for s in e2e_mr(r.turns[0]).rstrip("]").split("], ")]
            assert [k for k, _ in slots] in shapes
            for k, v in slots:  # a training value, or (name slots, with a share) a made-up name never held out
                assert v in values[k] or (share and k in ("name", "near") and v not in ("The Fox", "y"))
                made_up += v not in values[k]
            assert dict(slots).get("near") != dict(slots)["name"]
    assert made_up > 0
    with pytest.raises(ValueError, match="E2E NLG prompt"):
        e2e_mr("Write a poem")


def test_eagle_trains_on_the_models_own_answers_and_resumes_them(work, trained, tmp_path):
    from downstream.self_distilled import unique_prompts

    out = tmp_path / "eagle-self"
    args = ("--max-steps", "2", "--adapter", str(trained["lora"]), "--answers", "self", "--synthetic-prompts", "3")
    info = _train(work, "e2e_nlg", "eagle", out, *args)
    assert info["training"]["answers"] == "self"
    rows = [json.loads(line) for line in (out / "self_distilled.jsonl").read_text().splitlines()]
    train, calib = calibration_split(load_task("e2e_nlg", work["e2e_nlg"], "train"), 1)
    own = {r.turns[0] for r in unique_prompts(train)}
    asked = [r["messages"][0]["content"] for r in rows]
    assert own <= set(asked) and len(asked) == len(set(asked)) <= len(own) + 3
    held = {r.turns[0] for r in calib} | {r.turns[0] for r in load_task("e2e_nlg", work["e2e_nlg"], "test")}
    assert not (set(asked) - own) & held
    assert 0 < info["training"]["training_prompts"] <= len(rows)
    before = (out / "self_distilled.jsonl").read_bytes()
    _train(work, "e2e_nlg", "eagle", out, *args, "--resume")  # the cached answers are read, none is asked again
    assert (out / "self_distilled.jsonl").read_bytes() == before
    with pytest.raises(ValueError, match="only methods eagle and medusa"):
        _train(work, "e2e_nlg", "lora", tmp_path / "x", "--max-steps", "1", "--answers", "self")
    with pytest.raises(ValueError, match="synthetic-prompts"):
        _train(work, "wikisql", "eagle", tmp_path / "y", "--adapter", str(trained["lora"]), "--synthetic-prompts", "2")


def test_eagle_folder_is_calibrated_on_its_calibration_prompts(work, trained):
    folder = trained["eagle"]
    cal = json.loads((folder / "downstream.json").read_text())["training"]["calibration"]
    acc = cal["step_top_i_accuracy"]
    assert len(acc) == 6 and all(len(row) == 4 and 0 <= min(row) and sum(row) <= 1.0001 for row in acc)
    assert cal["answers"] == "references" and cal["prompts"] >= 1 and cal["labelled_tokens"] > 0
    assert json.loads((folder / "config.json").read_text())["calibration"]["step_top_i_accuracy"] == acc
    assert main(["calibrate", str(folder), "--data", str(work["e2e_nlg"]), "--no-progress"]) == 0  # in place, again
    again = json.loads((folder / "downstream.json").read_text())["training"]["calibration"]
    assert again["step_top_i_accuracy"] == acc and "calibrate" in again["command"].split()
    with pytest.raises(ValueError, match="'eagle' folder"):
        main(["calibrate", str(trained["lora"]), "--data", str(work["e2e_nlg"]), "--no-progress"])


def test_medusa_heads_train_on_the_lora_models_labels_and_decode_exactly(work, trained, tmp_path):
    """Medusa-1 heads on the LoRA folder's model, distilled from the labels the EAGLE arm cached (labelled once for
    both): an FR-Spec draft vocabulary, a calibrated tree, the adapter named relative to the folder; ``compare``
    decodes them alone and merged with SuffixDecoding, every output identical to plain decoding."""
    from hf_speculative.paths import cache_root

    cached = sorted((cache_root() / "labelled").iterdir())
    out = tmp_path / "medusa"
    extra = ("--adapter", str(trained["lora"]), "--eagle-draft-vocab", "40", "--batch-size", "16")
    info = _train(work, "e2e_nlg", "medusa", out, "--max-steps", "40", *extra)  # logged every 20 steps
    assert sorted((cache_root() / "labelled").iterdir()) == cached  # the EAGLE arm's labels, read again
    record = info["training"]
    assert info["method"] == "medusa" and record["steps"] == 40 and record["labelled_tokens"] > 0
    assert record["last_logged"]["loss"] < record["first_logged"]["loss"] - 0.02
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 40 and len(config["calibration"]["head_top_i_accuracy"]) == 4
    assert (out / config["base_adapter"] / "adapter_model.safetensors").is_file()
    result = tmp_path / "compare.json"
    argv = ["compare", f"{trained['lora']}:suffix", str(out), f"{out}:hybrid-suffix", "--task", "e2e_nlg"]
    argv += ["--data", str(work["e2e_nlg"]), "--limit", "2", "--max-new-tokens", "8", "--no-progress"]
    assert main([*argv, "--output", str(result)]) == 0
    arms = json.loads(result.read_text())["arms"]
    assert [a["method"] for a in arms] == ["lora", "medusa", "medusa"]
    assert all(a["lossless_rate"] == 1.0 for a in arms) and "medusa heads + suffix" in arms[2]["drafter"]


def test_suffix_drafters_warmed_with_the_models_own_answers(work, trained, tmp_path):
    answers = tmp_path / "answers.jsonl"
    rows = [
        {"id": str(i), "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": a}]}
        for i, a in enumerate(ANSWERS[:4])
    ]
    answers.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "warm.json"
    argv = ["eval", str(trained["lora"]), "--task", "e2e_nlg", "--data", str(work["e2e_nlg"]), "--limit", "2"]
    argv += ["--max-new-tokens", "8", "--no-progress", "--output", str(out), "--drafter", "suffix"]
    assert main([*argv, "--warm-answers", str(answers)]) == 0
    result = json.loads(out.read_text())
    assert result["warmed_with"] == str(answers) and result["lossless_rate"] == 1.0
    assert result["suffix_structure"]["outputs"] == 4 + 1 + 2  # the four answers, the warm-up and the two outputs
    with pytest.raises(ValueError, match="warms a suffix drafter"):
        main([*argv[:-1], "prompt-lookup", "--warm-answers", str(answers)])


def test_compare_runs_every_arm_on_one_model_in_one_process(work, trained, tmp_path):
    """Plain decoding and each arm per prompt in one process: per-arm speedups over this run's plain tokens/s, the
    engine-alone ratio, exact outputs; arms on different models are refused."""
    out = tmp_path / "compare.json"
    lora, eagle = str(trained["lora"]), str(trained["eagle"])
    argv = ["compare", f"{lora}:engine", f"{lora}:suffix", eagle, f"{eagle}:hybrid-suffix"]
    argv += ["--task", "e2e_nlg", "--data", str(work["e2e_nlg"]), "--limit", "3", "--max-new-tokens", "8"]
    assert main([*argv, "--no-progress", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    arms = result["arms"]
    assert [a["method"] for a in arms] == ["lora", "lora", "eagle", "eagle"] and result["n"] == 3
    assert all(a["lossless_rate"] == 1.0 for a in arms)
    assert arms[0]["over_engine"] == 1.0 and arms[0]["drafter"] == "engine, nothing drafted"
    for a in arms:
        assert a["speedup"] == pytest.approx(a["tokens_per_s"] / result["plain_tokens_per_s"], rel=1e-3)
        assert a["over_engine"] == pytest.approx(a["tokens_per_s"] / arms[0]["tokens_per_s"], rel=1e-3)
    assert arms[2]["tau"] is not None and "suffix" in arms[3]["drafter"]
    assert "| plain `generate()` |" in out.with_suffix(".md").read_text() and result["peak_resident_bytes"] > 0
    with pytest.raises(ValueError, match="one fine-tuned model"):
        main(["compare", lora, str(trained["medusa2"]), *argv[5:]])
    with pytest.raises(ValueError, match="one fine-tuned model"):
        main(["compare", f"{trained['medusa2']}:engine", f"{trained['streaming']}:engine", *argv[5:]])


def test_compare_samples_the_first_prompts_or_spreads_them_over_the_test_set():
    """``--limit N`` takes the first N test prompts; with ``--spread`` N evenly spaced ones (a test file grouped by
    venue is sampled across its groups); a limit at or above the test set's size takes it all; ``--first N`` leaves
    out the first N."""
    from downstream.compare import sample_test_records

    records = list(range(630))
    assert sample_test_records(records, 30) == list(range(30))
    spread = sample_test_records(records, 30, spread=True)
    assert spread == list(range(0, 630, 21)) and len(set(spread)) == 30
    assert sample_test_records(records[:7], 3, spread=True) == [0, 2, 4]
    assert sample_test_records(records[:5], 9, spread=True) == records[:5] == sample_test_records(records[:5], None)
    # ``--first N`` leaves out the first N before either: prompts never among the first N
    assert sample_test_records(records, 3, first=30) == [30, 31, 32]
    assert sample_test_records(records, 60, spread=True, first=30) == list(range(30, 630, 10))


@pytest.mark.parametrize("method", ["medusa2", "streaming"])
def test_compare_a_model_of_its_own_beside_its_engine_alone(work, trained, method, tmp_path):
    """A medusa2 or streaming folder holds a model of its own: compare runs its drafter beside that model's one-token
    steps through the engine (``:engine``), both exact against its plain decoding."""
    out, folder = tmp_path / "compare.json", str(trained[method])
    argv = ["compare", f"{folder}:engine", folder, "--task", "e2e_nlg", "--data", str(work["e2e_nlg"])]
    assert main([*argv, "--limit", "2", "--max-new-tokens", "8", "--no-progress", "--output", str(out)]) == 0
    engine, own = json.loads(out.read_text())["arms"]
    assert (engine["method"], own["method"]) == (method, method)
    assert engine["drafter"] == "engine, nothing drafted" and engine["extra_parameters"] == 0
    assert engine["tau"] == 1.0 and own["extra_parameters"] > 0 and own["drafter"] != engine["drafter"]
    assert engine["lossless_rate"] == own["lossless_rate"] == 1.0
    assert engine["arm"].endswith(":engine") and own["over_engine"] == pytest.approx(
        own["tokens_per_s"] / engine["tokens_per_s"], rel=1e-3
    )
