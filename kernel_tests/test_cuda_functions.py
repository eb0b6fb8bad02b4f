"""Tensor operations on the CUDA backend against the CPU backend (FastOps): every autodiff Function
forward and backward, the Embedding Function, one training step of a small MLP, the transfers a
forward + backward makes (none until the loss is read), the checks of the public entry (shapes and
backends, which the backend ops no longer repeat) and zero-copy interop with torch.

Errors are max|out - ref| / max(|ref|, tiny) against the CPU result from the same float32 inputs,
reported with the shapes involved.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import minitorch
from minitorch import cuda_kernel_ops as cko
from minitorch.fused.embedding import Embedding as EmbeddingFn

from fused_testing import CPU, CUDA, Array, assert_close, cpu, gpu, rng_for


# ---- every tensor Function, forward and backward, against the CPU backend --------------------------
def _inputs(r: np.random.Generator, *specs: Tuple[Tuple[int, ...], str]) -> List[Array]:
    out = []
    for shape, kind in specs:
        if kind == "pos":
            out.append(r.uniform(0.2, 3.0, shape))
        elif kind == "int":
            out.append(np.round(r.standard_normal(shape) * 2))
        else:
            out.append(r.standard_normal(shape))
    return [x.astype(np.float32) for x in out]


FUNCTION_CASES: Dict[str, Tuple[Callable[..., minitorch.Tensor], Tuple[Tuple[Tuple[int, ...], str], ...]]] = {
    "neg": (lambda x: -x, (((3, 33), "n"),)),
    "add_broadcast": (lambda x, y: x + y, (((4, 1, 33), "n"), ((5, 33), "n"))),
    "sub": (lambda x, y: x - y, (((3, 5), "n"), ((3, 5), "n"))),
    "mul_broadcast": (lambda x, y: x * y, (((2, 3, 1), "n"), ((1, 3, 7), "n"))),
    "div": (lambda x, y: x / y, (((3, 33), "n"), ((33,), "pos"))),
    "rdiv": (lambda x: 2.0 / x, (((3, 33), "pos"),)),
    "sigmoid": (lambda x: x.sigmoid(), (((5, 33), "n"),)),
    "relu": (lambda x: x.relu(), (((5, 33), "n"),)),
    "gelu": (lambda x: x.gelu(), (((5, 33), "n"),)),
    "tanh": (lambda x: x.tanh(), (((5, 33), "n"),)),
    "exp": (lambda x: x.exp(), (((5, 33), "n"),)),
    "log": (lambda x: x.log(), (((5, 33), "pos"),)),
    "add_scalar": (lambda x: x + 2.5, (((1023,), "n"),)),
    "mul_scalar": (lambda x: x * -1.5, (((1023,), "n"),)),
    "pow_scalar": (lambda x: x**3.0, (((3, 7), "pos"),)),
    "pow_sqrt": (lambda x: x**0.5, (((3, 7), "pos"),)),
    "lt": (lambda x, y: (x < y) * x, (((4, 9), "int"), ((9,), "int"))),
    "gt_scalar": (lambda x: (x > 0.5) * x, (((4, 9), "n"),)),
    "eq": (lambda x, y: (x == y) * y, (((4, 9), "int"), ((4, 9), "int"))),
    "is_close": (lambda x, y: x.is_close(y) + x, (((4, 9), "int"), ((4, 9), "int"))),
    "sum_dim": (lambda x: x.sum(1), (((4, 33, 5), "n"),)),
    "sum_all": (lambda x: x.sum(), (((4, 33, 5), "n"),)),
    "mean_dim0": (lambda x: x.mean(0), (((4, 33, 5), "n"),)),
    "amax_dim": (lambda x: x.amax(2), (((4, 33, 5), "n"),)),
    "max_dim_values": (lambda x: x.max(2).values, (((4, 33, 5), "n"),)),
    "permute": (lambda x, y: x.permute(2, 0, 1) * y, (((3, 4, 5), "n"), ((5, 3, 4), "n"))),
    "view": (lambda x: x.view(12, 5) * 2.0, (((3, 4, 5), "n"),)),
    "contiguous": (lambda x: x.permute(1, 0).contiguous().view(-1), (((7, 3), "n"),)),
    "expand": (lambda x, y: x.expand((4, 3, 5)) * y, (((3, 1), "n"), ((4, 3, 5), "n"))),
    "matmul": (lambda x, y: x @ y, (((33, 17), "n"), ((17, 40), "n"))),
    "matmul_batched_4d": (lambda x, y: x @ y, (((2, 1, 5, 7), "n"), ((3, 7, 4), "n"))),
    "matmul_transposed": (lambda x, y: x.transpose(0, 1) @ y.transpose(0, 1), (((17, 33), "n"), ((40, 17), "n"))),
    "softmax_nn": (lambda x: minitorch.nn.softmax(x, 1), (((6, 33), "n"),)),
    "logsumexp": (lambda x: minitorch.nn.logsumexp(x, 1), (((6, 33), "n"),)),
    "attn_softmax": (lambda x: x.attn_softmax(), (((2, 3, 5, 33), "n"),)),
    "attn_softmax_causal": (lambda x: x.attn_softmax(causal=True), (((2, 3, 5, 7), "n"),)),
    "layernorm": (lambda x, g, b: x.layernorm(g, b), (((2, 5, 32), "n"), ((32,), "n"), ((32,), "n"))),
    "layernorm_odd": (lambda x, g, b: x.layernorm(g, b), (((7, 33), "n"), ((33,), "n"), ((33,), "n"))),
}


def _run_function(
    backend: minitorch.TensorBackend, f: Callable, arrays: Sequence[Array], grad_seed: int
) -> Tuple[Array, List[Optional[Array]]]:
    ts = [minitorch.tensor_from_numpy(a, backend=backend, requires_grad=True) for a in arrays]
    out = f(*ts)
    g = np.random.default_rng(grad_seed).standard_normal(out.shape).astype(np.float32)
    out.backward(minitorch.tensor_from_numpy(g, backend=backend))
    return out.to_numpy(), [None if t.grad is None else t.grad.to_numpy() for t in ts]


@pytest.mark.parametrize("name", list(FUNCTION_CASES))
def test_function_forward_backward_matches_cpu(name: str) -> None:
    f, specs = FUNCTION_CASES[name]
    arrays = _inputs(rng_for("fn", name), *specs)
    shapes = [a.shape for a in arrays]
    out_cpu, grads_cpu = _run_function(CPU, f, arrays, 7)
    out_gpu, grads_gpu = _run_function(CUDA, f, arrays, 7)
    assert_close(out_gpu, out_cpu, 1e-5, f"{name} forward on inputs {shapes}")
    for i, (gc, gg) in enumerate(zip(grads_cpu, grads_gpu)):
        assert (gc is None) == (gg is None), f"{name}: input {i} {shapes[i]} got a gradient on one backend only"
        if gc is not None:
            scale = max(float(np.abs(gc).max()), 1e-3)
            assert_close(gg, gc, 1e-4, f"{name} backward, gradient of input {i} {shapes[i]}", scale=scale)


def test_embedding_function_forward_backward() -> None:
    r = rng_for("embedding-fn")
    weight = r.standard_normal((13, 8)).astype(np.float32)
    ids = r.integers(0, 13, (4, 6)).astype(np.float32)
    g = r.standard_normal((4, 6, 8)).astype(np.float32)
    results = []
    for backend in (CPU, CUDA):
        w = minitorch.tensor_from_numpy(weight, backend=backend, requires_grad=True)
        out = EmbeddingFn.apply(w, minitorch.tensor_from_numpy(ids, backend=backend))
        out.backward(minitorch.tensor_from_numpy(g, backend=backend))
        results.append((out.to_numpy(), w.grad.to_numpy()))
    np.testing.assert_array_equal(results[1][0], results[0][0], err_msg="Embedding forward [13, 8] with ids [4, 6]")
    scale = float(np.abs(g).sum())
    assert_close(results[1][1], results[0][1], 1e-6, "Embedding backward [13, 8] with ids [4, 6]", scale=scale)


# ---- training ----------------------------------------------------------------------------------------
class _MLP(minitorch.Module):
    def __init__(self, backend: minitorch.TensorBackend, sizes: Sequence[int]):
        super().__init__()
        self.l1 = minitorch.Linear(sizes[0], sizes[1], backend=backend)
        self.l2 = minitorch.Linear(sizes[1], sizes[2], backend=backend)

    def forward(self, x: minitorch.Tensor) -> minitorch.Tensor:
        return self.l2(minitorch.nn.gelu(self.l1(x)))


def test_linear_gelu_softmax_loss_training_step_matches_cpu() -> None:
    r = rng_for("train")
    x = r.standard_normal((16, 12)).astype(np.float32)
    y = r.integers(0, 5, (16,)).astype(np.float32)
    results = {}
    for name, backend in (("cpu", CPU), ("cuda", CUDA)):
        minitorch.manual_seed(11)  # identical initial weights on both backends
        model = _MLP(backend, (12, 33, 5))
        opt = minitorch.SGD(model.parameters(), lr=0.1)
        logits = model(minitorch.tensor_from_numpy(x, backend=backend))
        loss = minitorch.nn.softmax_loss(logits, minitorch.tensor_from_numpy(y, backend=backend)).mean()
        opt.zero_grad()
        loss.backward()
        grads = {n: p.value.grad.to_numpy() for n, p in model.named_parameters()}
        opt.step()
        params = {n: p.value.to_numpy() for n, p in model.named_parameters()}
        results[name] = (loss.item(), grads, params)
    loss_cpu, grads_cpu, params_cpu = results["cpu"]
    loss_gpu, grads_gpu, params_gpu = results["cuda"]
    assert abs(loss_gpu - loss_cpu) <= 1e-5 * max(abs(loss_cpu), 1.0), f"loss: CUDA {loss_gpu}, CPU {loss_cpu}"
    for n in grads_cpu:
        assert_close(grads_gpu[n], grads_cpu[n], 1e-4, f"gradient of {n} {grads_cpu[n].shape}")
        assert_close(params_gpu[n], params_cpu[n], 1e-5, f"{n} after one SGD step")


def test_mlp_forward_backward_makes_no_transfers_except_the_loss() -> None:
    r = rng_for("transfers")
    minitorch.manual_seed(3)
    model = _MLP(CUDA, (20, 64, 10))
    x = gpu(r.standard_normal((32, 20)))
    y = gpu(r.integers(0, 10, (32,)))
    cko.reset_transfer_stats()
    loss = minitorch.nn.cross_entropy(model(x), y)
    loss.backward()
    for n, p in model.named_parameters():
        assert p.value.grad is not None and p.value.grad.shape == p.value.shape, f"{n} has no gradient of its shape"
    stats = cko.transfer_stats()
    assert stats["h2d"] == 0 and stats["d2h"] == 0, f"forward+backward of a 2-layer MLP copied host<->device: {stats}"
    value = loss.item()
    assert np.isfinite(value), f"loss {value}"
    assert cko.transfer_stats()["d2h"] == 1, f"reading the loss should be one device->host copy: {cko.transfer_stats()}"

# ---- the checks of the public entry ---------------------------------------------------------------
def test_shape_mismatch_raises_before_launch() -> None:
    a, b = gpu(np.zeros((3, 4))), gpu(np.zeros((5, 4)))
    with pytest.raises(minitorch.IndexingError, match=r"\(3, 4\).*\(5, 4\)"):
        a + b
    with pytest.raises(minitorch.IndexingError, match=r"\(3, 4\).*\(5, 4\)"):
        a * b
    with pytest.raises(minitorch.IndexingError, match=r"\(3, 4\).*\(5, 4\)"):
        a @ b
    with pytest.raises(minitorch.IndexingError, match=r"\(3, 4\).*\(4, 3\)"):
        gpu(np.zeros((4, 3))).copy_(a)
    with pytest.raises(minitorch.IndexingError, match="out of range"):
        a.sum(2)


def test_cpu_tensor_with_cuda_tensor_raises_type_error_naming_both() -> None:
    a, c = gpu(np.zeros((2, 2))), cpu(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="CudaKernelOps.*FastOps"):
        a + c
    with pytest.raises(TypeError, match="FastOps.*CudaKernelOps"):
        c @ a
    with pytest.raises(TypeError, match="CudaKernelOps.*FastOps"):
        a.copy_(c)


# ---- interop -----------------------------------------------------------------------------------------
def test_zero_copy_interop_with_torch() -> None:
    import torch

    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    t = minitorch.from_torch(x)
    assert t.backend.ops is minitorch.CudaKernelOps and t.shape == (3, 4)
    assert t._tensor._storage.data_ptr() == x.data_ptr(), "from_torch of a contiguous CUDA tensor must share memory"
    t.copy_(5.0)
    torch.cuda.synchronize()
    assert bool((x == 5.0).all()), "a fill through minitorch must be visible through the torch tensor"
    view = (t * 2.0).to_torch()
    assert view.is_cuda and torch.equal(view, torch.full((3, 4), 10.0, device="cuda"))
