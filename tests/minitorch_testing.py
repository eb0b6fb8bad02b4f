"""Shared backends, hypothesis strategies and numeric checks of the CPU tests.

A plain module with a unique name rather than conftest.py content: test modules import it, and
`import conftest` would resolve to whichever conftest.py pytest loaded last (kernel_tests/ has its
own).  Errors are measured as in the design notes: max|out - ref| / max(max|ref|, floor), with the
reference computed in float64 from the same float32 inputs.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minitorch

SIMPLE = minitorch.TensorBackend(minitorch.SimpleOps)
FAST = minitorch.TensorBackend(minitorch.FastOps)
BACKENDS = {"simple": SIMPLE, "fast": FAST}

# float32 results of a few float32 operations land within a few ulps (6e-8 each) of the float64
# reference; 1e-5 leaves room for short sums while any wrong index is off by O(1).
TOL = 1e-5


# ---- conversions ------------------------------------------------------------------------------
def mt(
    arr: np.ndarray, backend: minitorch.TensorBackend, requires_grad: bool = False
) -> minitorch.Tensor:
    """A minitorch tensor holding arr rounded to float32."""
    return minitorch.tensor_from_numpy(np.asarray(arr, dtype=np.float32), backend=backend, requires_grad=requires_grad)


def mt_strided(arr: np.ndarray, backend: minitorch.TensorBackend, requires_grad: bool = False) -> minitorch.Tensor:
    """arr as a non-contiguous tensor: storage in reversed-dim order, viewed back by permute."""
    rev = tuple(range(arr.ndim - 1, -1, -1))
    t = mt(np.ascontiguousarray(np.transpose(arr, rev)), backend).permute(*rev)
    return t.requires_grad_(requires_grad)


def f32(arr: np.ndarray) -> np.ndarray:
    """arr's values as float32 holds them, in float64 (the inputs a float64 reference sees)."""
    return np.asarray(arr, dtype=np.float32).astype(np.float64)


