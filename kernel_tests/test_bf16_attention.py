"""bf16 fused attention (src/attention_bf16_kernel.cu) through minitorch.fused_attention on bf16
tensors, against naive attention in torch float64 from the same bf16-rounded inputs: out, dq, dk, dv
within 2x torch's own bf16 error on those inputs (torch SDPA in bf16 for the softmax, the composed
bf16 ops for relu: same masks, same output gradient), and the float32 lse within LSE_TOL (its inputs
are exact bf16 values and every step runs in float32). Masks as in test_attention.py ("inf" with B = 2
never removes every key of a row, so torch's reference stays finite); the rows that lose every key are
tested on their own.
"""

import ctypes
import math

import pytest

import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.cuda_kernel_ops import CudaKernelOps

from fused_testing import on_tensors
from test_attention import make_mask, naive_attention, rel_err

torch = pytest.importorskip("torch")

FLOOR = 1e-5  # float32 summation: dS = P (dP - D) with dP and D summed in different orders
LSE_TOL = 1e-4
ACTIVATIONS = ["softmax", "relu"]


def bf16_inputs(B: int, H: int, Tq: int, Tk: int, D: int, seed: int, activation: str):
    """(gen, q, k, v, g) in bf16; under relu q and k are multiples of 1/4 so that the sign of every
    score is exact in every precision (ReLU's derivative jumps at 0)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, g = (torch.randn(B, H, T, D, generator=gen, device="cuda") for T in (Tq, Tk, Tk, Tq))
    if activation == "relu":
        q, k = (torch.round(t * 4) / 4 for t in (q, k))
    return gen, *(t.to(torch.bfloat16) for t in (q, k, v, g))


def additive_mask(mask, B: int, Tq: int, Tk: int, causal: bool) -> "torch.Tensor":
    """The [B, 1, Tq, Tk] float32 additive mask of the key mask and the causal rule (j <= i + Tk - Tq)."""
    full = torch.zeros(B, 1, Tq, Tk, device="cuda") if mask is None else mask[:, None, None, :].expand(B, 1, Tq, Tk).clone()
    if causal:
        keep = torch.arange(Tk, device="cuda")[None, :] <= torch.arange(Tq, device="cuda")[:, None] + (Tk - Tq)
        full = full.masked_fill(~keep, -math.inf)
    return full


def torch_bf16(q, k, v, g, mask, causal: bool, activation: str, scale: float):
    """(out, dq, dk, dv) of torch's own bf16 attention."""
    tq, tk, tv = (t.clone().requires_grad_(True) for t in (q, k, v))
    B, _, Tq, _ = q.shape
    add = additive_mask(mask, B, Tq, k.shape[2], causal).to(torch.bfloat16)
    if activation == "softmax":
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=add, scale=scale)
    else:
        out = torch.relu((tq @ tk.transpose(-1, -2)) * scale + add) @ tv
    out.backward(g)
    return out.detach(), tq.grad, tk.grad, tv.grad


def run_ours(q, k, v, g, mask, causal: bool, activation: str, scale: float):
    """(out, lse, dq, dk, dv) of minitorch.fused_attention on the bf16 tensors."""
    tq, tk, tv = (minitorch.from_torch(t).requires_grad_(True) for t in (q, k, v))
    tmask = None if mask is None else minitorch.from_torch(mask)
    out = minitorch.fused_attention(tq, tk, tv, tmask, causal=causal, activation=activation, scale=scale)
    assert out.dtype == minitorch.bfloat16
    out.backward(minitorch.from_torch(g))
    _, lse = on_tensors(CudaKernelOps.attention_fw, tq, tk, tv, tmask, causal, activation, scale)
    grads = (tq.grad, tk.grad, tv.grad)
    assert all(t.dtype == minitorch.bfloat16 for t in grads)
    return tuple(t.to_torch().clone() for t in (out, lse, *grads))


