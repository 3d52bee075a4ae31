"""What runs inside `generate()` (and the caches it reads) degrades safely under faults: every cache and result file is
written through a unique temporary file and ``os.replace`` (a writer killed before the rename leaves the old file);
a truncated or damaged cache file (cost curve, kernel table, cached hidden states, labelling manifest) is ignored
with one warning and the default or a recomputation stands in; a damaged or out-of-range drafter folder
(SuffixDecoding, Token Recycling) loaded with ``from_pretrained`` raises an error naming the file; a Hub id of a
SuffixDecoding drafter is loaded or refused, never silently empty; the suffix memory publishes each change as one
snapshot, and tenants keep their outputs apart. Tiny models and data, no network."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading

import numpy as np
import pytest
import torch
from conftest import tiny_chat_model, tiny_model

import hf_speculative as hfs
from hf_speculative import perf_model
from hf_speculative.drafters.suffix import suffix_index
from hf_speculative.drafters.suffix.suffix_index import SuffixIndex, suffix_array
from hf_speculative.paths import atomic_path, write_atomically
from hf_speculative.perf_model import CostCurve, cost_curve_path, get_cost_curve, set_cost_curve
from hf_speculative.perf_model.cost_curve import read_cost_curve

CURVE = CostCurve((1, 2, 4, 8), (1.0, 1.1, 1.3, 1.7), meta={"source": "test"})


class Killed(Exception):
    """A writer stopped between writing its temporary file and moving it into place."""


def _killed(*args, **kwargs):
    raise Killed


@contextlib.contextmanager
def killed_before_rename():
    """Inside it every ``os.replace`` raises: what a writer leaves behind is what a run killed right before it
    published its file leaves."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "replace", _killed)
        yield


