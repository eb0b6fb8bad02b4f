"""The bf16 matmul library wired into the CUDA backend: Tensor products dispatch on their dtype
(bfloat16 operands on the bf16 library, mixed ones promoted, float16 refused), the Linear hooks in
bf16 (bias / GELU / ReLU epilogues forward; dx in bf16, dW and dbias in float32 backward), and a
Linear + GELU + Linear block under minitorch.autocast against torch autocast, forward and gradients.

Errors are max|out - ref| / max|ref| against torch float64 on the same bf16-rounded inputs; each must
stay within 2x torch's own bf16 error on those inputs (torch.matmul / torch autocast in bf16 on the
GPU, measured here), or FLOOR where that is smaller (float32 rounding of results that torch rounds
to bf16, e.g. our float32 weight gradients against torch's bf16 ones).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import pytest

import minitorch
from minitorch import bfloat16, float32
from minitorch.fused.linear import feed_forward, linear

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
FLOOR = 1e-5


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def bf16_normal(gen: "torch.Generator", shape: Tuple[int, ...], scale: float = 1.0) -> "torch.Tensor":
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(torch.bfloat16)


def within(mine: float, torch_error: float, what: str) -> None:
    bound = max(2.0 * torch_error, FLOOR)
    assert mine <= bound, f"{what}: error {mine:.3g} vs torch's bf16 {torch_error:.3g} (bound {bound:.3g})"


@pytest.mark.parametrize(
    "a_shape, b_shape, transpose",
    [((33, 65), (65, 17), ""), ((3, 4099), (4099, 7), "a"), ((2, 3, 129, 64), (3, 64, 100), "b"),
     ((4, 257, 96), (96, 131), "ab"), ((5, 0), (0, 9), "")],
)  # fmt: skip
def test_bf16_products_run_on_the_bf16_library(a_shape, b_shape, transpose: str) -> None:
    """a @ b of bfloat16 tensors (transposed views, broadcast batches, odd sizes, K = 0) is bfloat16,
    within 2x torch.matmul's bf16 error."""
    gen = torch.Generator(device="cuda").manual_seed(sum(a_shape) + len(transpose))

    def operand(shape: Tuple[int, ...], t: bool) -> Tuple["torch.Tensor", minitorch.Tensor]:
        """The torch operand and minitorch's view of the same memory (a transposed view where t)."""
        if not t:
            x = bf16_normal(gen, shape)
            return x, minitorch.from_torch(x)
        stored = bf16_normal(gen, (*shape[:-2], shape[-1], shape[-2]))
        n = len(shape)
        return stored.transpose(-1, -2), minitorch.from_torch(stored).permute(*range(n - 2), n - 1, n - 2)

    (ta, a), (tb, b) = operand(a_shape, "a" in transpose), operand(b_shape, "b" in transpose)
    assert (a.is_contiguous(), b.is_contiguous()) == ("a" not in transpose, "b" not in transpose)
    out = a @ b
    assert out.dtype is bfloat16 and out.backend.cuda
    ref = torch.matmul(ta.double(), tb.double())
    if a_shape[-1] == 0:
        assert (out.to_torch() == 0).all(), "a product over K = 0 is zeros"
        return
    within(rel_err(out.to_torch(), ref), rel_err(torch.matmul(ta, tb), ref), f"{a_shape} @ {b_shape}")


