"""The engine's linear-layer kernels and the speed policy that runs them: each kernel equals ``F.linear``; the engine
runs them only inside its own forwards; they read the target's weights in place (no copy); the table that chooses them is
measured, cached and read; every fault in building, loading or checking the native kernel degrades to torch's
kernels with a warning, never an exception or a wrong token."""

from __future__ import annotations

import json
import os
import pickle
import stat

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_LAYERS, tiny_model
from test_batch import left_padded

import hf_speculative as hfs
from hf_speculative.engine import kernels
from hf_speculative.engine.kernels import build
from hf_speculative.engine.kernels.linear import DirectKernel
from hf_speculative.engine.policy import KERNELS_ENV, EngineLinearForward, SpeedPolicy, speed_policy

ARCHS = ["llama", "mistral", "qwen2"]  # qwen2: q/k/v projections with a bias
IDS = torch.tensor([[5, 17, 33, 2, 9, 41, 7] * 2])


@pytest.fixture(scope="module")
def direct_available():
    if build.build_direct_gemm() is None:
        pytest.skip("no C compiler: the direct kernel cannot be built here (the engine keeps torch's kernels)")
    found = kernels.available_kernels(torch.float32)
    assert "direct" in found, "the direct kernel was built but not offered (it failed its check against F.linear)"
    return found


def _forget_loaded_kernels():
    build.load_direct_gemm.cache_clear()
    kernels.linear._direct_kernel.cache_clear()


@pytest.fixture
def isolated_build(monkeypatch, tmp_path):
    """A cache of its own and nothing remembered from earlier builds or loads in this process."""
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_FAILED", set())
    _forget_loaded_kernels()
    yield tmp_path / "cache"
    monkeypatch.undo()
    _forget_loaded_kernels()  # the next test finds the session's kernel again


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 7, 9, 11, 12, 13, 16, 20, 24, 25, 31, 49, 64, 70, 130])
@pytest.mark.parametrize("shape", [(64, 32), (67, 45), (200, 576), (40, 1100)])  # 9-12 rows of 1100: past L1
@pytest.mark.parametrize("bias", [False, True])
def test_every_kernel_equals_linear(direct_available, rows, shape, bias):
    torch.manual_seed(rows)
    module = torch.nn.Linear(shape[1], shape[0], bias=bias)
    x = torch.randn(rows, shape[1])
    with torch.no_grad():
        expected = F.linear(x, module.weight, module.bias)
        for name, kernel in direct_available.items():
            got = kernels.fast_linear(module, x, kernel)
            assert got.shape == expected.shape, name
            torch.testing.assert_close(got, expected, **FP32_LAYERS, msg=name)
            got3 = kernels.fast_linear(module, x.view(1, rows, shape[1]), kernel)  # a leading batch dimension
            torch.testing.assert_close(got3[0], expected, **FP32_LAYERS, msg=name)


@pytest.mark.parametrize("rows", [1, 3, 9, 64])
def test_direct_bfloat16_rounds_like_linear(direct_available, rows):
    kernel = kernels.available_kernels(torch.bfloat16).get("direct")
    assert kernel is not None
    module = torch.nn.Linear(130, 96).to(torch.bfloat16)
    x = torch.randn(rows, 130, dtype=torch.bfloat16)
    with torch.no_grad():
        got = kernels.fast_linear(module, x, kernel)
        exact = F.linear(x.float(), module.weight.float(), module.bias.float())
    assert got.dtype == torch.bfloat16
    # float32 accumulation, one rounding to bfloat16: within one bfloat16 step of the exact product
    torch.testing.assert_close(got.float(), exact, rtol=2**-7, atol=2**-7 * float(exact.abs().max()))