def _temporaries(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*.tmp"))


def _truncations(data: bytes) -> list[bytes]:
    """Prefixes of ``data``: empty, a few bytes, half, all but the last few bytes."""
    return [data[:n] for n in sorted({0, 1, 7, len(data) // 3, len(data) // 2, len(data) - 9, len(data) - 3})]


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# ----------------------------------------------------------------------------- 1. atomic writes


def test_write_atomically_replaces_whole_and_leaves_nothing_when_killed(tmp_path):
    path = tmp_path / "sub" / "table.json"
    write_atomically(path, '{"a": 1}')
    write_atomically(path, b'{"a": 2}')
    assert path.read_text() == '{"a": 2}' and not _temporaries(tmp_path)
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # what open(path, "w") gives, not mkstemp's 0o600
    with killed_before_rename():
        with pytest.raises(Killed):
            write_atomically(path, '{"a": 3}')
    assert path.read_text() == '{"a": 2}' and not _temporaries(tmp_path)
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half a fil")
            raise RuntimeError("the writer failed")
    assert path.read_text() == '{"a": 2}' and not _temporaries(tmp_path)
    with atomic_path(path) as one, atomic_path(path) as two:  # two writers at once: two temporaries
        assert one != two and one.parent == two.parent == path.parent
        one.write_text("1")
        two.write_text("2")
    assert path.read_text() in ("1", "2") and not _temporaries(tmp_path)


def test_cost_curve_save_is_atomic(tmp_path):
    path = tmp_path / "curve.json"
    CURVE.save(path)
    before = path.read_bytes()
    with killed_before_rename(), pytest.raises(Killed):
        CostCurve((1, 2), (1.0, 2.0)).save(path)
    assert path.read_bytes() == before and CostCurve.load(path) == CURVE
    assert not _temporaries(tmp_path) and not (tmp_path / "curve.tmp").exists()


def _trained_recycling():
    model = hfs.enable(tiny_model("llama", seed=2))
    drafter = hfs.TokenRecyclingDrafter(num_successors=4, cost_curve=lambda n: 1.0)
    model.generate(torch.tensor([[5, 17, 33, 2, 9, 41, 7, 12]]), assistant_model=drafter, max_new_tokens=12)
    return drafter


def _warmed_suffix(**kwargs):
    return hfs.SuffixDrafter(cost_curve=lambda n: 1.0, vocab_size=96, **kwargs).warm([[1, 2, 3, 4], [2, 3, 5]])


@pytest.mark.parametrize("make", [_warmed_suffix, _trained_recycling], ids=["suffix", "token-recycling"])
def test_drafter_folders_are_written_atomically(make, tmp_path):
    drafter = make()
    drafter.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) in ({"config.json", "suffix_index.safetensors"}, {"config.json", "model.safetensors"})
    if isinstance(drafter, hfs.SuffixDrafter):
        drafter.warm([[7, 8, 9]])
    with killed_before_rename(), pytest.raises(Killed):
        drafter.save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing half-written, no temporary
    type(drafter).from_pretrained(tmp_path)


def test_hidden_state_cache_is_written_atomically_and_a_damaged_file_is_computed_again(tmp_path, caplog):
    from hf_speculative.training.data import Record
    from hf_speculative.training.trainer import cached_states

    _, tok = tiny_chat_model(num_layers=1)
    records = [Record(id="a", turns=["the cat sat"], answers=["on the mat and the dog"])]
    calls = []

    def compute(x):
        calls.append(len(x))
        return torch.arange(len(x) * 4, dtype=torch.float32).reshape(len(x), 4)

    first = cached_states(records, tok, tmp_path, compute, progress=False)
    (file,) = tmp_path.glob("*.safetensors")
    assert not _temporaries(tmp_path) and len(calls) == 1
    again = cached_states(records, tok, tmp_path, compute, progress=False)  # negative control: read, not computed
    assert len(calls) == 1 and torch.equal(again.hidden, first.hidden)
    valid = file.read_bytes()
    for n, data in enumerate(_truncations(valid)):
        file.write_bytes(data)
        with caplog.at_level(logging.WARNING, logger="hf_speculative"):
            read = cached_states(records, tok, tmp_path, compute, progress=False)
        assert len(calls) == 2 + n and torch.equal(read.hidden, first.hidden)
        assert file.read_bytes() == valid  # written again, whole
    assert _warnings(caplog, str(file)) and all("computed again" in m for m in _warnings(caplog, str(file)))


def test_labelled_shards_are_written_atomically_and_a_damaged_manifest_is_labelled_again(tmp_path, caplog):
    from hf_speculative.training.data import Record
    from hf_speculative.training.labelling import LabelledShards, label_conversations

    model, tok = tiny_chat_model(num_layers=1)
    records = [Record(id=f"r{i}", turns=["the cat sat"], answers=[f"on the mat {i} and the dog"]) for i in range(3)]
    with killed_before_rename(), pytest.raises(Killed):
        label_conversations(model, tok, records, tmp_path / "killed", top_k=2, progress=False)
    assert not list((tmp_path / "killed").iterdir())  # no shard, no manifest, no temporary
    whole = label_conversations(model, tok, records, tmp_path / "run", top_k=2, progress=False)
    assert not _temporaries(tmp_path) and whole["num_conversations"] == 3
    manifest = tmp_path / "run" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    with caplog.at_level(logging.WARNING, logger="hf_speculative"):
        again = label_conversations(model, tok, records, tmp_path / "run", top_k=2, progress=False)
    assert _warnings(caplog, str(manifest)) and again["num_conversations"] == 3
    assert LabelledShards(tmp_path / "run").to_hidden_states().ids == ["r0", "r1", "r2"]


# ----------------------------------------------------------------------------- 2. damaged cache files degrade


def test_a_damaged_cost_curve_warns_once_and_the_default_stands_in(tmp_path, monkeypatch, caplog):
    from hf_speculative.drafters.cost_aware import target_cost_curve

    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    model = tiny_model("llama", seed=31)
    path = cost_curve_path(model)
    CURVE.save(path)
    set_cost_curve(model, None)
    assert get_cost_curve(model, measure_if_missing=False) == CURVE  # negative control: the valid file is used
    assert target_cost_curve(model) == CURVE
    valid = path.read_bytes()
    counts = []
    for data in [*_truncations(valid), b"[1, 2]", b'{"nodes": [1], "ratios": "x"}', b"\xff\xfe", b"[" * 100_000]:
        path.write_bytes(data)
        set_cost_curve(model, None)  # forget what was read
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_speculative"):
            assert get_cost_curve(model, measure_if_missing=False) is None
            assert get_cost_curve(model, measure_if_missing=False) is None
            assert target_cost_curve(model).meta == {"source": "default"}
        counts.append(len(_warnings(caplog, f"damaged cost curve {path}")))
    assert counts[0] == 1 and max(counts) == 1  # once per file and damage (the same damage again: no repeat)
    # with measuring allowed, a damaged file is measured again and replaced whole
    monkeypatch.setattr(perf_model.cost_curve, "measure_cost_curve", lambda m, **kw: CURVE)
    set_cost_curve(model, None)
    assert get_cost_curve(model) == CURVE and read_cost_curve(path) == CURVE


def test_every_truncation_of_a_cost_curve_is_read_or_ignored(tmp_path):
    path = tmp_path / "curve.json"
    CURVE.save(path)
    valid = path.read_bytes()
    assert read_cost_curve(path) == CURVE
    for n in range(len(valid)):
        path.write_bytes(valid[:n])
        assert read_cost_curve(path) in (None, CURVE)  # never raises; all but the last newline is still the curve
    assert read_cost_curve(tmp_path / "missing.json") is None


def test_a_truncated_kernel_table_is_ignored(tmp_path):
    """`read_kernel_table` returns None for every truncation of a valid table, deeply nested JSON included (the policy
    then measures or takes the default table), with a warning naming the file."""
    from hf_speculative.engine.kernels import KernelTable, read_kernel_table

    kernels = {"torch": object(), "direct": object()}
    table = KernelTable({1: "direct", 8: "direct", 64: "torch"}, {"direct": {1: 0.5, 8: 0.9}}, {"cpu": "test"})
    path = tmp_path / "table.json"
    write_atomically(path, json.dumps(table.to_dict(), indent=1) + "\n")
    assert read_kernel_table(path, kernels) == table  # negative control
    valid = path.read_bytes()
    for n in range(len(valid)):
        path.write_bytes(valid[:n])
        assert read_kernel_table(path, kernels) in (None, table)
    for damaged in (b"\xff\xfe", b"null", b"[1]", b'{"choice": []}', b'{"choice": {"x": "torch"}}'):
        path.write_bytes(damaged)
        assert read_kernel_table(path, kernels) is None
    path.write_bytes(b'{"choice": {"1": "direct"}}')
    assert read_kernel_table(path, {"torch": object()}) is None  # a kernel this process cannot run
    path.write_bytes(b"[" * 100_000)  # deeper than the JSON parser's recursion
    assert read_kernel_table(path, kernels) is None


@pytest.mark.parametrize("make", [_warmed_suffix, _trained_recycling], ids=["suffix", "token-recycling"])
def test_a_damaged_drafter_folder_is_refused_naming_the_file(make, tmp_path):
    drafter = make()
    drafter.save_pretrained(tmp_path)
    loaded = type(drafter).from_pretrained(tmp_path)  # negative control: the valid folder loads
    if isinstance(drafter, hfs.SuffixDrafter):
        weights = tmp_path / "suffix_index.safetensors"
        assert np.array_equal(loaded.index.codes, drafter.index.codes) and len(loaded.index) == 2
    else:
        weights = tmp_path / "model.safetensors"
        assert torch.equal(loaded.adjacency, drafter.adjacency) and loaded.filled_rows > 0
    valid = weights.read_bytes()
    for data in _truncations(valid):
        weights.write_bytes(data)
        with pytest.raises(ValueError, match=f"{re.escape(str(weights))}.*damaged"):
            type(drafter).from_pretrained(tmp_path)
    weights.write_bytes(valid)
    config = tmp_path / "config.json"
    config.write_bytes(config.read_bytes()[:20])
    with pytest.raises((ValueError, OSError), match="config.json"):
        type(drafter).from_pretrained(tmp_path)


# ----------------------------------------------------------------------------- 3. loaded arrays are range-checked


def _rewrite(file, **changes):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(file))
    tensors.update(changes)
    save_file(tensors, str(file))


def test_token_recycling_ids_out_of_range_are_refused(tmp_path):
    drafter = _trained_recycling()
    drafter.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    adjacency = drafter.adjacency.to(torch.int32)
    vocab = adjacency.shape[0]
    for bad in (vocab, vocab + 1000, -2):
        planted = adjacency.clone()
        planted[5, 1] = bad
        _rewrite(file, adjacency=planted)
        with pytest.raises(
            ValueError, match=rf"{re.escape(str(file))}: token id {bad} \(row 5, column 1\).*\[0, {vocab}\)"
        ):
            hfs.TokenRecyclingDrafter.from_pretrained(tmp_path)
    _rewrite(file, adjacency=adjacency[:, :3].contiguous())  # fewer columns than its config's num_successors
    with pytest.raises(ValueError, match="num_successors=4"):
        hfs.TokenRecyclingDrafter.from_pretrained(tmp_path)
    _rewrite(file, adjacency=adjacency[:50].contiguous())  # fewer rows than its config's vocab_size
    with pytest.raises(ValueError, match=f"vocab_size={vocab}"):
        hfs.TokenRecyclingDrafter.from_pretrained(tmp_path)
    _rewrite(file, adjacency=adjacency.float())
    with pytest.raises(ValueError, match="not 2-D ids"):
        hfs.TokenRecyclingDrafter.from_pretrained(tmp_path)
    _rewrite(file, adjacency=adjacency)  # negative control: -1 (empty) entries and in-range ids load
    loaded = hfs.TokenRecyclingDrafter.from_pretrained(tmp_path, num_successors=6)
    assert loaded.adjacency.shape == (vocab, 6) and bool((loaded.adjacency[:, 4:] == -1).all())
    assert torch.equal(loaded.adjacency[:, :4], drafter.adjacency)


def test_suffix_ids_out_of_range_are_refused(tmp_path):
    drafter = _warmed_suffix()
    drafter.save_pretrained(tmp_path)
    file = tmp_path / "suffix_index.safetensors"
    codes = torch.from_numpy(drafter.index.state()["codes"])
    for bad_code, bad_token in ((97, 96), (5000, 4999), (-3, -4)):
        planted = codes.clone()
        planted[1] = bad_code  # codes are token + 1
        _rewrite(file, codes=planted)
        with pytest.raises(ValueError, match=rf"{re.escape(str(file))}: token id {bad_token} is outside \[0, 96\)"):
            hfs.SuffixDrafter.from_pretrained(tmp_path)
    planted = codes.clone()
    planted[2] = 0  # a separator inside an output
    _rewrite(file, codes=planted)
    with pytest.raises(ValueError, match=f"{re.escape(str(file))}: .*separators"):
        hfs.SuffixDrafter.from_pretrained(tmp_path)
    suffixes = torch.from_numpy(drafter.index.state()["suffixes"])
    _rewrite(file, codes=codes, suffixes=torch.full_like(suffixes, 10_000))
    with pytest.raises(ValueError, match=f"{re.escape(str(file))}: .*permutation"):
        hfs.SuffixDrafter.from_pretrained(tmp_path)
    _rewrite(file, suffixes=suffixes)
    assert len(hfs.SuffixDrafter.from_pretrained(tmp_path).index) == 2  # negative control


# ----------------------------------------------------------------------------- 4. SuffixDrafter from a Hub id


def test_suffix_drafter_from_a_hub_id_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="no-such-user/no-such-suffix-drafter.*offline mode"):
        hfs.SuffixDrafter.from_pretrained("no-such-user/no-such-suffix-drafter")


def test_suffix_drafter_from_a_hub_id_without_network_is_a_clear_error(no_network):
    with pytest.raises(FileNotFoundError, match="no-such-user/no-such-suffix-drafter.*cannot be reached"):
        hfs.SuffixDrafter.from_pretrained("no-such-user/no-such-suffix-drafter")


def test_suffix_drafter_from_a_hub_id_loads_its_files(tmp_path, monkeypatch):
    """A Hub id goes through huggingface_hub's download (here answered from a local folder), never an empty memory."""
    import huggingface_hub

    import hf_speculative.hub

    _warmed_suffix().save_pretrained(tmp_path / "snapshot")
    asked = {}

    def snapshot_download(repo_id, **kwargs):
        asked.update(kwargs, repo_id=repo_id)
        return str(tmp_path / "snapshot")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_speculative.hub, "_cached_snapshot", lambda repo_id, repo_type: "cached")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    loaded = hfs.SuffixDrafter.from_pretrained("some-user/some-suffix-drafter", revision="v1")
    assert len(loaded.index) == 2 and asked["repo_id"] == "some-user/some-suffix-drafter"
    assert asked["revision"] == "v1" and asked["local_files_only"] is True
    assert set(asked["allow_patterns"]) == {"config.json", "suffix_index.safetensors"}
    (tmp_path / "snapshot" / "suffix_index.safetensors").unlink()  # a repo without the memory: an error, not empty
    with pytest.raises(FileNotFoundError, match="suffix_index.safetensors"):
        hfs.SuffixDrafter.from_pretrained("some-user/some-suffix-drafter")


