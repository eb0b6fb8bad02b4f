"""A bf16 Linear's weight gradient runs on a side stream (minitorch.cuda.runtime.fork) and comes back in
flight (TensorData.in_flight), the output gradient it reads marked read beside (TensorData.read_beside):
backward waits for it only where something reads it or writes into the gradient it reads; its bias
gradient follows the input gradient on the current stream. Each test makes the side stream's products
long (16,384 rows) and reads their results at once, through each path that reads a gradient: a sum (a
weight used twice), an accumulation into .grad (two backward passes), a grad-ready hook, the end of
backward; each against float64 sums of the same bf16-rounded inputs. A read before the side stream is
done would see a buffer half written (or another tensor's values), far outside the float32 rounding
bound here.
"""

from __future__ import annotations

from typing import Dict, List

import pytest

import minitorch
from minitorch import bfloat16
from minitorch.cuda import matmul
from minitorch.cuda.runtime import runtime, settle_side
from minitorch.fused.linear import linear

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

ROWS, N_IN, N_OUT = 16384, 768, 768
BOUND = 1e-4  # float32 sums of 16,384 bf16 products against float64: ~1e-6 relative


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


def bf16_inputs(seed: int) -> Dict[str, "torch.Tensor"]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = {"x": (ROWS, N_IN), "x2": (ROWS, N_IN), "w": (N_OUT, N_IN), "b": (N_OUT,), "g": (ROWS, N_OUT)}
    return {k: torch.randn(s, generator=gen, device="cuda").to(torch.bfloat16) for k, s in shapes.items()}


def test_linear_bw_returns_its_weight_gradients_in_flight() -> None:
    """linear_bw's dweight is in flight until settled (dbias, made on the current stream, is not), the
    d and x it reads are read beside (in flight up to matmul.SIDE_UNSPLIT_ROWS rows); settle() makes it
    complete, settle_side() leaves nothing forked unwaited."""
    t = bf16_inputs(1)
    d, x, w = (minitorch.from_torch(t[k])._tensor for k in ("g", "x", "w"))
    dx, dweight, dbias = matmul.linear_bw(d, x, w, True)
    assert dx.in_flight is None and dx.read_beside is None
    assert dweight.in_flight is not None and dbias.in_flight is None
    assert all(td.in_flight is None and td.read_beside is not None for td in (d, x))
    short = [minitorch.from_torch(t[k][: matmul.SIDE_UNSPLIT_ROWS])._tensor for k in ("g", "x")]
    matmul.linear_bw(*short, w, True)
    assert all(td.in_flight is not None and td.read_beside is None for td in short)
    for td in (dweight, dbias):
        td.settle()
        assert td.in_flight is None
    got_w, got_b = (td._storage.view(td.shape) for td in (dweight, dbias))
    assert rel_err(got_w, t["g"].double().T @ t["x"].double()) < BOUND
    assert rel_err(got_b, t["g"].double().sum(0)) < BOUND
    settle_side()
    assert not runtime().unsettled


def test_a_write_into_the_gradient_the_side_stream_reads_waits_for_it() -> None:
    """d, overwritten in place (Tensor.copy_) as soon as linear_bw returns: the weight and bias
    gradients are still those of the values d had (the write waited for the side stream's products)."""
    t = bf16_inputs(3)
    g = minitorch.from_torch(t["g"].clone())
    x, w = (minitorch.from_torch(t[k])._tensor for k in ("x", "w"))
    _, dweight, dbias = matmul.linear_bw(g._tensor, x, w, True)
    g.copy_(0.0)
    settle_side()
    got_w, got_b = (td._storage.view(td.shape) for td in (dweight, dbias))
    assert rel_err(got_w, t["g"].double().T @ t["x"].double()) < BOUND
    assert rel_err(got_b, t["g"].double().sum(0)) < BOUND
    assert float(g.to_torch().abs().max()) == 0.0


@pytest.mark.parametrize("path", ["used twice", "accumulated", "hook", "end of backward"])
def test_weight_gradients_read_at_once_are_complete(path: str) -> None:
    """float32 leaves under autocast (the weight read through its working copy, whose backward hands
    the side stream's float32 gradient on untouched): .grad of the weight and bias, read through
    `path` as soon as backward allows, equals the float64 sums."""
    t = bf16_inputs(2)
    leaves = {k: minitorch.from_torch(t[k].float()).requires_grad_(True) for k in ("x", "x2", "w", "b")}
    seen: List["torch.Tensor"] = []
    if path == "hook":
        leaves["w"].register_grad_ready_hook(lambda p: seen.append(p.grad.to_torch().clone()))
    g = minitorch.from_torch(t["g"])
    passes = 2 if path == "accumulated" else 1
    for _ in range(passes):
        with minitorch.autocast():
            y = linear(leaves["x"], leaves["w"], leaves["b"])
            if path == "used twice":
                y = y + linear(leaves["x2"], leaves["w"], leaves["b"])
        assert y.dtype is bfloat16
        y.backward(g)
    gd = t["g"].double()
    xs = t["x"].double() + (t["x2"].double() if path == "used twice" else 0)
    scale = passes * (2 if path == "used twice" else 1)
    assert rel_err(leaves["w"].grad.to_torch(), passes * gd.T @ xs) < BOUND
    assert rel_err(leaves["b"].grad.to_torch(), scale * gd.sum(0)) < BOUND
    if path == "hook":
        assert len(seen) == 1 and rel_err(seen[0], gd.T @ xs) < BOUND
    assert not runtime().unsettled