@pytest.mark.parametrize("rows", [1, 2, 16, 17, 32, 33, 70])
@pytest.mark.parametrize("shape", [(64, 96), (96, 2048), (80, 64)])  # 80 rows of W: not a multiple of 32
def test_direct_bfloat16_activations_round_like_linear(direct_available, rows, shape):
    """bfloat16 x against bfloat16 weights: AMX's tiles where the CPU has them (sizes in multiples of 32), the
    widened product elsewhere; either way float32 sums of the exact products, rounded once."""
    kernel = kernels.available_kernels(torch.bfloat16).get("direct")
    assert kernel is not None
    torch.manual_seed(rows)
    module = torch.nn.Linear(shape[1], shape[0]).to(torch.bfloat16)
    x = torch.randn(rows, 2 * shape[1], dtype=torch.bfloat16)[:, : shape[1]]  # a view, not contiguous
    with torch.no_grad():
        got = kernels.fast_linear(module, x, kernel)
        exact = F.linear(x.float(), module.weight.float(), module.bias.float())
        tiles = kernel._amx_product(module.weight, x, shape[0], None) if kernel.amx else None
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    torch.testing.assert_close(got.float(), exact, rtol=2**-7, atol=2**-7 * float(exact.abs().max()))
    if kernel.amx:  # the tiles ran exactly the sizes they fit
        assert (tiles is not None) == (shape[0] % 32 == 0 and shape[1] % 32 == 0)
        if tiles is not None:
            torch.testing.assert_close(
                tiles + module.bias.float(), exact, rtol=1e-5, atol=1e-4 * float(exact.abs().max())
            )


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
    """Counts the direct kernel's products (rows per call)."""
    calls = []
    original = DirectKernel.product

    def product(self, prepared, x, n, bias):
        calls.append(x.numel() // x.shape[-1])
        return original(self, prepared, x, n, bias)

    monkeypatch.setattr(DirectKernel, "product", product)
    return calls


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equal_with_the_direct_kernel_on_ragged_batches(direct_available, monkeypatch, arch):
    model = hfs.enable(tiny_model(arch))
    ids, mask = left_padded()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    calls = _spy(monkeypatch)
    drafter = hfs.PromptLookupDrafter(min_ngram_size=1)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, assistant_model=drafter
    )
    assert calls, "the engine's forwards did not run the direct kernel"
    assert torch.equal(out, plain)
    single = model.generate(ids[:1], max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert torch.equal(single, model.generate(ids[:1], max_new_tokens=12, do_sample=False))


def test_kernels_only_inside_the_engine_and_turned_off(direct_available, monkeypatch):
    model = hfs.enable(tiny_model("llama"))
    calls = _spy(monkeypatch)
    model.generate(IDS, max_new_tokens=8, do_sample=False)  # plain generate: torch's kernels
    model(IDS)  # the model's own forward
    assert not calls
    assert not any("forward" in m.__dict__ for m in model.modules())
    model.generate(IDS, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert calls
    installed = [m for m in model.modules() if "forward" in m.__dict__]
    assert installed and all(isinstance(m.forward, EngineLinearForward) for m in installed)
    calls.clear()
    model.generate(IDS, max_new_tokens=8, do_sample=False)  # installed, but outside the engine: torch's kernels
    model(IDS)
    assert not calls
    hfs.enable(model, kernels="torch")
    assert not any("forward" in m.__dict__ for m in model.modules())  # a new policy without kernels removes them
    model.generate(IDS, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert not calls
    monkeypatch.setenv(KERNELS_ENV, "torch")  # read once, at enable
    hfs.enable(model)
    assert speed_policy(model).kernels == "torch"
    model.generate(IDS, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert not calls
    with pytest.raises(ValueError, match="kernels must be"):
        hfs.enable(model, kernels="fast")
    with pytest.raises(ValueError, match="disagrees"):
        hfs.enable(model, kernels="auto", policy=SpeedPolicy(kernels="torch"))


def test_the_kernels_read_the_weights_in_place(direct_available):
    """No copy of any weight: the policy holds no prepared tensor, and a weight changed in place is what the next
    forward reads."""
    model = hfs.enable(tiny_model("llama"))
    policy = speed_policy(model)
    assert set(policy.offered_kernels(model, torch.float32)) == {"torch", "direct"}  # oneDNN copies: over the budget
    module = model.model.layers[0].mlp.up_proj
    x = torch.randn(3, module.in_features)
    with torch.no_grad(), policy.engine_kernels(model, rows=3) as kernel:
        assert kernel is not None and kernel.name == "direct" and not kernel.copies
        before = module(x)
        module.weight.mul_(2.0)
        torch.testing.assert_close(module(x), 2.0 * before, **FP32_LAYERS)
    assert len(policy._prepared) == 0


def test_a_copying_kernel_only_within_the_memory_budget(direct_available):
    if "onednn" not in kernels.available_kernels(torch.float32):
        pytest.skip("oneDNN does not run here")
    model = tiny_model("llama")
    assert "onednn" not in SpeedPolicy().offered_kernels(model, torch.float32)
    assert "onednn" in SpeedPolicy(memory_budget=2.0).offered_kernels(model, torch.float32)
    with pytest.raises(ValueError, match="memory_budget"):
        SpeedPolicy(memory_budget=-1)


def test_kernel_table_is_measured_cached_and_read(direct_available, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    model = hfs.enable(tiny_model("llama"))
    assert speed_policy(model).table.meta.get("source") == "default"  # a tiny model: too small to time
    table = kernels.measure_kernel_table(model, buckets=(1, 4), repeats=1)
    assert set(table.choice) == {1, 4} and set(table.milliseconds) >= {"torch", "direct"}
    for b in (1, 4):  # the fastest, or torch's own when nothing beats it by the margin
        fastest = min(ms[b] for ms in table.milliseconds.values())
        chosen = table.milliseconds[table.choice[b]][b]
        assert chosen == fastest or (table.choice[b] == "torch" and fastest > (1 - kernels.linear.MARGIN) * chosen)
    # a cached table (here: torch's kernels at every row count) is what a fresh model reads
    path = kernels.kernel_table_path(model)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(kernels.KernelTable({1: "torch", 64: "torch"}).to_dict()))
    fresh = hfs.enable(tiny_model("llama"))
    assert speed_policy(fresh).table.choice == {1: "torch", 64: "torch"}
    calls = _spy(monkeypatch)
    fresh.generate(
        torch.tensor([[5, 17, 33, 2] * 3]), max_new_tokens=6, do_sample=False, assistant_model=hfs.PromptLookupDrafter()
    )
    assert not calls
    assert speed_policy(fresh).table.kernel_for(65) == "torch"
    # a truncated or foreign table is not read: the default applies
    for text in ('{"choice": {"1": "tor', json.dumps({"choice": {"1": "no-such-kernel"}})):
        path.write_text(text)
        assert speed_policy(hfs.enable(tiny_model("llama"))).table.meta.get("source") == "default"


def test_the_quick_measurement_at_enable_keeps_its_time(direct_available, monkeypatch):
    monkeypatch.setattr("hf_speculative.engine.policy.MEASURE_MIN_BYTES", 0)  # time even a tiny model
    model = hfs.enable(tiny_model("llama"), policy=SpeedPolicy(measure_seconds=0.5))
    table = speed_policy(model).table
    assert table.meta.get("source") != "default" and table.meta["seconds"] < 5
    assert set(table.choice) == set(kernels.ROW_BUCKETS)


def test_the_measurement_streams_past_the_cache_and_times_one_row_most(direct_available, monkeypatch):
    """A sample the last-level cache holds would time arithmetic, not reads: the sample is at least twice the cache.
    The one-row bucket (a one-token step) gets its rounds whatever the time limit, and a near tie keeps torch's."""
    linear = kernels.linear
    monkeypatch.setattr(linear, "last_level_cache_bytes", lambda: 480 * 2**20)
    assert linear.memory_bound_sample_bytes(40 * 2**20) == 960 * 2**20
    monkeypatch.setattr(linear, "last_level_cache_bytes", lambda: 8 * 2**20)
    assert linear.memory_bound_sample_bytes(40 * 2**20) == 40 * 2**20
    monkeypatch.setattr(linear, "last_level_cache_bytes", lambda: None)
    assert linear.memory_bound_sample_bytes(40 * 2**20) == 40 * 2**20
    rounds = []
    timed = linear._time_bucket
    monkeypatch.setattr(linear, "_time_bucket", lambda b, r, *a: (rounds.append((b, r)), timed(b, r, *a)))
    table = kernels.measure_kernel_table(tiny_model("llama"), buckets=(1, 4), repeats=3, seconds=0.0)
    assert [r for b, r in rounds if b == 4] == [1]  # the limit: one timed round of the other buckets
    assert [r for b, r in rounds if b == 1] == list(range(linear.ONE_ROW_ROUNDS + 1))  # warm-up + every round
    assert set(table.choice) == {1, 4}
    best = {"torch": {1: 10.0, 4: 10.0}, "direct": {1: 9.9, 4: 9.0}}
    assert linear._fastest(best, 1) == "torch" and linear._fastest(best, 4) == "direct"


def test_calibrate_writes_the_table_and_the_curve(direct_available, tmp_path, monkeypatch):
    from argparse import Namespace

    from hf_speculative.commands import calibrate
    from hf_speculative.perf_model import measure_cost_curve

    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    model = tiny_model("llama")
    monkeypatch.setattr("hf_speculative.bench.reference.resolve_model", lambda name, **kw: (model, None))
    monkeypatch.setattr(
        "hf_speculative.perf_model.measure_cost_curve",
        lambda m, **kw: measure_cost_curve(m, nodes=(1, 2, 4), prefix=8, repeats=1, projection_rows=(1,)),
    )
    args = Namespace(model="tiny", dtype="float32", device="cpu", threads=None, seed=0, force=False, kernels="auto")
    assert calibrate.run(args) == 0
    assert kernels.kernel_table_path(model).exists()
    assert speed_policy(model).table.meta.get("source") != "default"


def test_the_policy_pickles_without_its_kernels(direct_available):
    model = hfs.enable(tiny_model("llama"))
    policy = pickle.loads(pickle.dumps(speed_policy(model)))
    assert policy.table == speed_policy(model).table and not policy._kernels
    model._hfs_policy = policy  # loaded again on the first forward that needs them
    out = model.generate(IDS, max_new_tokens=6, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert policy._kernels and torch.equal(out, model.generate(IDS, max_new_tokens=6, do_sample=False))


# ----------------------------------------------------------------------------- faults: each degrades to torch's kernels


def _generates_exactly_on_torch_kernels(monkeypatch):
    model = hfs.enable(tiny_model("llama"))
    calls = _spy(monkeypatch)
    out = model.generate(IDS, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert not calls, "the direct kernel ran although its build or check failed"
    assert torch.equal(out, model.generate(IDS, max_new_tokens=8, do_sample=False))


def test_an_unwritable_cache_degrades(isolated_build, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(blocker / "cache"))  # cannot be created: a file is in the way
    _generates_exactly_on_torch_kernels(monkeypatch)


def test_a_group_writable_cache_folder_is_refused(isolated_build, monkeypatch):
    folder = isolated_build / "kernels"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert build.build_direct_gemm() is None
    assert not any(folder.glob("*.so")), "built into a folder others can write"
    _generates_exactly_on_torch_kernels(monkeypatch)
    folder.chmod(0o700)  # the negative control: the same folder, private, is used
    monkeypatch.setattr(build, "_FAILED", set())
    if build._compiler() is not None:
        assert build.build_direct_gemm() is not None


def test_a_wrong_library_under_the_expected_name_is_not_loaded(isolated_build, monkeypatch):
    if build._compiler() is None:
        pytest.skip("no C compiler")
    target = build.build_direct_gemm()
    assert target is not None and build.load_direct_gemm(str(target)) is not None  # the negative control: it loads
    _forget_loaded_kernels()
    target.write_bytes(target.read_bytes()[:-100] + b"\0" * 100)  # planted: same name, other content
    assert build.load_direct_gemm(str(target)) is None
    _generates_exactly_on_torch_kernels(monkeypatch)


def test_a_kernel_that_computes_wrong_is_disabled(direct_available, monkeypatch):
    original = DirectKernel.product

    def off_by_a_bit(self, prepared, x, n, bias):
        return original(self, prepared, x, n, bias) * (1 + 1e-3)

    monkeypatch.setattr(DirectKernel, "product", off_by_a_bit)
    kernels.verify_kernel.cache_clear()
    try:
        assert "direct" not in kernels.available_kernels(torch.float32)
    finally:
        monkeypatch.undo()
        kernels.verify_kernel.cache_clear()
    assert "direct" in kernels.available_kernels(torch.float32)  # the negative control: the real kernel passes


def test_no_compiler_degrades(isolated_build, monkeypatch):
    monkeypatch.setattr(build, "_compiler", lambda: None)
    assert build.build_direct_gemm() is None
    _generates_exactly_on_torch_kernels(monkeypatch)


@pytest.mark.parametrize("script", ["sleep 30", "echo broken >&2; exit 1"])
def test_a_hanging_or_failing_compiler_degrades_once(isolated_build, monkeypatch, tmp_path, script):
    compiler = tmp_path / "cc"
    calls = tmp_path / "calls"
    compiler.write_text(f"#!/bin/sh\necho x >> {calls}\n{script}\n")
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(build, "_compiler", lambda: str(compiler))
    monkeypatch.setattr(build, "BUILD_TIMEOUT", 1.0)
    assert build.build_direct_gemm() is None
    assert build.build_direct_gemm() is None  # remembered: not tried again in this process
    assert calls.read_text().count("x") == 1
    _generates_exactly_on_torch_kernels(monkeypatch)


def test_a_model_off_the_cpu_gets_no_kernel_work(monkeypatch):
    """A meta-device (or CUDA, or offloaded) model: enable builds, checks and measures nothing."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def no_build():
        raise AssertionError("built a CPU kernel for a model that is not on the CPU")

    monkeypatch.setattr(build, "build_direct_gemm", no_build)
    monkeypatch.setattr("hf_speculative.engine.policy.measure_kernel_table", no_build)
    with torch.device("meta"):
        model = LlamaForCausalLM(
            LlamaConfig(
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                vocab_size=128256,
            )
        )
    hfs.enable(model)
    policy = speed_policy(model)
    assert policy.table is None and policy.kernel_for_rows(1) is None
    from hf_speculative.paths import model_key, speed_key

    assert len(model_key(model, 0)) == 16 and len(speed_key(model)) == 16


def test_model_keys_take_constant_memory_and_tell_fine_tunes_apart():
    """A parameter of 10^12 elements that owns 4 bytes (an expanded view): any copy of a whole tensor would fail."""
    from hf_speculative.paths import model_key, speed_key

    model = tiny_model("llama")
    huge = torch.zeros(1, 1).expand(10**6, 10**6)
    model.model.embed_tokens.weight = torch.nn.Parameter(huge, requires_grad=False)
    assert len(model_key(model, 8)) == 16 and len(speed_key(model)) == 16
    tuned = tiny_model("llama")
    key = model_key(tuned, 8)
    with torch.no_grad():
        tuned.model.layers[-1].mlp.down_proj.weight.add_(1e-3)  # a fine-tune of one deep layer
    assert model_key(tuned, 8) != key
    assert model_key(tuned, 8) != model_key(tuned, 16)


def test_tests_build_into_their_own_cache():
    cache = os.environ.get("HF_SPECULATIVE_CACHE", "")
    assert cache and not cache.startswith(os.path.expanduser("~/.cache")), cache


def test_the_prefill_runs_the_kernel_the_table_gives_past_its_largest_bucket(direct_available, monkeypatch):
    """A prompt longer than the table's largest row bucket runs that bucket's kernel (a prefill through the direct
    kernel, not torch's), and greedy output stays plain generate()'s."""
    table = kernels.KernelTable({1: "direct", 64: "direct"})
    assert table.kernel_for(1000) == "direct"
    assert kernels.KernelTable({1: "direct", 64: "torch"}).kernel_for(65) == "torch"
    model = hfs.enable(tiny_model("llama"))
    assert speed_policy(model).table.kernel_for(80) == "direct"  # the default table: direct up to 64 rows
    ids = torch.arange(3, 83).remainder(60).unsqueeze(0)  # 80 prompt tokens
    plain = model.generate(ids, max_new_tokens=8, do_sample=False)
    calls = _spy(monkeypatch)
    out = model.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=hfs.PromptLookupDrafter())
    assert 80 in calls  # the prefill's rows, through the direct kernel
    assert torch.equal(out, plain)


def test_a_drafter_network_runs_the_engine_kernel_while_it_drafts(direct_available, monkeypatch):
    """EAGLE's decoder layer and head run the table's kernel while it drafts, torch's own outside the engine; greedy
    output is the target's either way."""
    from hf_speculative.drafters.eagle import EagleDrafter

    model = hfs.enable(tiny_model("llama"))
    speed_policy(model).table = kernels.KernelTable({1: "direct", 64: "direct"})
    drafter = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=50)
    ids = torch.tensor([[5, 17, 33, 2] * 3])
    ref = model.generate(ids, max_new_tokens=12, do_sample=False)
    seen = []  # (module, whether the engine's kernel ran it)
    original = EngineLinearForward.__call__

    def spy(self, x):
        seen.append((id(self.module), self.policy.thread_kernel() is not None))
        return original(self, x)

    monkeypatch.setattr(EngineLinearForward, "__call__", spy)
    out = model.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert torch.equal(out, ref)
    own = {id(m) for m in kernels.linear_layers(drafter)}
    assert own and own <= {m for m, on in seen if on}  # every linear layer of the drafter ran the engine's kernel
    seen.clear()
    with torch.no_grad():
        drafter.fc(torch.randn(1, drafter.fc.in_features))  # outside the engine: torch's own product
    assert seen == [(id(drafter.fc), False)]


def test_a_drafters_bfloat16_copy_counts_against_the_memory_budget(direct_available):
    """The drafting copies count against the policy's memory budget before any is made: a drafter whose copies fit in
    what is left drafts from them, one whose copies do not reads its weights in place (the same products)."""
    from hf_speculative.engine.policy import DraftingLinearForward

    model = tiny_model("llama")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    layers = [torch.nn.Linear(64, 96), torch.nn.Linear(64, 96)]
    need = 96 * 64 * 2  # a bfloat16 copy of one float32 weight

    class Drafter:
        def __init__(self, layer):
            self.layer = layer

        def draft_modules(self):
            return (self.layer,)

    policy = hfs.SpeedPolicy(memory_budget=1.5 * need / params)  # room for one copy, not two
    hfs.enable(model, policy=policy)
    policy.table = kernels.KernelTable({1: "direct", 64: "direct"})
    x = torch.randn(2, 64)
    for layer in layers:
        with torch.no_grad(), policy.drafting_kernels(Drafter(layer)) as kernel:
            out = layer(x)
        assert torch.equal(out, kernel.product(layer.weight.detach(), x, 96, layer.bias.detach()))
    assert type(layers[0].__dict__["forward"]) is DraftingLinearForward
    assert type(layers[1].__dict__["forward"]) is EngineLinearForward  # over the budget: read in place
    assert policy._allowance[1] == need <= policy._allowance[0] < 2 * need


def test_a_drafter_saved_in_bfloat16_is_read_from_a_bfloat16_copy_with_the_same_products(direct_available):
    """While it drafts, a drafter layer whose float32 weight bfloat16 holds exactly (saved in bfloat16, widened to the
    target's float32) is read from a bfloat16 copy: half the bytes, the same products; any other weight in place."""
    from hf_speculative.engine.policy import DraftingLinearForward

    direct = direct_available["direct"]
    drafting = kernels.linear.drafting_kernel(direct)
    assert isinstance(drafting, kernels.linear.DraftingDirectKernel) and drafting.copies
    gen = torch.Generator().manual_seed(3)
    saved = torch.randn(96, 64, generator=gen).to(torch.bfloat16).float()  # bfloat16 values in float32
    full = torch.randn(96, 64, generator=gen)  # float32 values bfloat16 cannot hold
    x, bias = torch.randn(3, 5, 64, generator=gen), torch.randn(96, generator=gen)
    copy = drafting.prepare(saved)
    assert copy.dtype == torch.bfloat16 and copy.nbytes * 2 == saved.nbytes
    assert drafting.prepare(full) is full
    for weight, prepared in ((saved, copy), (full, full)):
        got = drafting.product(prepared, x, 96, bias)
        assert got.dtype == torch.float32 and got.shape == (3, 5, 96)
        assert torch.equal(got, direct.product(weight, x, 96, bias))  # what the float32 weight gives, bit for bit

    model = hfs.enable(tiny_model("llama"))
    policy = speed_policy(model)
    policy.table = kernels.KernelTable({1: "direct", 64: "direct"})
    layer = torch.nn.Linear(64, 96)
    with torch.no_grad():
        layer.weight.copy_(saved)
    target_layer = kernels.linear_layers(model)[0]
    policy._install(model)

    class Drafter:
        def draft_modules(self):
            return (layer, model.model.layers[0])

    with torch.no_grad(), policy.drafting_kernels(Drafter()) as kernel:
        assert type(kernel) is DirectKernel
        out = layer(x)
    assert isinstance(layer.__dict__["forward"], DraftingLinearForward)
    assert type(target_layer.__dict__["forward"]) is EngineLinearForward  # the target's layers keep their forward
    assert torch.equal(out, kernel.product(saved, x, 96, layer.bias.detach()))
    (stamp, held), *_ = policy._prepared[layer].values()
    assert held.dtype == torch.bfloat16


def test_a_drafter_network_runs_the_kernel_its_own_table_chose_for_each_forwards_rows(direct_available):
    """A drafter network big enough to time gets its own table, measured on its layers in their drafting variants (a
    bfloat16-saved drafter reads half the bytes the model's table timed); each drafting forward then runs the kernel
    that table chose for its row count, torch's own where it chose torch's, and torch's outside drafting."""
    from hf_speculative.engine.policy import DRAFTING_MEASURE_MIN_BYTES, DraftingLinearForward, engine_product

    model = hfs.enable(tiny_model("llama"), policy=SpeedPolicy(memory_budget=100.0))  # room for the network's copies
    policy = speed_policy(model)
    policy.table = kernels.KernelTable({1: "torch", 64: "torch"})  # the model's table: torch's everywhere
    policy._install(model)
    gen = torch.Generator().manual_seed(5)
    width = 512
    count = DRAFTING_MEASURE_MIN_BYTES // (width * width * 4) + 1
    network = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(count)])
    with torch.no_grad():
        for layer in network:
            layer.weight.copy_(torch.randn(width, width, generator=gen).to(torch.bfloat16).float())

    class Drafter:
        def draft_modules(self):
            return (network,)

    ran = []
    bound = policy._bound
    policy._bound = lambda module, kernel: ran.append(kernel.name) or bound(module, kernel)
    with torch.no_grad(), policy.drafting_kernels(Drafter()):
        forward = network[0].__dict__["forward"]
        assert isinstance(forward, DraftingLinearForward)
        assert forward.table is not policy.table and forward.table.meta["linears"] == count  # measured on the network
        assert set(forward.table.choice.values()) <= set(policy._kernels)
        forward.table = kernels.KernelTable({2: "direct", 64: "torch"})
        one, many = torch.randn(1, width, generator=gen), torch.randn(8, width, generator=gen)
        got_one, got_many = network[0](one), network[0](many)
        assert engine_product(network[0], one) is not None  # the drafter's own head takes its kernel
        # a layer of the model it shares (an LM head) keeps the model's choice, torch's: the caller's own product runs
        assert engine_product(model.lm_head, torch.randn(1, model.lm_head.in_features)) is None
    ran.remove("direct-drafting")  # the engine_product call above
    assert ran == ["direct-drafting"]  # one row: the table's direct kernel, drafting variant; eight rows: torch's
    drafting = kernels.linear.drafting_kernel(direct_available["direct"])
    assert torch.equal(got_one, drafting.product(drafting.prepare(network[0].weight.detach()), one, width, None))
    assert torch.equal(got_many, F.linear(many, network[0].weight))
    with torch.no_grad():
        network[0](one)  # outside drafting: torch's own
    assert ran == ["direct-drafting"]


def test_a_policy_that_measures_nothing_gives_drafters_the_models_table(direct_available):
    """``measure_seconds=0``: no time is spent timing a drafter network either; its layers take the model's table."""
    model = hfs.enable(tiny_model("llama"), policy=SpeedPolicy(measure_seconds=0))
    policy = speed_policy(model)
    network = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    assert policy.drafting_table(network) is policy.table
