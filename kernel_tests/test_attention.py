"""Fused attention (src/attention_kernel.cu) through minitorch.fused_attention on the CUDA backend,
against naive attention in torch float64 (on the GPU) from the same float32 inputs: the output, the
per-row log-sum-exp, and dq, dk, dv.

Errors are max|out - ref| / max(max|ref|, FLOOR) with inputs and output gradients ~ N(0, 1), so any
wrong index or mask is off by O(1) while float32 rounding stays far below TOL. Masks are additive
[B, Tk]: "inf" pads a random suffix of the keys with -inf (batch 0 keeps every key plus a random
additive term, the last batch of three loses every key, so its rows must be zeros with zero
gradients); "finite" pads with -1e9 and always keeps a key, where finite values act as plain additions.
"""

import math
import sys
from pathlib import Path
from typing import Optional, Tuple

import pytest

import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.cuda_kernel_ops import CudaKernelOps, CudaShapeError

from fused_testing import on_tensors

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from minitorch_testing import naive_attention  # noqa: E402

BACKEND = minitorch.TensorBackend(CudaKernelOps)
TOL = 1e-4
TOL_HIGH = 1e-2  # "high": one TF32 product, operands rounded to 10 mantissa bits (unit roundoff 2^-11)
FLOOR = 0.1
ACTIVATIONS = ["softmax", "relu"]


def rel_err(out: "torch.Tensor", ref: "torch.Tensor", floor: float = FLOOR) -> float:
    """max|out - ref| / max(max|ref|, floor) over finite reference entries; inf if they disagree on
    which entries are finite (or out has a NaN)."""
    out, ref = out.double(), ref.double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(out), finite) or not torch.equal(out[~finite], ref[~finite]):
        return math.inf
    if not finite.any():
        return 0.0
    scale = max(float(ref[finite].abs().max()), floor)
    return float((out[finite] - ref[finite]).abs().max()) / scale


def make_mask(gen: "torch.Generator", B: int, Tk: int, kind: str) -> Optional["torch.Tensor"]:
    if kind == "none":
        return None
    fill = -math.inf if kind == "inf" else -1e9
    mask = torch.zeros(B, Tk, device="cuda")
    for b in range(1, B):
        dead = kind == "inf" and b == B - 1 and B > 2
        keep = 0 if dead else int(torch.randint(1, Tk + 1, (1,), generator=gen, device="cuda"))
        mask[b, keep:] = fill
    mask[0] += 0.5 * torch.randn(Tk, generator=gen, device="cuda")
    return mask


def inputs(B: int, H: int, Tq: int, Tk: int, D: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=gen, device="cuda")
    k = torch.randn(B, H, Tk, D, generator=gen, device="cuda")
    v = torch.randn(B, H, Tk, D, generator=gen, device="cuda")
    g = torch.randn(B, H, Tq, D, generator=gen, device="cuda")
    return gen, q, k, v, g


def run_fused(q, k, v, mask, causal: bool, activation: str, g) -> Tuple["torch.Tensor", ...]:
    """(out, lse, dq, dk, dv) of minitorch.fused_attention on tensors sharing the torch buffers."""
    tq, tk, tv = (minitorch.from_torch(t).requires_grad_(True) for t in (q, k, v))
    tmask = None if mask is None else minitorch.from_torch(mask)
    out = minitorch.fused_attention(tq, tk, tv, tmask, causal=causal, activation=activation)
    out.backward(minitorch.from_torch(g))
    scale = 1.0 / math.sqrt(q.shape[-1])
    _, lse = on_tensors(CudaKernelOps.attention_fw, tq, tk, tv, tmask, causal, activation, scale)
    return tuple(t.to_torch().clone() for t in (out, lse, tq.grad, tk.grad, tv.grad))


