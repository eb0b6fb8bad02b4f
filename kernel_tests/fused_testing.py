"""Helpers shared by the GPU kernel tests: the backends, seeded inputs, raw (possibly misaligned)
device buffers for the launchers, the float64 softmax reference, the error measures, calling backend
ops (which work on TensorData) with Tensors, and the fused-vs-unfused speed line each fused-kernel
test file prints (visible with pytest -s). torch is imported where it is used: a test module skips
without it (pytest.importorskip) after importing this one."""

from __future__ import annotations

import zlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

import minitorch
from minitorch.cuda.timer import gpu_ms

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
CPU = minitorch.TensorBackend(minitorch.FastOps)

Array = np.ndarray


# ---- inputs --------------------------------------------------------------------------------------
def rng_for(*key: Any) -> np.random.Generator:
    """A generator seeded by the test's parameters, so each case is reproducible on its own."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def gpu(arr: Array, requires_grad: bool = False) -> minitorch.Tensor:
    return minitorch.tensor_from_numpy(np.asarray(arr, dtype=np.float32), backend=CUDA, requires_grad=requires_grad)


def cpu(arr: Array, requires_grad: bool = False) -> minitorch.Tensor:
    return minitorch.tensor_from_numpy(np.asarray(arr, dtype=np.float32), backend=CPU, requires_grad=requires_grad)


def permuted_gpu(arr: Array, order: Sequence[int]) -> minitorch.Tensor:
    """A non-contiguous CUDA view equal to arr: storage laid out as arr.transpose(inverse(order))."""
    inverse = np.argsort(order)
    t = gpu(np.ascontiguousarray(np.transpose(arr, inverse))).permute(*order)
    assert t.shape == arr.shape, f"permuted view has shape {t.shape}, expected {arr.shape}"
    return t


def on_tensors(op: Callable[..., Any], *args: Any) -> Any:
    """op (a backend op or kernel hook, which takes and returns TensorData) called with Tensors: a
    Tensor argument goes in as its TensorData, and a TensorData result (or each one of a tuple)
    comes back as a Tensor on the backend of the first Tensor argument."""
    backend = next(a.backend for a in args if isinstance(a, minitorch.Tensor))
    out = op(*(a._tensor if isinstance(a, minitorch.Tensor) else a for a in args))

    def wrap(x: Any) -> Any:
        return minitorch.Tensor(x, backend=backend) if isinstance(x, minitorch.TensorData) else x

    return tuple(wrap(x) for x in out) if isinstance(out, tuple) else wrap(out)


# ---- raw device buffers ------------------------------------------------------------------------------
def device_copy(arr: Array, offset: int = 0) -> Any:
    """arr flattened into a float32 torch CUDA buffer that starts `offset` floats past its allocation
    (offset 1: not 16-byte aligned, so the kernels take their scalar path)."""
    import torch

    buf = torch.empty(arr.size + offset, device="cuda")
    buf[offset:] = torch.from_numpy(np.asarray(arr, dtype=np.float32).reshape(-1)).cuda()
    return buf[offset:]


def nan_buffer(n: int, offset: int = 0) -> Any:
    """n NaN floats on the GPU, `offset` floats past their allocation: an output of which the kernel
    must write every element."""
    import torch

    return torch.full((n + offset,), float("nan"), device="cuda")[offset:]


# ---- references ------------------------------------------------------------------------------------
def softmax_float64(x: Array, mask: Optional[Array], causal: bool) -> Any:
    """The attention softmax of float32 scores x [B, H, Tq, Tk] in float64 (a torch tensor on the CPU):
    the additive [B, Tk] mask is summed in float32, as the kernel sees it (a finite -1e8 rounds the
    sum to a multiple of 8); causal removes the keys j > i + Tk - Tq; a row with no key left is zeros."""
    import torch

    B, H, Tq, Tk = x.shape
    scores = x if mask is None else x + mask.reshape(B, 1, 1, Tk)
    s = torch.from_numpy(np.ascontiguousarray(scores)).double()
    if causal:
        i = torch.arange(Tq).view(Tq, 1)
        j = torch.arange(Tk).view(1, Tk)
        s = s.masked_fill(j > i + (Tk - Tq), float("-inf"))
    m = s.max(dim=-1, keepdim=True).values
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(e))


# ---- errors ----------------------------------------------------------------------------------------
def rel_err(out: Array, ref: Array) -> float:
    """max|out - ref| / max|ref|; infinite when out has a nan or inf."""
    out = np.asarray(out, dtype=np.float64)
    if not np.isfinite(out).all():
        return float("inf")
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    return float(np.abs(out - ref).max(initial=0.0)) / scale


def assert_close(out: Array, ref: Array, tol: float, what: str, scale: Optional[float] = None) -> None:
    """max|out - ref| <= tol * scale (default scale: max|ref|); NaN/inf must match exactly."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: result shape {out.shape}, expected {ref.shape}"
    special = ~np.isfinite(ref)
    if special.any():
        same = (np.isnan(out) & np.isnan(ref)) | (out == ref)
        bad = special & ~same
        assert not bad.any(), (
            f"{what}: non-finite mismatch at {np.argwhere(bad)[:5].tolist()}: got {out[bad][:5]}, want {ref[bad][:5]}"
        )
    finite = ~special
    if not finite.any():
        return
    if scale is None:
        scale = float(np.max(np.abs(ref[finite])))
    err = np.abs(np.where(finite, out - ref, 0.0))
    worst = np.unravel_index(np.argmax(np.nan_to_num(err, nan=np.inf)), err.shape)
    rel = float(err[worst]) / max(scale, 1e-30)
    assert np.isfinite(out[finite]).all() and rel <= tol, (
        f"{what}: error {rel:.3e} > {tol:.0e} (scale {scale:.3e}); shape {out.shape}, "
        f"worst at {tuple(int(i) for i in worst)}: "
        f"got {out[worst]!r}, want {ref[worst]!r}"
    )


# ---- speed -----------------------------------------------------------------------------------------
def print_speedup(label: str, fused: Callable[[], Any], unfused: Callable[[], Any]) -> None:
    """Time the fused op and minitorch's composed version of it on the same input; print the ratio."""
    fused_ms, unfused_ms = gpu_ms(fused), gpu_ms(unfused)
    print(f"{label}: fused {fused_ms * 1e3:8.1f} us, unfused {unfused_ms * 1e3:9.1f} us, "
          f"speedup {unfused_ms / fused_ms:6.1f}x")