def t64(arr: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    """A float64 torch tensor of arr's float32 values (the reference's copy of the inputs)."""
    return torch.tensor(f32(arr), dtype=torch.float64, requires_grad=requires_grad)


def as_np(x: object) -> np.ndarray:
    if isinstance(x, minitorch.Tensor):
        return x.to_numpy().astype(np.float64)
    if isinstance(x, torch.Tensor):
        return x.detach().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


# ---- error measure ----------------------------------------------------------------------------
def rel_err(out: object, ref: object, floor: float = 1e-12) -> float:
    """max|out - ref| / max(max|ref|, floor) over the finite reference entries."""
    o, r = as_np(out), as_np(ref)
    finite = np.isfinite(r)
    if not finite.any():
        return 0.0
    return float(np.max(np.abs(o[finite] - r[finite])) / max(float(np.max(np.abs(r[finite]))), floor))


def assert_close(out: object, ref: object, what: str, tol: float = TOL, floor: float = 1e-12) -> None:
    """Same shape, the same non-finite entries, and rel_err(out, ref) < tol."""
    o, r = as_np(out), as_np(ref)
    assert o.shape == r.shape, f"{what}: shape {o.shape} vs reference {r.shape}"
    finite = np.isfinite(r)
    assert np.isfinite(o[finite]).all(), f"{what}: non-finite values where the reference is finite:\n{o}\nvs\n{r}"
    assert np.array_equal(o[~finite], r[~finite], equal_nan=True), f"{what}: inf/nan entries differ:\n{o}\nvs\n{r}"
    err = rel_err(o, r, floor)
    assert err < tol, f"{what}: relative error {err:.3g} >= {tol}\nout:\n{o}\nreference:\n{r}"


def gfloor(grad_out: np.ndarray) -> float:
    """Error scale of a gradient: backward multiplies grad_out by derivatives computed from float32
    values (tanh' = 1 - y^2 from the saved output y), whose absolute error is a few ulps of 1, so
    gradient errors are measured relative to at least max|grad_out|."""
    return max(float(np.max(np.abs(as_np(grad_out)))), 1e-6)


def grad_of(t: minitorch.Tensor, what: str) -> np.ndarray:
    assert t.grad is not None, f"{what}: no gradient reached the leaf"
    assert t.grad.shape == t.shape, f"{what}: gradient shape {t.grad.shape} for a leaf of shape {t.shape}"
    return t.grad.to_numpy().astype(np.float64)


def central_grad(
    f: Callable[..., np.ndarray], xs: Sequence[np.ndarray], arg: int, grad_out: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """d/d xs[arg] of sum(f(*xs) * grad_out) by float64 central differences, element by element."""
    base = [np.array(x, dtype=np.float64) for x in xs]
    x = base[arg]
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        keep = x[idx]
        x[idx] = keep + eps
        up = np.sum(f(*base) * grad_out)
        x[idx] = keep - eps
        down = np.sum(f(*base) * grad_out)
        x[idx] = keep
        out[idx] = (up - down) / (2.0 * eps)
    return out


# ---- references -------------------------------------------------------------------------------
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool,
                    activation: str, scale: float) -> tuple:  # fmt: skip
    """(out, lse) of naive attention in float64 on leaf tensors q, k, v (any device; lse detached): an
    additive [B, Tk] mask, causal keys j <= i + Tk - Tq, softmax (a row with every key removed gives
    zeros) or ReLU (lse zeros)."""
    Tq, Tk = q.shape[2], k.shape[2]
    x = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        x = x + mask.to(torch.float64)[:, None, None, :]
    keep = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
    if causal:
        keep = torch.arange(Tk, device=q.device)[None, :] <= torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
    if activation == "softmax":
        x = x.masked_fill(~keep, -math.inf)
        dead = torch.isneginf(x).all(dim=-1, keepdim=True)
        p = torch.softmax(x.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        lse = torch.logsumexp(x, dim=-1)
    else:
        p = torch.relu(x).masked_fill(~keep, 0.0)
        lse = torch.zeros(x.shape[:-1], dtype=torch.float64, device=q.device)
    return p @ v, lse.detach()


def slot_attention_reference(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, slot: float, pads: np.ndarray, width: int, heads: int
) -> np.ndarray:
    """fused.slot_attention in float64, one row and head at a time: softmax over slots [pads[r],
    min(slot, width - 1)] of q_h . k_h / sqrt(D), times v_h; a row with no such slot gives zeros."""
    rows, C = q.shape
    D = C // heads
    out = np.zeros((rows, C))
    last = min(int(slot), width - 1)
    for r in range(rows):
        for h in range(heads):
            cols = slice(h * D, (h + 1) * D)
            k, v = keys[r, pads[r] : last + 1, cols].astype(np.float64), values[r, pads[r] : last + 1, cols]
            if len(k):
                x = k @ q[r, cols].astype(np.float64) / np.sqrt(D)
                p = np.exp(x - x.max())
                out[r, cols] = (p / p.sum()) @ v
    return out


# ---- strategies -------------------------------------------------------------------------------
def floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Finite float32 numbers in [lo, hi] (bounds rounded inwards to float32)."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    if lo32 < lo:
        lo32 = np.nextafter(lo32, np.float32(np.inf))
    if hi32 > hi:
        hi32 = np.nextafter(hi32, np.float32(-np.inf))
    return st.floats(float(lo32), float(hi32), allow_nan=False, allow_infinity=False, width=32)


def away_from_zero(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Numbers with lo <= |x| <= hi of either sign."""
    return floats(lo, hi) | floats(-hi, -lo)


def shapes(max_dims: int = 3, max_side: int = 3, min_dims: int = 1) -> st.SearchStrategy[tuple]:
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)


def arrays(
    shape: object, elements: Optional[st.SearchStrategy[float]] = None
) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.float32, shape, elements=floats(-5.0, 5.0) if elements is None else elements)


@st.composite
def distinct_arrays(draw: st.DrawFn, shape: tuple) -> np.ndarray:
    """Arrays whose entries differ pairwise by at least 0.1 (no ties for max/argmax/relu kinks)."""
    size = int(np.prod(shape))
    ints = draw(st.lists(st.integers(-60, 60).filter(lambda v: v != 0), min_size=size, max_size=size, unique=True))
    return (np.array(ints, dtype=np.float64) * 0.1).astype(np.float32).reshape(shape)


def broadcast_pairs(max_dims: int = 3, max_side: int = 3) -> st.SearchStrategy:
    """Two shapes that broadcast together (result has .input_shapes and .result_shape)."""
    return hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=max_dims, max_side=max_side)