def check(B: int, H: int, Tq: int, Tk: int, D: int, causal: bool, activation: str, mask_kind: str, seed: int = 0,
          tol: float = TOL) -> "torch.Tensor":
    """Errors of out, lse, dq, dk, dv below tol; returns out."""
    gen, q, k, v, g = inputs(B, H, Tq, Tk, D, seed)
    mask = make_mask(gen, B, Tk, mask_kind)
    if activation == "relu":
        # ReLU's derivative jumps at 0, so a score within rounding of 0 could take opposite signs in
        # float32 and float64 and move a gradient by O(1/sqrt(Tk)). Multiples of 1/4 make q.k exact in
        # both, and a positive scale keeps its sign; the random additive term (which would let
        # scale * q.k + m land near 0) is left out, as the softmax cases cover it.
        q, k = (torch.round(t * 4) / 4 for t in (q, k))
        if mask is not None:
            mask[0] = 0.0
    out, lse, dq, dk, dv = run_fused(q, k, v, mask, causal, activation, g)
    rq, rk, rv = (t.double().requires_grad_(True) for t in (q, k, v))
    ref, ref_lse = naive_attention(rq, rk, rv, mask, causal, activation, 1.0 / math.sqrt(D))
    ref.backward(g.double())
    what = f"[{B},{H},{Tq},{Tk},{D}] causal={causal} {activation} mask={mask_kind}"
    errors = {
        "out": rel_err(out, ref.detach()),
        "lse": rel_err(lse, ref_lse),
        "dq": rel_err(dq, rq.grad),
        "dk": rel_err(dk, rk.grad),
        "dv": rel_err(dv, rv.grad),
    }
    bad = {name: e for name, e in errors.items() if not e < tol}
    assert not bad, f"{what}: relative errors {bad} (tolerance {tol})"
    if mask_kind == "inf" and B > 2:
        dead = (slice(B - 1, B),)
        for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert float(t[dead].abs().max()) == 0.0, f"{what}: {name} of the fully masked batch is not zero"
    return out


# ---- the grid: T in {1, 7, 64, 129} x D x causal x mask x activation ------------------------
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("mask_kind", ["none", "inf", "finite"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [16, 64, 100, 128])
@pytest.mark.parametrize("T", [1, 7, 64, 129])
def test_small_lengths(T: int, D: int, causal: bool, mask_kind: str, activation: str) -> None:
    check(3, 2, T, T, D, causal, activation, mask_kind, seed=T * 1000 + D)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [16, 64, 100, 128])
def test_length_1000(D: int, causal: bool, activation: str) -> None:
    check(3, 2, 1000, 1000, D, causal, activation, "inf" if causal else "finite", seed=D)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_length_4096(D: int, causal: bool, activation: str) -> None:
    check(1, 2, 4096, 4096, D, causal, activation, "none" if causal else "inf", seed=D + causal)