def check(B: int, H: int, Tq: int, Tk: int, D: int, causal: bool, activation: str, mask_kind: str, seed: int = 0) -> None:
    gen, q, k, v, g = bf16_inputs(B, H, Tq, Tk, D, seed, activation)
    mask = make_mask(gen, B, Tk, mask_kind)
    if mask is not None and activation == "relu":
        mask[0] = 0.0  # keeps scale * q.k + m away from 0 (see bf16_inputs)
    scale = 1.0 / math.sqrt(D)
    ours = run_ours(q, k, v, g, mask, causal, activation, scale)
    theirs = torch_bf16(q, k, v, g, mask, causal, activation, scale)
    rq, rk, rv = (t.double().requires_grad_(True) for t in (q, k, v))
    ref, ref_lse = naive_attention(rq, rk, rv, mask, causal, activation, scale)
    ref.backward(g.double())
    refs = (ref.detach(), rq.grad, rk.grad, rv.grad)
    what = f"[{B},{H},{Tq},{Tk},{D}] causal={causal} {activation} mask={mask_kind}"
    for name, mine, torch_out, r in zip(("out", "dq", "dk", "dv"), (ours[0], *ours[2:]), theirs, refs):
        err, bound = rel_err(mine, r), max(2 * rel_err(torch_out, r), FLOOR)
        assert err <= bound, f"{what}: {name} error {err:.3g} > 2 x torch's bf16 error ({bound:.3g})"
    assert rel_err(ours[1], ref_lse) < LSE_TOL, f"{what}: lse error {rel_err(ours[1], ref_lse):.3g}"


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("mask_kind", ["none", "inf", "finite"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("T", [1, 65, 200])
def test_lengths(T: int, D: int, causal: bool, mask_kind: str, activation: str) -> None:
    check(2, 3, T, T, D, causal, activation, mask_kind, seed=T * 1000 + D)


@pytest.mark.parametrize("Tq,Tk", [(7, 129), (33, 200), (1, 1000)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cross_lengths(Tq: int, Tk: int, causal: bool, activation: str) -> None:
    check(2, 2, Tq, Tk, 64, causal, activation, "inf", seed=Tq + Tk)


@pytest.mark.parametrize("D", [7, 20, 40, 65, 100])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_odd_head_dims(D: int, activation: str) -> None:
    """Head dims off the 16-byte path (7, 20, 65, 100) and padded inside a bucket (40, 100)."""
    check(2, 2, 150, 150, D, True, activation, "finite", seed=D)


@pytest.mark.parametrize("causal", [False, True])
def test_gpt2_shape(causal: bool) -> None:
    check(4, 12, 1024, 1024, 64, causal, "softmax", "none", seed=7)


def test_backward_in_groups_of_heads() -> None:
    """Enough heads that the backward's operands (Q, K, V and dO in bf16, the float32 dq: 4 T D 2 + 4 T D
    bytes a head) exceed the GPU's L2, so its grid walks the heads in groups (tile_grid in
    src/includes/attention_common.cuh): on a 50 MiB L2, 18 heads in two groups of 9."""
    T, D, H = 2048, 128, 3
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    heads = l2_bytes // (4 * T * D * 2 + 4 * T * D) + 1
    check(-(-heads // H), H, T, T, D, True, "softmax", "none", seed=11)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_rows_without_keys_are_zero(activation: str) -> None:
    """A batch whose mask removes every key: out, dq, dk, dv zero there (never NaN), lse -inf (softmax)."""
    gen, q, k, v, g = bf16_inputs(3, 2, 70, 70, 64, 3, activation)
    mask = make_mask(gen, 3, 70, "inf")
    assert torch.isneginf(mask[2]).all()
    out, lse, dq, dk, dv = run_ours(q, k, v, g, mask, True, activation, 0.125)
    for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.isfinite(t).all(), f"{name} has a non-finite value"
        assert float(t[2].abs().max()) == 0.0, f"{name} of the fully masked batch is not zero"
    if activation == "softmax":
        assert torch.isneginf(lse[2]).all()


def test_packed_qkv_and_autocast() -> None:
    """fused_attention_qkv on float32 [B, T, 3C] under minitorch.autocast runs the bf16 kernels (bf16
    output) and gives a float32 gradient matching the bf16 reference of the same rounded inputs."""
    B, T, H, D = 2, 90, 4, 32
    gen = torch.Generator(device="cuda").manual_seed(9)
    qkv = torch.randn(B, T, 3 * H * D, generator=gen, device="cuda")
    g = torch.randn(B, H, T, D, generator=gen, device="cuda").to(torch.bfloat16)
    tqkv = minitorch.from_torch(qkv).requires_grad_(True)
    with minitorch.autocast():
        out = minitorch.fused_attention_qkv(tqkv, H, causal=True)
    assert out.dtype == minitorch.bfloat16
    out.backward(minitorch.from_torch(g))
    assert tqkv.grad.dtype == minitorch.float32
    split = qkv.to(torch.bfloat16).double().view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    rq, rk, rv = (split[i].detach().requires_grad_(True) for i in range(3))
    ref, _ = naive_attention(rq, rk, rv, None, True, "softmax", 1.0 / math.sqrt(D))
    ref.backward(g.double())
    ref_grad = torch.stack([t.grad for t in (rq, rk, rv)]).permute(1, 3, 0, 2, 4).reshape(B, T, 3 * H * D)
    theirs = torch_bf16(*(split[i].to(torch.bfloat16) for i in range(3)), g, None, True, "softmax", 1.0 / math.sqrt(D))
    torch_err = max(rel_err(t, r) for t, r in zip(theirs[1:], (rq.grad, rk.grad, rv.grad)))
    assert rel_err(out.to_torch(), ref.detach()) <= max(2 * rel_err(theirs[0], ref.detach()), FLOOR)
    assert rel_err(tqkv.grad.to_torch(), ref_grad) <= max(2 * torch_err, FLOOR)


def run_packed(qkv, g, H: int, mask, causal: bool, activation: str):
    """(out [B, H, T, D], its [B, T, C] view, dqkv) of fused_attention_qkv on bf16 qkv [B, T, 3C], used as
    MultiHeadAttention uses it (out permuted back to [B, T, H, D] and viewed [B, T, C]), with the
    gradient g [B, T, C] of that view."""
    B, T, C3 = qkv.shape
    x = minitorch.from_torch(qkv).requires_grad_(True)
    tmask = None if mask is None else minitorch.from_torch(mask)
    out = minitorch.fused_attention_qkv(x, H, tmask, causal=causal, activation=activation)
    attended = out.permute(0, 2, 1, 3).contiguous().view(B, T, C3 // 3)
    attended.backward(minitorch.from_torch(g))
    return out, attended, x.grad


def run_split(qkv, g, H: int, mask, causal: bool, activation: str):
    """(out [B, T, C], dqkv [B, T, 3C]) of fused_attention on contiguous [B, H, T, D] heads copied out of qkv."""
    B, T, C3 = qkv.shape
    D = C3 // (3 * H)
    split = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4).contiguous()
    q, k, v = (minitorch.from_torch(split[i]).requires_grad_(True) for i in range(3))
    tmask = None if mask is None else minitorch.from_torch(mask)
    out = minitorch.fused_attention(q, k, v, tmask, causal=causal, activation=activation)
    out.backward(minitorch.from_torch(g.view(B, T, H, D).permute(0, 2, 1, 3).contiguous()))
    grads = [t.grad.to_torch().permute(0, 2, 1, 3) for t in (q, k, v)]
    return out.to_torch().permute(0, 2, 1, 3).reshape(B, T, C3 // 3), torch.stack(grads, 2).reshape(B, T, C3)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 7])
def test_packed_path_matches_the_split_path(D: int, causal: bool, activation: str) -> None:
    """fused_attention_qkv on bf16 [B, T, 3C] reads q, k, v from the projection, writes out as
    [B, T, H, D] and dq, dk, dv into one [B, T, 3C] gradient (D = 64: 16-byte loads; D = 7: element by
    element). Only the addressing differs from fused_attention on contiguous heads: out, dk and dv are
    bit-identical, dq (float32 atomics, summed in a varying order, then rounded) within one bf16 step.
    The mask removes some keys of batch 1 and every key of batch 2."""
    B, T, H = 3, 150, 3
    gen = torch.Generator(device="cuda").manual_seed(D + 10 * causal)
    qkv = torch.randn(B, T, 3 * H * D, generator=gen, device="cuda").to(torch.bfloat16)
    g = torch.randn(B, T, H * D, generator=gen, device="cuda").to(torch.bfloat16)
    mask = make_mask(gen, B, T, "inf")
    out, attended, dqkv = run_packed(qkv, g, H, mask, causal, activation)
    C = H * D
    assert out.shape == (B, H, T, D) and out._tensor.strides == (T * C, D, C, 1)
    assert dqkv.dtype == minitorch.bfloat16 and dqkv.shape == (B, T, 3 * C)
    ref_out, ref_grad = run_split(qkv, g, H, mask, causal, activation)
    assert torch.equal(attended.to_torch(), ref_out)
    mine = dqkv.to_torch().view(B, T, 3, C).double()
    ref = ref_grad.view(B, T, 3, C).double()
    assert torch.equal(mine[:, :, 1:], ref[:, :, 1:]), "dk or dv differs"
    floor = 1e-6 * float(ref[:, :, 0].abs().max())  # float32 order effects where the sum cancels
    step = torch.maximum(mine[:, :, 0].abs(), ref[:, :, 0].abs()) * 2.0**-7 + floor
    assert bool(((mine[:, :, 0] - ref[:, :, 0]).abs() <= step).all()), "dq differs by more than one bf16 step"


def test_packed_path_launches_no_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward of fused_attention_qkv in bf16, as MultiHeadAttention runs them, launch one
    attention kernel each way and no copy or cast (convert_kernel's launch_convert, combine's launch_map)."""
    from minitorch.cuda import attention, combine, convert
    from minitorch.cuda.runtime import runtime

    rt = runtime()
    calls = []

    def counted(name: str, launch):
        def run(*args):
            calls.append(name)
            return launch(*args)

        return run

    bf16_lib = rt.lib("attention_bf16_kernel", attention.BF16_SIGNATURES)
    libs = [(rt.lib("convert_kernel", convert.SIGNATURES), "launch_convert"), (combine.lib(rt), "launch_map"),
            (bf16_lib, "launch_attention_bf16_fw"), (bf16_lib, "launch_attention_bf16_bw")]  # fmt: skip
    for lib, name in libs:
        monkeypatch.setattr(lib, name, counted(name, getattr(lib, name)))
    B, T, H, D = 2, 70, 4, 64
    gen = torch.Generator(device="cuda").manual_seed(5)
    qkv = torch.randn(B, T, 3 * H * D, generator=gen, device="cuda").to(torch.bfloat16)
    g = torch.randn(B, T, H * D, generator=gen, device="cuda").to(torch.bfloat16)
    run_packed(qkv, g, H, make_mask(gen, B, T, "finite"), True, "softmax")
    assert calls == ["launch_attention_bf16_fw", "launch_attention_bf16_bw"], calls


def test_mixed_dtypes_raise() -> None:
    """q in bf16 with k, v in float32: NoKernelError before any launch (fused_attention casts them alike)."""
    q = minitorch.from_torch(torch.zeros(1, 1, 4, 8, device="cuda", dtype=torch.bfloat16))
    k = minitorch.from_torch(torch.zeros(1, 1, 4, 8, device="cuda"))
    with pytest.raises(minitorch.NoKernelError, match="attention_fw"):
        CudaKernelOps.attention_fw(q._tensor, k._tensor, k._tensor, None, False, "softmax", 1.0)


def strides(*triples) -> "ctypes.Array":
    """A launcher's strides array: the (batch, head, token) strides of each operand, in order."""
    values = [s for t in triples for s in t]
    return (ctypes.c_longlong * len(values))(*values)


def test_raw_launcher_rejects_bad_sizes_and_strides() -> None:
    lib = kernel_library("attention_bf16_kernel")
    buf = torch.zeros(64, device="cuda")
    p = buf.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    ok = (8, 8, 4)  # [1, 1, 2, 4] contiguous
    fw, bw = strides(*[ok] * 4), strides(*[ok] * 8)
    assert lib.launch_attention_bf16_fw(p, p, p, p, p, None, fw, 1, 1, 2, 2, 129, 0, 0, 1.0, stream) == 1
    assert lib.launch_attention_bf16_fw(p, p, p, p, p, None, fw, 1, 1, 2, 2, 4, 0, 2, 1.0, stream) == 1  # activation
    assert lib.launch_attention_bf16_fw(p, p, p, p, p, None, fw, 1, 1, 0, 2, 4, 0, 0, 1.0, stream) == 1
    assert lib.launch_attention_bf16_fw(p, p, p, p, p, None, None, 1, 1, 2, 2, 4, 0, 0, 1.0, stream) == 1
    negative = strides(ok, (8, 8, -4), ok, ok)  # k
    overlapping = strides(ok, ok, ok, (8, 8, 3))  # rows of out overlap
    assert lib.launch_attention_bf16_fw(p, p, p, p, p, None, negative, 1, 1, 2, 2, 4, 0, 0, 1.0, stream) == 1
    assert lib.launch_attention_bf16_fw(p, p, p, p, p, None, overlapping, 1, 1, 2, 2, 4, 0, 0, 1.0, stream) == 1
    nulls = (None,) * 3  # out, lse, mask
    assert lib.launch_attention_bf16_bw(p, p, p, p, p, p, p, *nulls, p, bw, 1, 1, 2, 2, 4, 0, 0, 1.0, stream) == 1
    assert lib.launch_attention_bf16_bw(p, p, p, p, p, p, p, *nulls, None, bw, 1, 1, 2, 2, 4, 0, 1, 1.0, stream) == 1
    shared_dq_rows = strides((8, 8, 0), *[ok] * 7)
    assert lib.launch_attention_bf16_bw(p, p, p, p, p, p, p, *nulls, p, shared_dq_rows, 1, 1, 2, 2, 4, 0, 1, 1.0, stream) == 1


@pytest.mark.parametrize("shifted", ["grad_out", "out", "dq", "workspace"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_backward_passes_off_the_16_byte_path(activation: str, shifted: str) -> None:
    """D = 64 with one operand off 16-byte alignment (one element; the float32 workspace two, as its
    float2 atomics need 8-byte alignment, which the launcher checks): the passes around the backward
    kernel (zeroing the float32 dq workspace and forming D_i before it, rounding dq after it) run element
    by element where that operand's rows are involved (grad_out, out: D_i, and grad_out the kernel's
    tiles too; dq: the rounding; workspace: both passes) and must agree with the 16-byte path of the
    aligned call: dk, dv and dq within one bf16 step (D_i summed in another order, dq's atomics in a
    varying one). The workspace starts as NaN, so a row the zeroing misses shows. 420 query rows: the
    last block of the passes is partly past the end."""
    B, H, T, D = 2, 3, 70, 64
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v, g = (torch.randn(B, H, T, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    scale = 1.0 / math.sqrt(D)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, -1).contiguous()
    out = (torch.softmax(scores, -1) @ v.float()).to(torch.bfloat16)
    lib = kernel_library("attention_bf16_kernel")
    floats = lib.attention_bf16_bw_workspace_floats(B, H, T, D)
    stream = torch.cuda.current_stream().cuda_stream
    contiguous = (H * T * D, T * D, D)

    def placed(t, shift: int):
        """t's values in a fresh buffer, starting `shift` elements past its (16-byte aligned) start."""
        buf = torch.empty(t.numel() + 2, dtype=t.dtype, device="cuda")
        view = buf[shift:][: t.numel()].view(t.shape)
        view.copy_(t)
        return view

    def run(shift: str):
        grad_out, o = placed(g, int(shift == "grad_out")), placed(out, int(shift == "out"))
        dq = placed(torch.zeros_like(q), int(shift == "dq"))
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        ws = placed(torch.full((floats,), math.nan, device="cuda"), 2 * (shift == "workspace"))
        ptrs = [t.data_ptr() for t in (dq, dk, dv, grad_out, q, k, v, o, lse)]
        code = lib.launch_attention_bf16_bw(*ptrs, None, ws.data_ptr(), strides(*[contiguous] * 8), B, H, T, T, D,
                                            1, ACTIVATIONS.index(activation), scale, stream)  # fmt: skip
        assert code == 0
        return tuple(t.double() for t in (dq, dk, dv))

    ws = placed(torch.zeros(floats, device="cuda"), 1)  # 4-byte aligned only: refused, not a fault
    ptrs = [t.data_ptr() for t in (q, k, v, g, q, k, v, out, lse)]
    code = lib.launch_attention_bf16_bw(*ptrs, None, ws.data_ptr(), strides(*[contiguous] * 8), B, H, T, T, D, 1,
                                        ACTIVATIONS.index(activation), scale, stream)  # fmt: skip
    assert code == 1

    for name, mine, ref in zip(("dq", "dk", "dv"), run(shifted), run("")):
        assert bool(torch.isfinite(mine).all()), f"{name} has a non-finite value"
        step = torch.maximum(mine.abs(), ref.abs()) * 2.0**-7 + 1e-6 * float(ref.abs().max())
        assert bool(((mine - ref).abs() <= step).all()), f"{name} differs by more than one bf16 step"