def test_mixed_products_promote_and_float16_is_refused() -> None:
    """bf16 @ float32 is the float32 product of the (exactly) widened operands, bool @ bf16 a bf16
    product; float16 has no product kernel and says so."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    ta, tb = bf16_normal(gen, (70, 90)), torch.randn((90, 50), generator=gen, device="cuda")
    out = minitorch.from_torch(ta) @ minitorch.from_torch(tb)
    assert out.dtype is float32
    assert rel_err(out.to_torch(), ta.double() @ tb.double()) < 1e-5
    signs = torch.randn((30, 70), generator=gen, device="cuda")
    product = (minitorch.from_torch(signs) > 0.0) @ minitorch.from_torch(ta)
    assert product.dtype is bfloat16
    ref = (signs > 0).double() @ ta.double()
    within(rel_err(product.to_torch(), ref), rel_err((signs > 0).to(torch.bfloat16) @ ta, ref), "bool @ bf16")
    half = [minitorch.from_torch(t).to(minitorch.float16) for t in (ta, tb)]
    with pytest.raises(minitorch.NoKernelError, match="no float16 CUDA kernel for 'matmul'"):
        half[0] @ half[1]


def _torch_linear(inputs: Dict[str, "torch.Tensor"], activation: Optional[str], dtype, autocast: bool):
    leaves = {k: v.to(dtype).detach().requires_grad_(k != "g") for k, v in inputs.items()}
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        pre = torch.nn.functional.linear(leaves["x"], leaves["w"].T, leaves.get("b"))
        y = {None: pre, "gelu": torch.nn.functional.gelu(pre, approximate="tanh"), "relu": torch.relu(pre)}[activation]
    y.backward(leaves["g"].to(y.dtype))
    return {"y": y, **{f"d{k}": leaves[k].grad for k in leaves if k != "g"}}


@pytest.mark.parametrize("rows, n_in, n_out", [(300, 96, 130), (65, 7, 33), (1024, 768, 2304)])
@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_under_autocast_matches_torch_autocast(rows: int, n_in: int, n_out: int, activation, bias: bool) -> None:
    """fused.linear of float32 leaves under autocast: bf16 output (the epilogue's bias and activation
    in float32), float32 gradients for the float32 leaves, dW and dbias summed in float32; each within
    2x torch autocast's error against float64 on the same bf16-rounded inputs."""
    gen = torch.Generator(device="cuda").manual_seed(rows + n_in + n_out)
    inputs = {"x": bf16_normal(gen, (rows, n_in)), "w": bf16_normal(gen, (n_in, n_out), n_in**-0.5),
              "g": bf16_normal(gen, (rows, n_out))}  # fmt: skip
    if bias:
        inputs["b"] = bf16_normal(gen, (n_out,), 0.5)
    exact = _torch_linear(inputs, activation, torch.float64, autocast=False)
    theirs = _torch_linear(inputs, activation, torch.float32, autocast=True)
    leaves = {k: minitorch.from_torch(v.float().contiguous()).requires_grad_(k != "g") for k, v in inputs.items()}
    with minitorch.autocast():
        y = linear(leaves["x"], leaves["w"].T, leaves.get("b"), activation)  # w is [in, out]: torch's layout transposed
    assert y.dtype is bfloat16
    y.backward(leaves["g"].to(bfloat16))
    mine = {"y": y, **{f"d{k}": leaves[k].grad for k in leaves if k != "g"}}
    for name, ref in exact.items():
        if name != "y":
            assert mine[name].dtype is float32, name
        within(rel_err(mine[name].to_torch(), ref.detach()), rel_err(theirs[name].detach(), ref.detach()), name)


@pytest.mark.parametrize("activation, fused", [("gelu", False), ("gelu", True), ("relu", True)])
def test_linear_gelu_linear_block_under_autocast_matches_torch_autocast(activation: str, fused: bool) -> None:
    """The block of an MLP, x -> Linear + activation -> Linear, under autocast, as two linear calls and
    as feed_forward (whose second product's input gradient goes through the activation's derivative
    in its epilogue): output and every gradient within 2x torch autocast's bf16 error, and as far from
    torch autocast's result."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    act = {"gelu": lambda h: torch.nn.functional.gelu(h, approximate="tanh"), "relu": torch.relu}[activation]
    B, C, M = 512, 384, 1536
    inputs = {"x": bf16_normal(gen, (B, C)), "w1": bf16_normal(gen, (C, M), C**-0.5), "b1": bf16_normal(gen, (M,), 0.1),
              "w2": bf16_normal(gen, (M, C), M**-0.5), "b2": bf16_normal(gen, (C,), 0.1), "g": bf16_normal(gen, (B, C))}  # fmt: skip

    def torch_block(dtype, autocast: bool):
        t = {k: v.to(dtype).detach().requires_grad_(k != "g") for k, v in inputs.items()}
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            h = act(torch.nn.functional.linear(t["x"], t["w1"].T, t["b1"]))
            y = torch.nn.functional.linear(h, t["w2"].T, t["b2"])
        y.backward(t["g"].to(y.dtype))
        return [y] + [t[k].grad for k in ("x", "w1", "b1", "w2", "b2")]

    exact, theirs = torch_block(torch.float64, False), torch_block(torch.float32, True)
    leaves = {k: minitorch.from_torch(v.float().contiguous()).requires_grad_(k != "g") for k, v in inputs.items()}
    with minitorch.autocast():
        if fused:
            y = feed_forward(leaves["x"], leaves["w1"].T, leaves["b1"], leaves["w2"].T, leaves["b2"], activation)
        else:
            y = linear(linear(leaves["x"], leaves["w1"].T, leaves["b1"], activation), leaves["w2"].T, leaves["b2"])
    y.backward(leaves["g"].to(bfloat16))
    mine = [y] + [leaves[k].grad for k in ("x", "w1", "b1", "w2", "b2")]
    for name, m, t, ref in zip(("y", "dx", "dw1", "db1", "dw2", "db2"), mine, theirs, exact):
        bound = rel_err(t.detach(), ref.detach())
        within(rel_err(m.to_torch(), ref.detach()), bound, name)
        within(rel_err(m.to_torch(), t.detach().double()), bound, f"{name} from torch autocast's")


@pytest.mark.parametrize("rows, n_in, n_out", [(300, 96, 130), (65, 7, 33), (4096, 768, 768)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_residual_is_added_in_the_epilogue(rows: int, n_in: int, n_out: int, bias: bool) -> None:
    """linear(x, w, b, residual=r) in bf16: r + x @ w + b rounded once (the epilogue adds r as it
    writes), within 2x the error of torch's bf16 (x @ w + b) + r against float64; r's gradient is the
    output's, the others those of linear without the residual."""
    gen = torch.Generator(device="cuda").manual_seed(rows + n_out)
    x, w, r, g = (bf16_normal(gen, s, sc) for s, sc in (((rows, n_in), 1.0), ((n_in, n_out), n_in**-0.5),
                                                           ((rows, n_out), 1.0), ((rows, n_out), 1.0)))  # fmt: skip
    b = bf16_normal(gen, (n_out,), 0.5) if bias else None
    ref = x.double() @ w.double() + r.double() + (0 if b is None else b.double())
    theirs = torch.nn.functional.linear(x, w.T, b) + r
    leaves = [minitorch.from_torch(t).requires_grad_(True) for t in (x, w, r)]
    tb = None if b is None else minitorch.from_torch(b).requires_grad_(True)
    y = linear(leaves[0], leaves[1].T, tb, residual=leaves[2])
    assert y.dtype is bfloat16
    within(rel_err(y.to_torch(), ref), rel_err(theirs, ref), "y")
    y.backward(minitorch.from_torch(g))
    assert torch.equal(leaves[2].grad.to_torch(), g)
    plain = [minitorch.from_torch(t).requires_grad_(True) for t in (x, w)]
    linear(plain[0], plain[1].T, None if b is None else minitorch.from_torch(b)).backward(minitorch.from_torch(g))
    for mine, same in zip(leaves[:2], plain):
        assert torch.equal(mine.grad.to_torch(), same.grad.to_torch())