# ---- other shapes: Tq != Tk (causal offset Tk - Tq), head dims off the float4 path -------------------
@pytest.mark.parametrize("Tq,Tk", [(7, 129), (129, 64), (200, 33), (1, 1000)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cross_lengths(Tq: int, Tk: int, causal: bool, activation: str) -> None:
    check(3, 2, Tq, Tk, 64, causal, activation, "inf", seed=Tq + Tk)


@pytest.mark.parametrize("D", [1, 7, 33, 65, 127])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_odd_head_dims(D: int, activation: str) -> None:
    check(2, 3, 150, 150, D, True, activation, "finite", seed=D)


@pytest.mark.parametrize(
    "T,D,causal,activation",
    [(129, 64, True, "softmax"), (1000, 128, False, "softmax"), (200, 33, True, "relu"), (64, 100, False, "relu")],
)
def test_high_precision(T: int, D: int, causal: bool, activation: str) -> None:
    """Under set_float32_matmul_precision("high") the products are single TF32 ones: errors of TF32
    size against float64, and outputs that differ from those of "highest"."""
    highest = check(2, 3, T, T, D, causal, activation, "inf", seed=T + D)
    with minitorch.float32_matmul_precision("high"):
        high = check(2, 3, T, T, D, causal, activation, "inf", seed=T + D, tol=TOL_HIGH)
    assert not torch.equal(high, highest), "precision 'high' changed nothing"


def test_non_contiguous_inputs_and_explicit_scale() -> None:
    """q, k, v as permuted views of [B, T, H, D] buffers (what MultiHeadAttention makes) and scale=0.3."""
    B, T, H, D = 2, 70, 3, 32
    gen = torch.Generator(device="cuda").manual_seed(5)
    bufs = [torch.randn(B, T, H, D, generator=gen, device="cuda") for _ in range(3)]
    tq, tk, tv = (minitorch.from_torch(b).requires_grad_(True) for b in bufs)
    views = [t.permute(0, 2, 1, 3) for t in (tq, tk, tv)]
    out = minitorch.fused_attention(*views, causal=True, scale=0.3)
    g = torch.randn(B, H, T, D, generator=gen, device="cuda")
    out.backward(minitorch.from_torch(g))
    rq, rk, rv = (b.double().permute(0, 2, 1, 3).detach().requires_grad_(True) for b in bufs)
    ref, _ = naive_attention(rq, rk, rv, None, True, "softmax", 0.3)
    ref.backward(g.double())
    assert rel_err(out.to_torch(), ref.detach()) < TOL
    for t, r in ((tq, rq), (tk, rk), (tv, rv)):
        assert rel_err(t.grad.to_torch().permute(0, 2, 1, 3), r.grad) < TOL


def test_matches_the_naive_minitorch_path() -> None:
    """The fused op and matmul + attn_softmax + matmul on the same CUDA backend agree."""
    B, H, T, D = 2, 4, 96, 64
    gen, q, k, v, _ = inputs(B, H, T, T, D, 11)
    mask = make_mask(gen, B, T, "inf")
    tq, tk, tv = (minitorch.from_torch(t) for t in (q, k, v))
    tmask = minitorch.from_torch(mask)
    fused = minitorch.fused_attention(tq, tk, tv, tmask, causal=True).to_torch()
    scores = (tq @ tk.permute(0, 1, 3, 2)) * (1.0 / math.sqrt(D))
    naive = (scores.attn_softmax(tmask, causal=True) @ tv).to_torch()
    assert rel_err(fused, naive) < TOL


def test_bad_arguments_raise_before_any_launch() -> None:
    q = minitorch.zeros((1, 2, 8, 16), backend=BACKEND)
    k = minitorch.zeros((1, 2, 9, 16), backend=BACKEND)
    with pytest.raises(ValueError, match="activation"):
        minitorch.fused_attention(q, k, k, activation="gelu")
    with pytest.raises(minitorch.IndexingError, match=r"\(1, 2, 9, 8\)"):
        minitorch.fused_attention(q, k, minitorch.zeros((1, 2, 9, 8), backend=BACKEND))
    with pytest.raises(minitorch.IndexingError, match=r"mask of shape \(2, 9\)"):
        minitorch.fused_attention(q, k, k, minitorch.zeros((2, 9), backend=BACKEND))
    big = minitorch.zeros((1, 1, 4, 129), backend=BACKEND)
    with pytest.raises(CudaShapeError, match="129"):
        minitorch.fused_attention(big, big, big)


def test_raw_launcher_rejects_bad_sizes() -> None:
    lib = kernel_library("attention_kernel")
    buf = torch.zeros(64, device="cuda")
    p = buf.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    assert lib.launch_attention_fw(p, p, p, p, p, None, 1, 1, 2, 2, 129, 0, 0, 0, 1.0, stream) == 1
    assert lib.launch_attention_fw(p, p, p, p, p, None, 1, 1, 2, 2, 4, 0, 2, 0, 1.0, stream) == 1  # activation
    assert lib.launch_attention_fw(p, p, p, p, p, None, 1, 1, 2, 2, 4, 0, 0, 2, 1.0, stream) == 1  # precision
    assert lib.launch_attention_fw(p, p, p, p, p, None, 1, 1, 0, 2, 4, 0, 0, 0, 1.0, stream) == 1
    nulls = (None,) * 4  # out, lse, mask, workspace
    assert lib.launch_attention_bw(p, p, p, p, p, p, p, *nulls, 1, 1, 2, 2, 4, 0, 0, 0, 1.0, stream) == 1
    assert lib.launch_attention_bw(p, p, p, p, p, p, p, *nulls, 1, 1, 2, 2, 4, 0, 1, 3, 1.0, stream) == 1  # precision


def test_memory_does_not_grow_with_t_squared() -> None:
    """Forward + backward at T = 8192 stays far below one [T, T] float32 matrix per head."""
    B, H, T, D = 1, 4, 8192, 64
    gen, q, k, v, g = inputs(B, H, T, T, D, 3)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run_fused(q, k, v, None, True, "softmax", g)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < 64 * B * H * T * D, f"fused attention used {extra / 2**20:.1f} MiB beyond its inputs"