# ----------------------------------------------------------------------------- 5a. one snapshot per lookup


def _one_state(codes: np.ndarray, suffixes: np.ndarray) -> bool:
    """Whether a suffix array belongs to a buffer: it holds exactly the buffer's token positions."""
    return np.array_equal(np.sort(np.asarray(suffixes, np.int64)), np.flatnonzero(np.asarray(codes) != 0))


class _TwoStepIndex:
    """The negative control: how the index published a change before, the new buffer and the new suffix array in two
    assignments, with the same point between them (the suffix array being computed) where the test runs a reader."""

    def __init__(self, key_length: int = 8):
        self.key_length, self.buffer, self.suffixes = key_length, b"", np.empty(0, np.int32)

    def add(self, outputs, sort=suffix_array):
        encoded = np.concatenate([np.append(np.asarray(o) + 1, 0) for o in outputs]).astype(">u4")
        self.buffer += encoded.tobytes()  # step 1: the new buffer is visible
        codes = np.frombuffer(self.buffer, dtype=">u4")
        self.suffixes = sort(codes, np.flatnonzero(codes != 0), self.key_length)  # step 2


def _reader_inside_the_sort(read):
    """A `suffix_array` that first runs ``read()``: a reader scheduled while the writer builds the new state."""

    def sort(*args, **kwargs):
        read()
        return suffix_array(*args, **kwargs)

    return sort