def test_feed_forward_residual_and_the_float32_path() -> None:
    """feed_forward(..., residual=r) in bf16 equals the kernel-made block plus r within bf16's rounding
    of the sum; in float32 on CUDA (the matmul, then r added in place) it equals the composed sum."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    x, w1, w2, r = (bf16_normal(gen, s, sc) for s, sc in (((256, 64), 1.0), ((256, 64), 0.125), ((64, 256), 0.0625),
                                                            ((256, 64), 1.0)))  # fmt: skip
    mx, mw1, mw2, mr = (minitorch.from_torch(t) for t in (x, w1, w2, r))
    fused = feed_forward(mx, mw1, None, mw2, None, "gelu", residual=mr).to_torch().double()
    block = feed_forward(mx, mw1, None, mw2, None, "gelu").to_torch().double()
    assert (fused - (block + r.double())).abs().max() <= 2 * 2**-8 * (block + r.double()).abs().max()
    fx, fw1, fw2, fr = (minitorch.from_torch(t.float()) for t in (x, w1, w2, r))
    out = feed_forward(fx, fw1, None, fw2, None, "gelu", residual=fr)
    assert out.dtype is float32
    expected = feed_forward(fx, fw1, None, fw2, None, "gelu") + fr
    assert torch.allclose(out.to_torch(), expected.to_torch(), rtol=0, atol=1e-6)


def test_matmul_bf16_addend_with_a_bias() -> None:
    """matmul_bf16.matmul(a, b, bias=, addend=): a @ b + bias + addend in one epilogue, float32 and bf16
    out, the K-split path included (few tiles, long K); an addend of another dtype is refused."""
    from minitorch.cuda import matmul_bf16

    gen = torch.Generator(device="cuda").manual_seed(9)
    for (M, K, N), dtype in (((300, 96, 130), torch.bfloat16), ((64, 8192, 96), torch.float32)):
        a, b = bf16_normal(gen, (M, K)), bf16_normal(gen, (K, N), K**-0.5)
        bias = torch.randn(N, generator=gen, device="cuda").to(dtype)
        add = torch.randn(M, N, generator=gen, device="cuda").to(dtype)
        out = matmul_bf16.matmul(a, b, bias=bias, addend=add, out_dtype=dtype)
        ref = a.double() @ b.double() + bias.double() + add.double()
        theirs = (a @ b).to(dtype) + bias + add if dtype == torch.bfloat16 else a.float() @ b.float() + bias + add
        within(rel_err(out, ref), rel_err(theirs, ref), f"addend {dtype} [{M}, {K}] @ [{K}, {N}]")
    with pytest.raises(ValueError, match="addend must be a torch.bfloat16"):
        matmul_bf16.matmul(a, b, addend=add)
