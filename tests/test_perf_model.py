"""The measured cost curve c(N): interpolation, JSON round trip, measurement on a tiny model, disk cache."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import hf_speculative as hfs
from hf_speculative import perf_model
from hf_speculative.engine.policy import speed_policy
from hf_speculative.perf_model import CostCurve, get_cost_curve, measure_cost_curve, set_cost_curve
from hf_speculative.perf_model.cost_curve import _non_decreasing


def test_interpolation_extrapolation_and_batching():
    curve = CostCurve((1, 2, 4, 8), (1.0, 1.2, 1.6, 3.0))
    assert curve(1) == 1.0 and curve(0.5) == 1.0  # flat below the first point
    assert curve(3) == pytest.approx(1.4)  # halfway between 1.2 and 1.6
    assert curve(6) == pytest.approx(2.3)
    assert curve(16) == pytest.approx(3.0 + 8 * (3.0 - 1.6) / 4)  # slope of the last segment: 0.35 per token
    assert curve.batched(2, batch_size=2) == pytest.approx(1.6 / 1.2)  # c(4) / c(2)
    assert curve.max_nodes == 8
    assert curve.projection_cost(3) == 0.0  # no projection data: drafting counts as free
    curve = CostCurve((1, 2), (1.0, 1.1), projection_rows=(1, 4), projection_ratios=(0.2, 0.5))
    assert curve.projection_cost(2) == pytest.approx(0.3)
    assert curve.projection_cost(2, vocab_fraction=0.25) == pytest.approx(0.075)
    assert curve.projection_cost(0) == 0.0


def test_json_round_trip(tmp_path):
    curve = CostCurve((1, 2, 8), (1.0, 1.05, 2.0), (1, 2), (0.2, 0.3), meta={"machine": "x", "dtype": "float32"})
    curve.save(tmp_path / "c.json")
    back = CostCurve.load(tmp_path / "c.json")
    assert back == curve and back.meta == curve.meta
    assert CostCurve.from_dict(curve.to_dict()) == curve


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(nodes=(1, 2), ratios=(1.0,)), "as many ratios"),
        (dict(nodes=(2, 1), ratios=(1.0, 1.0)), "strictly increasing"),
        (dict(nodes=(1, 2), ratios=(1.0, 0.0)), "positive"),
        (dict(nodes=(1,), ratios=(1.0,), projection_rows=(1,), projection_ratios=()), "projection_ratios"),
    ],
)
def test_bad_curves_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CostCurve(**kwargs)


def test_non_decreasing_fit_pools_a_noisy_point_with_its_neighbours():
    assert _non_decreasing([1.0, 1.3, 1.1, 2.0]) == pytest.approx([1.0, 1.2, 1.2, 2.0])
    assert _non_decreasing([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


def test_measure_on_a_tiny_model():
    model = tiny_model("llama")
    curve = measure_cost_curve(model, nodes=(2, 8), prefix=16, repeats=1, projection_rows=(1, 3))
    assert curve.nodes == (1, 2, 8) and curve.projection_rows == (1, 3)
    assert curve.ratios[0] == 1.0
    assert all(b >= a for a, b in zip(curve.ratios, curve.ratios[1:]))
    assert all(r > 0 for r in curve.projection_ratios)
    assert curve.meta["dtype"] == "float32" and "threads=" in curve.meta["machine"] and curve.meta["step_seconds"] > 0


def test_get_cost_curve_measures_once_then_loads_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    model = hfs.enable(tiny_model("llama"), kernels="torch")  # its speed policy holds what was read or measured
    calls = []
    real = perf_model.measure_cost_curve

    def counting(m, **kw):
        calls.append(kw)
        return real(m, nodes=(2, 4), prefix=8, repeats=1, projection_rows=(1,))

    monkeypatch.setattr(perf_model.cost_curve, "measure_cost_curve", counting)  # where get_cost_curve looks it up
    assert get_cost_curve(model, measure_if_missing=False) is None
    first = get_cost_curve(model)
    assert len(calls) == 1 and list((tmp_path / "cost_curves").glob("*.json"))
    assert get_cost_curve(model) is first and len(calls) == 1  # in-process memo
    speed_policy(model).cost_curves.clear()  # the policy holds the memo: a new process reads the file
    assert get_cost_curve(model) == first and len(calls) == 1  # from disk
    # another dtype is another curve (and another file)
    assert perf_model.cost_curve_path(model.to(torch.float64)) != perf_model.cost_curve_path(model.to(torch.float32))
    # a new version of the engine's kernel measures again: its source is part of both keys
    from hf_speculative.engine import kernels
    from hf_speculative.engine.kernels import build

    with_kernels = hfs.enable(tiny_model("llama"))
    paths = perf_model.cost_curve_path(with_kernels), kernels.kernel_table_path(with_kernels)
    torch_path = perf_model.cost_curve_path(model)
    with monkeypatch.context() as patch:
        patch.setattr(build, "source_digest", lambda: "another-kernel")
        assert perf_model.cost_curve_path(with_kernels) != paths[0]
        assert kernels.kernel_table_path(with_kernels) != paths[1]
        assert perf_model.cost_curve_path(model) == torch_path  # kernels="torch": no kernel in the key
    assert (perf_model.cost_curve_path(with_kernels), kernels.kernel_table_path(with_kernels)) == paths
    # an injected curve wins, and can be withdrawn
    fixed = CostCurve((1, 2), (1.0, 1.5))
    set_cost_curve(model, fixed)
    assert get_cost_curve(model) is fixed
    set_cost_curve(model, None)
    assert get_cost_curve(model) == first