def test_a_reader_during_a_write_sees_one_state(monkeypatch):
    unsafe, seen = _TwoStepIndex(), []
    unsafe.add([[1, 2, 3]])

    def read_unsafe():  # the old reader: the buffer and the suffix array read as two attributes
        seen.append(_one_state(np.frombuffer(unsafe.buffer, dtype=">u4"), unsafe.suffixes))

    unsafe.add([[4, 5, 6, 7]], sort=_reader_inside_the_sort(read_unsafe))
    assert seen == [False]  # the two-step publication shows a new buffer with the old suffix array

    index = SuffixIndex(key_length=8, max_bytes=200)
    drafter = hfs.SuffixDrafter(cost_curve=lambda n: 1.0)
    drafter.index = index
    index.add([[1, 2, 3, 9, 9]])
    results = []

    def read():
        snap = index.snapshot  # what a lookup takes, once
        results.append((len(snap.lengths), _one_state(snap.codes, snap.suffixes)))
        drafter.draft(torch.tensor([4, 1, 2]), hfs.TreeSpec.chain(4))

    monkeypatch.setattr(suffix_index, "suffix_array", _reader_inside_the_sort(read))
    index.add([[1, 2, 3, 4, 5, 6, 7, 8] * 2 + [1, 2, 3, 4]])  # sorted again, and the oldest output evicted
    assert results == [(1, True)]  # the reader saw the old state whole
    assert index.lengths == [20] and _one_state(index.codes, index.suffixes)
    assert not index.suffixes.flags.writeable  # a snapshot cannot be changed in place either


