"""The engine's linear-layer kernels: each equals ``F.linear``; the engine runs them only inside its own forwards; the
table that chooses them is cached, read from the cache and can be turned off; greedy output stays exact."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import hf_speculative as hfs
from hf_speculative.engine import kernels
from hf_speculative.engine.kernels.build import build_small_gemm
from hf_speculative.engine.kernels.linear import PackedKernel

from conftest import FP32_LAYERS, tiny_model
from test_batch import left_padded

ARCHS = ["llama", "mistral", "qwen2"]  # qwen2: q/k/v projections with a bias


@pytest.fixture(scope="module")
def packed_available():
    if build_small_gemm() is None:
        pytest.skip("no C compiler: the packed kernel cannot be built here (the engine keeps torch's kernels)")
    return kernels.available_kernels(torch.float32)


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 6, 7, 13, 48, 49, 70])
@pytest.mark.parametrize("shape", [(64, 32), (67, 45), (200, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_every_kernel_equals_linear(packed_available, rows, shape, bias):
    torch.manual_seed(rows)
    module = torch.nn.Linear(shape[1], shape[0], bias=bias)
    x = torch.randn(rows, shape[1])
    with torch.no_grad():
        expected = F.linear(x, module.weight, module.bias)
        for name, kernel in packed_available.items():
            got = kernels.fast_linear(module, x, kernel)
            assert got.shape == expected.shape, name
            torch.testing.assert_close(got, expected, **FP32_LAYERS, msg=name)
            got3 = kernels.fast_linear(module, x.view(1, rows, shape[1]), kernel)  # a leading batch dimension
            torch.testing.assert_close(got3[0], expected, **FP32_LAYERS, msg=name)


def test_prepared_weight_follows_in_place_changes(packed_available):
    module = torch.nn.Linear(40, 70)
    x = torch.randn(3, 40)
    with torch.no_grad():
        for kernel in packed_available.values():
            kernels.fast_linear(module, x, kernel)  # prepares the copy
            module.weight.mul_(2.0)
            module.bias.add_(1.0)
            torch.testing.assert_close(kernels.fast_linear(module, x, kernel), F.linear(x, module.weight, module.bias), **FP32_LAYERS)


def test_onednn_bfloat16_close_to_linear():
    kernel = kernels.available_kernels(torch.bfloat16).get("onednn")
    if kernel is None:
        pytest.skip("oneDNN cannot run bfloat16 on this CPU (or torch was built without it)")
    module = torch.nn.Linear(64, 96).to(torch.bfloat16)
    x = torch.randn(9, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        got = kernels.fast_linear(module, x, kernel).float()
        expected = F.linear(x, module.weight, module.bias).float()
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def _spy(monkeypatch):
    """Counts the packed kernel's products (rows per call)."""
    calls = []
    original = PackedKernel.product

    def product(self, prepared, x, n, bias):
        calls.append(x.numel() // x.shape[-1])
        return original(self, prepared, x, n, bias)

    monkeypatch.setattr(PackedKernel, "product", product)
    return calls


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equal_with_the_packed_kernel_on_ragged_batches(packed_available, monkeypatch, arch):
    model = hfs.enable(tiny_model(arch))
    ids, mask = left_padded()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    calls = _spy(monkeypatch)
    drafter = hfs.PromptLookupDrafter(min_ngram_size=1)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, assistant_model=drafter)
    assert calls, "the engine's forwards did not run the packed kernel"
    assert torch.equal(out, plain)
    single = model.generate(ids[:1], max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert torch.equal(single, model.generate(ids[:1], max_new_tokens=12, do_sample=False))


def test_kernels_only_inside_the_engine_and_turned_off(packed_available, monkeypatch):
    model = hfs.enable(tiny_model("llama"))
    calls = _spy(monkeypatch)
    ids = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 2])
    model.generate(ids, max_new_tokens=8, do_sample=False)  # plain generate: torch's kernels
    model(ids)  # the model's own forward
    assert not calls
    assert not any("forward" in m.__dict__ for m in model.modules())
    model.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert calls and not any("forward" in m.__dict__ for m in model.modules())  # installed per forward, then removed
    calls.clear()
    hfs.enable(model, kernels="torch")
    model.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert not calls
    hfs.enable(model, kernels="auto")
    monkeypatch.setenv(kernels.KERNELS_ENV, "torch")
    model.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert not calls
    with pytest.raises(ValueError, match="kernels must be"):
        hfs.enable(model, kernels="fast")


def test_kernel_table_is_measured_cached_and_read(packed_available, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    model = hfs.enable(tiny_model("llama"))
    assert kernels.kernel_table(model).meta.get("source") == "default"
    assert kernels.kernel_table(model) is kernels.kernel_table(model)  # read once per model and dtype
    table = kernels.measure_kernel_table(model, buckets=(1, 4), repeats=1)
    assert set(table.choice) == {1, 4} and set(table.milliseconds) >= {"torch", "packed"}
    assert all(table.milliseconds[table.choice[b]][b] == min(ms[b] for ms in table.milliseconds.values()) for b in (1, 4))
    # a cached table (here: torch's kernels at every row count) is what a fresh model reads
    path = kernels.kernel_table_path(model)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(kernels.KernelTable({1: "torch", 64: "torch"}).to_dict()))
    fresh = hfs.enable(tiny_model("llama"))
    assert kernels.kernel_table(fresh).choice == {1: "torch", 64: "torch"}
    calls = _spy(monkeypatch)
    fresh.generate(torch.tensor([[5, 17, 33, 2] * 3]), max_new_tokens=6, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert not calls
    assert kernels.kernel_table(fresh).kernel_for(65) == "torch"


def test_calibrate_writes_the_table_and_the_curve(packed_available, tmp_path, monkeypatch):
    from argparse import Namespace

    from hf_speculative.commands import calibrate_cost
    from hf_speculative.perf_model import measure_cost_curve

    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    model = tiny_model("llama")
    monkeypatch.setattr("hf_speculative.bench.reference.resolve_model", lambda name, **kw: (model, None))
    monkeypatch.setattr("hf_speculative.perf_model.measure_cost_curve",
                        lambda m, **kw: measure_cost_curve(m, nodes=(1, 2, 4), prefix=8, repeats=1, projection_rows=(1,)))  # fmt: skip
    args = Namespace(model="tiny", dtype="float32", device="cpu", threads=None, seed=0, force=False, kernels="auto")
    assert calibrate_cost.run(args) == 0
    assert kernels.kernel_table_path(model).exists()
    assert kernels.kernel_table(model).meta.get("source") != "default"