def test_drafting_while_another_thread_learns():
    index = SuffixIndex(key_length=8, max_bytes=4000)
    drafter = hfs.SuffixDrafter(cost_curve=lambda n: 1.0, min_probability=0.0)
    drafter.index = index
    rng = np.random.default_rng(0)
    outputs = [rng.integers(0, 6, int(rng.integers(1, 40))).tolist() for _ in range(300)]
    done, bad = threading.Event(), []

    def learn():
        for out in outputs:
            index.add([out])
        done.set()

    writer = threading.Thread(target=learn)
    writer.start()
    while not done.is_set():
        snap = index.snapshot
        if not _one_state(snap.codes, snap.suffixes):
            bad.append(len(snap.codes))
        tokens = drafter.draft(torch.tensor(rng.integers(0, 6, 6)), hfs.TreeSpec.chain(6)).tokens
        if bool((tokens < 0).any() or (tokens >= 6).any()):
            bad.append(tokens.tolist())
    writer.join()
    assert not bad and index.nbytes <= 4000


# ----------------------------------------------------------------------------- 5b. a memory per tenant

PROMPT = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 12]])


def _generate(model, drafter):
    return model.generate(
        PROMPT, assistant_model=drafter, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
    )


def _has_path(draft, tokens: list[int]) -> bool:
    """Whether ``tokens`` follow the root of ``draft`` along one of its paths."""
    node, parents, drafted = 0, draft.parents, draft.tokens.tolist()
    for token in tokens:
        children = [i for i, p in enumerate(parents) if p == node and drafted[i] == token]
        if not children:
            return False
        node = children[0]
    return True


def test_tenants_never_see_each_others_outputs(tmp_path):
    model = hfs.enable(tiny_model("llama", seed=2))
    plain = model.generate(PROMPT, max_new_tokens=24, do_sample=False)
    shared = hfs.SuffixDrafter(cost_curve=lambda n: 1.0).warm([[60, 61, 62, 63, 64]])
    alice = shared.for_tenant("alice")
    assert shared.for_tenant("alice") is alice and alice.for_tenant("bob") is shared.for_tenant("bob")
    first = _generate(model, shared.for_tenant("alice"))
    assert torch.equal(first.sequences, plain) and len(alice.index) == 1
    assert len(shared.index) == 1  # the shared memory holds the corpus only: alice's output went to hers

    bob = shared.for_tenant("bob")
    # after a few tokens of the same answer: alice drafts its continuation, bob drafts only what a fresh drafter would
    context = plain[0, : PROMPT.shape[1] + 4]
    continuation = plain[0, PROMPT.shape[1] + 4 : PROMPT.shape[1] + 7].tolist()
    tree = hfs.TreeSpec.chain(8)
    by_alice, by_bob = alice.draft(context, tree), bob.draft(context, tree)
    fresh = hfs.SuffixDrafter(cost_curve=lambda n: 1.0).warm([[60, 61, 62, 63, 64]]).draft(context, tree)
    assert _has_path(by_alice, continuation) and not _has_path(by_bob, continuation)
    assert by_bob.tokens.tolist() == fresh.tokens.tolist() and by_bob.parents == fresh.parents
    for tenant in (alice, bob):  # both draft from the shared corpus
        assert _has_path(tenant.draft(torch.tensor([3, 60, 61]), tree), [62, 63, 64])

    by_bob = _generate(model, shared.for_tenant("bob"))
    again = _generate(model, shared.for_tenant("alice"))
    assert torch.equal(by_bob.sequences, plain) and torch.equal(again.sequences, plain)  # exact either way
    assert again.speculative_stats.mean_accepted_length > by_bob.speculative_stats.mean_accepted_length
    assert len(alice.index) == 2 and len(bob.index) == 1 and len(shared.index) == 1

    alice.save_pretrained(tmp_path)  # the tenant's own memory, not the shared corpus
    saved = hfs.SuffixDrafter.from_pretrained(tmp_path)
    assert len(saved.index) == 2 and np.array_equal(saved.index.codes, alice.index.codes)
    shared.forget_tenant("alice")
    assert len(shared.for_tenant("alice").index) == 0


def test_a_tenant_of_a_drafter_that_does_not_learn_learns_nothing():
    model = hfs.enable(tiny_model("llama", seed=2))
    shared = hfs.SuffixDrafter(cost_curve=lambda n: 1.0, learn_outputs=False)
    tenant = shared.for_tenant("carol")
    _generate(model, tenant)
    assert len(tenant.index) == 0 and len(shared.index) == 0
    tenant.config.learn_outputs = True  # a tenant's config is its own copy
    _generate(model, tenant)
    assert len(tenant.index) == 1 and not shared.config.learn_outputs
