"""The bf16 tensor-core matmul library (src/matmul_bf16_kernel.cu, through minitorch.cuda.matmul_bf16)
against torch float64 on the same bf16 inputs.

Inputs are N(0, 1) values rounded to bf16 (views for transposes, broadcast batch dims with stride 0);
outputs are filled with NaN before each call so that an unwritten element fails. Errors are
max|out - ref| / max|ref|; each must stay within 2x torch's own error on the same inputs (torch.matmul in
bf16, measured here, with the same epilogue in bf16 ops), or FLOOR (float32 rounding) where that is
smaller. "aligned" operands have rows of a multiple of 8 elements (16 bytes): on sm_90a they take the
TMA + wgmma kernel, the others the mma.sync kernel.
"""

from __future__ import annotations

from typing import Optional, Tuple

import pytest

from minitorch.cuda import matmul_bf16
from minitorch.cuda.layout import layout
from minitorch.cuda.runtime import CudaShapeError, load_library

torch = pytest.importorskip("torch")

FLOOR = 1e-6
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


def operand(gen, shape: Tuple[int, ...], transposed: bool, aligned: bool = False) -> "torch.Tensor":
    """bf16 N(0, 1) tensor of `shape`; transposed: a view of storage with the last two dims swapped;
    aligned: the stored rows padded to a multiple of 8 elements (a view of their first part)."""
    stored = (*shape[:-2], shape[-1], shape[-2]) if transposed else shape
    inner = stored[-1]
    padded = (inner + 7) // 8 * 8 if aligned else inner
    x = torch.randn((*stored[:-1], padded), generator=gen, device="cuda").to(torch.bfloat16)[..., :inner]
    return x.transpose(-1, -2) if transposed else x


def gelu64(x: "torch.Tensor") -> "torch.Tensor":
    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


def act64(x: "torch.Tensor", activation: Optional[str]) -> "torch.Tensor":
    return gelu64(x) if activation == "gelu" else torch.relu(x) if activation == "relu" else x


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    out = out.double()
    if out.numel() == 0:
        return 0.0
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def torch_errors(a, b, ref_pre, ref, bias, activation) -> Tuple[float, float]:
    """torch's bf16 error on the pre-activation and on the output: its matmul, + bias, activation."""
    pre = torch.matmul(a, b)
    if bias is not None:
        pre = pre + bias.to(torch.bfloat16)
    y = pre
    if activation is not None:
        y = torch.nn.functional.gelu(pre, approximate="tanh") if activation == "gelu" else torch.relu(pre)
    return rel_err(pre, ref_pre), rel_err(y, ref)


def check_product(
    a, b, out_dtype=torch.bfloat16, *, bias: bool = False, activation: Optional[str] = None, pad: int = 0,
    workspace: Optional["torch.Tensor"] = None, beside: bool = False, keep_pre: bool = True,
) -> None:  # fmt: skip
    """out = act(a @ b + bias) in out_dtype within 2x torch's bf16 error (the pre-activation too, where an
    activation stores it, unless keep_pre is False); pad: output rows that many elements longer than N
    (left untouched); beside: the planner's tile shapes for a product that runs beside other work."""
    gen = torch.Generator(device="cuda").manual_seed(a.shape[-1] + pad)
    M, N = a.shape[-2], b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    wide = torch.full((*batch, M, N + pad), float("nan"), dtype=out_dtype, device="cuda")
    out = wide[..., :N]
    pre_wide = torch.full_like(wide, float("nan")) if activation is not None and keep_pre else None
    pre = None if pre_wide is None else pre_wide[..., :N]
    b_vec = torch.randn(N, generator=gen, device="cuda").to(out_dtype) if bias else None
    matmul_bf16.matmul(a, b, out=out, bias=b_vec, activation=activation, pre_act=pre, workspace=workspace,
                       beside=beside)
    assert torch.isnan(wide[..., N:]).all(), "a column beyond N was written"
    assert pre_wide is None or torch.isnan(pre_wide[..., N:]).all(), "a pre_act column beyond N was written"
    ref_pre = a.double() @ b.double() + (b_vec.double() if bias else 0.0)
    ref = act64(ref_pre, activation)
    torch_pre, torch_out = torch_errors(a, b, ref_pre, ref, b_vec, activation)
    ours = rel_err(out, ref)
    assert ours <= max(2 * torch_out, FLOOR), f"error {ours:.3g} > 2 x torch's {torch_out:.3g}"
    if pre is not None:
        ours_pre = rel_err(pre, ref_pre)
        assert ours_pre <= max(2 * torch_pre, FLOOR), f"pre-activation error {ours_pre:.3g} > 2 x torch's {torch_pre:.3g}"


DTYPES = [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_layouts(out_dtype, aligned: bool, a_t: bool, b_t: bool) -> None:
    """Every layout autodiff produces (A and B row- or column-major, transposed views read in place), odd
    sizes, partial tiles at every edge."""
    gen = torch.Generator(device="cuda").manual_seed(1 + 2 * a_t + 4 * b_t + 8 * aligned)
    check_product(operand(gen, (197, 203), a_t, aligned), operand(gen, (203, 131), b_t, aligned), out_dtype)
    check_product(operand(gen, (300, 1001), a_t, aligned), operand(gen, (1001, 517), b_t, aligned), out_dtype)


# bf16_tma.cuh's kTmaShapes: 128 x 256, 128 x 192, 128 x 128, 192 x 128, 192 x 96, 64 x 128, 192 x 192 in
# two 96-row halves of a K-major B (forced on another B, the planner's shape runs), and 64 x 96 in 8-block
# clusters (the last two and 192 x 96 on bf16_cluster.cuh's kernel)
TMA_SHAPES = 8
HALVES_SHAPE = 6
CLUSTER_SHAPE = 7


@pytest.mark.parametrize("shape", range(TMA_SHAPES))
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_every_tma_shape(monkeypatch, shape: int, a_t: bool, b_t: bool) -> None:
    """Each Hopper tile shape, forced by MINITORCH_BF16_TMA_SHAPE (the planner gives the 192-row ones and
    64 x 128 only to products with no more rows than columns), in every operand layout: partial tiles at
    every edge, a long K with splits, both output dtypes. On other GPUs the knob changes nothing and the
    products still hold."""
    monkeypatch.setenv("MINITORCH_BF16_TMA_SHAPE", str(shape))
    gen = torch.Generator(device="cuda").manual_seed(shape + 8 * a_t + 16 * b_t)
    check_product(operand(gen, (389, 264), a_t, True), operand(gen, (264, 296), b_t, True))
    check_product(operand(gen, (200, 4096), a_t, True), operand(gen, (4096, 392), b_t, True), torch.float32)


@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_clustered_tiles(monkeypatch, a_t: bool, b_t: bool) -> None:
    """The clustered 64 x 96 tiles (each A tile loaded in halves by the two blocks of its row, each B tile in
    quarters by the four of its column, multicast): GPT-2's attention projection weight gradient as the
    planner gives it to them, then with the shape forced: clusters whose tiles lie partly or wholly past
    M and N, more clusters than fit on the GPU at once (a batch of 40: blocks take several units), a
    broadcast batch, K splits with float32 partial sums."""
    gen = torch.Generator(device="cuda").manual_seed(40 + a_t + 2 * b_t)
    check_product(operand(gen, (768, 4096), a_t, True), operand(gen, (4096, 768), b_t, True))
    monkeypatch.setenv("MINITORCH_BF16_TMA_SHAPE", str(CLUSTER_SHAPE))
    check_product(operand(gen, (72, 520), a_t, True), operand(gen, (520, 200), b_t, True), pad=8)
    check_product(operand(gen, (40, 256, 128), a_t, True), operand(gen, (40, 128, 192), b_t, True))
    check_product(operand(gen, (300, 192), a_t, True), operand(gen, (3, 192, 104), b_t, True), torch.float32)
    check_product(operand(gen, (136, 8192), a_t, True), operand(gen, (8192, 96), b_t, True), torch.float32)


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("M, N, K", [(768, 3072, 4096), (2304, 768, 4096), (768, 768, 16384)])
def test_weight_gradient_shapes(beside: bool, M: int, N: int, K: int) -> None:
    """GPT-2's weight-gradient products (both operands transposed views, float32 out), as the step runs
    them on the side stream (beside: 128-row tiles only) and as they run alone (192-row tiles where M <=
    N), with and without K splits."""
    gen = torch.Generator(device="cuda").manual_seed(M + N + beside)
    check_product(operand(gen, (M, K), True, True), operand(gen, (K, N), False, True), torch.float32, beside=beside)


@pytest.mark.parametrize("shape", range(TMA_SHAPES))
@pytest.mark.parametrize("activation, keep_pre", [(None, False), ("gelu", True), ("gelu", False), ("relu", True)])
def test_forward_epilogues_every_tma_shape(monkeypatch, shape: int, activation: Optional[str], keep_pre: bool) -> None:
    """The forward epilogues (+ bias, activation, the pre-activation kept or not; float32 without one) on
    each Hopper tile shape: the bf16 outputs without an activation store through TMA (store_tile_tma),
    the others through the staged epilogue. Edges of every box (rows and columns not multiples of 32 or
    64), output rows padded past N (left untouched), batches, several tiles per block."""
    monkeypatch.setenv("MINITORCH_BF16_TMA_SHAPE", str(shape))
    gen = torch.Generator(device="cuda").manual_seed(100 + shape)
    a, b = operand(gen, (1000, 136), False, True), operand(gen, (136, 1400), False, True)
    check_product(a, b, bias=True, activation=activation, keep_pre=keep_pre, pad=8)
    if activation is None:
        check_product(a, b, torch.float32, pad=4)
        check_product(operand(gen, (3, 77, 64), False, True), operand(gen, (64, 200), False, True))


@pytest.mark.parametrize("shape", [None, 1, 3, 4, HALVES_SHAPE])
def test_transposed_products(monkeypatch, shape: Optional[int]) -> None:
    """Products with more rows than columns, no epilogue and a bf16 output run as their transpose on
    128- or 192-row tiles (bf16_tma.cuh's runs_transposed), stored back transposed: as the planner takes
    them, the fc proj weight gradient of bench_matmul.py (K at least the rows, 192 x 96), the qkv product
    with W row-major or a transposed view (192 x 192) and the qkv input gradient dY W^T (both operands
    K-major, 128 x 192); then with a 128- or 192-row shape forced, sizes whose transpose makes more tiles
    (so that it is taken) in every operand layout, partial boxes at every edge, padded output rows and a
    broadcast batch."""
    if shape is not None:
        monkeypatch.setenv("MINITORCH_BF16_TMA_SHAPE", str(shape))
    gen = torch.Generator(device="cuda").manual_seed(7 if shape is None else shape)
    check_product(operand(gen, (3072, 4096), True, True), operand(gen, (4096, 768), False, True))
    if shape is None:
        for b_t in (False, True):
            check_product(operand(gen, (4096, 768), False, True), operand(gen, (768, 2304), b_t, True))
        check_product(operand(gen, (4096, 2304), False, True), operand(gen, (2304, 768), True, True))
        return
    M, K, N = (1000, 1100, 150) if shape == 1 else (770, 800, 88)  # the transpose makes more tiles
    for a_t in (False, True):
        for b_t in (False, True):
            check_product(operand(gen, (M, K), a_t, True), operand(gen, (K, N), b_t, True), pad=8)
    check_product(operand(gen, (3, 300, 320), False, True), operand(gen, (320, 40), False, True))


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize(
    "M, N, K",
    [(1, 1, 1), (1, 4099, 7), (4099, 1, 13), (17, 31, 1), (2, 3, 5), (64, 64, 64), (128, 256, 64), (131, 257, 4099),
     (509, 1021, 67), (4099, 127, 1031), (1031, 4099, 131)],
)  # fmt: skip
def test_sizes(aligned: bool, M: int, N: int, K: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(M * 7 + N * 3 + K)
    a_t, b_t = M % 2 == 0, N % 3 == 0
    check_product(operand(gen, (M, K), a_t, aligned), operand(gen, (K, N), b_t, aligned))


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("M, N, K", [(64, 64, 16384), (200, 130, 16384), (768, 768, 4096), (768, 3072, 4096)])
def test_long_k(out_dtype, aligned: bool, M: int, N: int, K: int) -> None:
    """Few output tiles and long K: K splits (partial sums added in order by split_k_reduce; 768 x 3072
    has more units than blocks), and the same product without workspace (no splits). A rerun gives the
    same bits."""
    gen = torch.Generator(device="cuda").manual_seed(K + M + aligned)
    a, b = operand(gen, (M, K), M == 768, aligned), operand(gen, (K, N), False, aligned)
    check_product(a, b, out_dtype)
    check_product(a, b, out_dtype, workspace=torch.empty(0, dtype=torch.uint8, device="cuda"))
    first, second = (matmul_bf16.matmul(a, b, out_dtype=out_dtype) for _ in range(2))
    assert torch.equal(first, second)


@pytest.mark.parametrize("aligned", [False, True])
def test_batch_broadcast(aligned: bool) -> None:
    """Two batch dims with broadcasting (the mma.sync kernel), one batch dim with both operands batched,
    and a weight shared by the batch (stride 0: on sm_90a the TMA kernel's unbatched tensor map)."""
    gen = torch.Generator(device="cuda").manual_seed(9 + aligned)
    a = operand(gen, (3, 1, 45, 33), False, aligned).expand(3, 4, 45, 33)
    check_product(a, operand(gen, (1, 4, 33, 29), True, aligned).expand(3, 4, 33, 29))
    x = operand(gen, (5, 200, 136), False, aligned)
    check_product(x, operand(gen, (5, 136, 72), True, aligned), torch.float32)
    w = operand(gen, (136, 264), False, aligned).expand(5, 136, 264)
    check_product(x, w, bias=True, activation="gelu")
    check_product(operand(gen, (5, 200, 136), True, aligned), w)  # x^T per batch matrix: M-major A


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("M, N, K", [(100, 132, 70), (37, 45, 8192), (300, 520, 200)])
def test_epilogues(out_dtype, activation: Optional[str], aligned: bool, M: int, N: int, K: int) -> None:
    """Bias, GELU (tanh form) and ReLU with the pre-activation stored, on direct and split-K products."""
    gen = torch.Generator(device="cuda").manual_seed(K + N + aligned)
    a, b = operand(gen, (M, K), False, aligned), operand(gen, (K, N), M == 300, aligned)
    check_product(a, b, out_dtype, bias=True, activation=activation)


def act_grad64(pre: "torch.Tensor", activation: str) -> "torch.Tensor":
    """The derivative of GELU (tanh form) or ReLU at pre, in float64."""
    x = pre.double()
    if activation == "relu":
        return (x > 0).double()
    c = (2.0 / torch.pi) ** 0.5
    t = torch.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


def torch_act_backward(grad: "torch.Tensor", pre: "torch.Tensor", activation: str) -> "torch.Tensor":
    """torch's own bf16 backward of GELU (tanh form) or ReLU: grad times the derivative at pre."""
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, pre, approximate="tanh")
    return torch.ops.aten.threshold_backward(grad, pre, 0.0)


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("M, N, K", [(100, 132, 70), (37, 45, 8192), (300, 520, 200), (256, 3072, 768)])
def test_activation_grad_epilogues(out_dtype, activation: str, aligned: bool, M: int, N: int, K: int) -> None:
    """out = (a @ b) * act'(pre_act), pre_act read (a Linear's input gradient through the activation
    that made its input), on direct and split-K products: within 2x torch's bf16 error (its matmul,
    then its own activation backward in bf16) against float64; pre_act left as it was."""
    gen = torch.Generator(device="cuda").manual_seed(K + N + 3 * aligned)
    a, b = operand(gen, (M, K), False, aligned), operand(gen, (K, N), M == 300, aligned)
    pre = (torch.randn((M, N), generator=gen, device="cuda") * 2).to(out_dtype)
    kept = pre.clone()
    out = torch.full((M, N), float("nan"), dtype=out_dtype, device="cuda")
    matmul_bf16.matmul(a, b, out=out, pre_act=pre, activation_grad=activation)
    ref = (a.double() @ b.double()) * act_grad64(pre, activation)
    product = torch.matmul(a, b)
    theirs = torch_act_backward(product, pre.to(torch.bfloat16), activation)
    ours, torch_err = rel_err(out, ref), rel_err(theirs, ref)
    assert ours <= max(2 * torch_err, FLOOR), f"error {ours:.3g} > 2 x torch's {torch_err:.3g}"
    assert torch.equal(pre, kept)
    with pytest.raises(ValueError, match="activation_grad"):
        matmul_bf16.matmul(a, b, out=out, pre_act=pre, activation_grad=activation, bias=out[0])


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("M, N, K", [(100, 132, 70), (256, 3072, 768)])
def test_kept_derivative_epilogues(activation: str, aligned: bool, M: int, N: int, K: int) -> None:
    """keep="derivative": out = act(a @ b + bias) and pre_act = act'(a @ b + bias), each within 2x
    torch's bf16 error (its product, bias and activation, and its activation backward of ones at its
    bf16 pre-activation); then activation_grad="derivative" multiplies a second product by that kept
    derivative: within 2x the error of torch's chain (its product, then gelu / threshold backward at
    its bf16 pre-activation) against float64."""
    gen = torch.Generator(device="cuda").manual_seed(K + N + aligned)
    a, b = operand(gen, (M, K), False, aligned), operand(gen, (K, N), False, aligned)
    b_vec = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    kept = torch.full_like(out, float("nan"))
    matmul_bf16.matmul(a, b, out=out, bias=b_vec, activation=activation, pre_act=kept, keep="derivative")
    ref_pre = a.double() @ b.double() + b_vec.double()
    torch_pre = torch.matmul(a, b) + b_vec
    torch_grad = torch_act_backward(torch.ones_like(torch_pre), torch_pre, activation)
    _, torch_out = torch_errors(a, b, ref_pre, act64(ref_pre, activation), b_vec, activation)
    assert rel_err(out, act64(ref_pre, activation)) <= max(2 * torch_out, FLOOR)
    ref_grad = act_grad64(ref_pre, activation)
    assert rel_err(kept, ref_grad) <= max(2 * rel_err(torch_grad, ref_grad), FLOOR)

    a2, b2 = operand(gen, (M, 64), False, aligned), operand(gen, (64, N), False, aligned)
    dx = torch.full_like(out, float("nan"))
    matmul_bf16.matmul(a2, b2, out=dx, pre_act=kept, activation_grad="derivative")
    ref = (a2.double() @ b2.double()) * ref_grad
    theirs = torch_act_backward(torch.matmul(a2, b2), torch_pre, activation)
    ours, torch_err = rel_err(dx, ref), rel_err(theirs, ref)
    assert ours <= max(2 * torch_err, FLOOR), f"error {ours:.3g} > 2 x torch's {torch_err:.3g}"
    with pytest.raises(ValueError, match="keep"):
        matmul_bf16.matmul(a, b, out=out, activation=activation, pre_act=kept, keep="both")


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_activation_without_bias_and_empty_k(activation: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    check_product(operand(gen, (50, 40), True), operand(gen, (40, 30), False), activation=activation)
    a, b = operand(gen, (5, 0), False), operand(gen, (0, 7), False)  # K = 0: out = act(bias)
    bias = torch.randn(7, generator=gen, device="cuda")
    out = matmul_bf16.matmul(a, b, out_dtype=torch.float32, bias=bias, activation=activation)
    assert rel_err(out, act64(bias.double(), activation).expand(5, 7)) <= FLOOR


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("M, N, K", [(33, 65, 100), (64, 128, 20000), (768, 3072, 4096)])
def test_accumulate(out_dtype, aligned: bool, M: int, N: int, K: int) -> None:
    """out += a @ b (weight gradients summed over micro-batches), direct and split-K."""
    gen = torch.Generator(device="cuda").manual_seed(K + aligned)
    a, b = operand(gen, (M, K), True, aligned), operand(gen, (K, N), False, aligned)
    out = torch.randn(M, N, generator=gen, device="cuda").to(out_dtype)
    ref = out.double() + a.double() @ b.double()
    torch_err = rel_err(out + torch.matmul(a, b).to(out_dtype), ref)
    matmul_bf16.matmul(a, b, out=out, accumulate=True)
    assert rel_err(out, ref) <= max(2 * torch_err, FLOOR)


@pytest.mark.parametrize("product", ["fwd", "dX", "dW"])
@pytest.mark.parametrize("layer", ["fc", "attn proj"])
def test_gpt2_products(product: str, layer: str) -> None:
    """GPT-2 layers' three products (4096 tokens) in the layouts autodiff gives them: x @ W, dy @ W^T,
    x^T @ dy (weight gradients in float32)."""
    gen = torch.Generator(device="cuda").manual_seed(len(product) + len(layer))
    cin, cout = (768, 3072) if layer == "fc" else (768, 768)
    x, w, dy = (operand(gen, shape, False) for shape in ((4096, cin), (cin, cout), (4096, cout)))
    a, b = {"fwd": (x, w), "dX": (dy, w.t()), "dW": (x.t(), dy)}[product]
    activation = "gelu" if product == "fwd" and layer == "fc" else None
    check_product(a, b, torch.float32 if product == "dW" else torch.bfloat16, bias=product == "fwd", activation=activation)


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("pad", [1, 8])
def test_output_row_stride(out_dtype, pad: int) -> None:
    """Output rows ldc = N + pad elements apart (pair stores only where ldc allows), direct and split-K,
    whole and ragged tiles."""
    gen = torch.Generator(device="cuda").manual_seed(pad)
    for M, N, K, aligned in [(150, 70, 96, False), (64, 60, 8192, True), (256, 768, 96, True)]:
        check_product(operand(gen, (M, K), False, aligned), operand(gen, (K, N), M != 150, aligned), out_dtype, pad=pad)


def test_strided_and_misaligned() -> None:
    """Neither dim at stride 1 (a step-2 slice), and a base one element past a 16-byte boundary: the
    element-by-element loads."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    a = operand(gen, (70, 2 * 90), False)[:, ::2]
    b = torch.randn(90 * 64 + 1, generator=gen, device="cuda").to(torch.bfloat16)[1:].view(90, 64)
    check_product(a, b)
    check_product(a, b, torch.float32, bias=True, activation="relu")


@pytest.mark.parametrize("aligned", [False, True])
def test_graph_replay(aligned: bool) -> None:
    """A split-K product and a GELU epilogue captured in a CUDA graph with a given workspace: every replay
    gives the eager result's bits, also after the workspace held other data."""
    gen = torch.Generator(device="cuda").manual_seed(21 + aligned)
    M, N, K = 768, 768, 16384  # few tiles and a long K: split
    a, b = operand(gen, (M, K), True, aligned), operand(gen, (K, N), False, aligned)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    ws = torch.empty(max(matmul_bf16.workspace_bytes(M, N, K, 1, strides), 1), dtype=torch.uint8, device="cuda")
    bias = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
    eager = matmul_bf16.matmul(a, b, out_dtype=torch.float32, workspace=ws)
    eager_gelu = matmul_bf16.matmul(a, b, bias=bias, activation="gelu", workspace=ws)
    out = torch.full((M, N), float("nan"), device="cuda")
    out_gelu = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        matmul_bf16.matmul(a, b, out=out, workspace=ws)
        matmul_bf16.matmul(a, b, out=out_gelu, bias=bias, activation="gelu", workspace=ws)
    for fill in (0, 255, 7):
        ws.fill_(fill)
        out.fill_(float("nan"))
        out_gelu.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and torch.equal(out_gelu, eager_gelu)


def test_bad_input_is_refused() -> None:
    gen = torch.Generator(device="cuda").manual_seed(2)
    a, b = operand(gen, (4, 6), False), operand(gen, (5, 3), False)
    with pytest.raises(CudaShapeError, match=r"\(4, 6\).*\(5, 3\)"):
        matmul_bf16.matmul(a, b)
    with pytest.raises(ValueError, match="bfloat16"):
        matmul_bf16.matmul(a.float(), operand(gen, (6, 3), False))
    with pytest.raises(CudaShapeError, match="bias"):
        matmul_bf16.matmul(a, operand(gen, (6, 3), False), bias=torch.zeros(4, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(ValueError, match="accumulate"):
        matmul_bf16.matmul(a, operand(gen, (6, 3), False), accumulate=True)
    lib = load_library("matmul_bf16_kernel", matmul_bf16.SIGNATURES)
    stream = torch.cuda.current_stream().cuda_stream
    code = lib.launch_matmul_bf16(
        None, 1, 2, None, None, 2, 2, 2, 2, 1, 2, 1, layout((), ()), layout((), ()), None, 2, None, 1, None, 0, None, 0, stream,
    )  # fmt: skip
    assert code != 0  # accumulate takes epilogue 0 or 1 (no activation)
    code = lib.launch_matmul_bf16(
        None, 1, 1, None, None, 2, 2, 2, 2, 1, 2, 1, layout((), ()), layout((), ()), None, 0, None, 0, None, 0, None, 0, stream,
    )  # fmt: skip
    assert code != 0  # output rows shorter than N
    code = lib.launch_matmul_bf16(
        None, 2, 2, None, None, 2, 2, 2, 2, 1, 2, 1, layout((), ()), layout((), ()), None, 0, None, 0, None, 0, None, 0, stream,
    )  # fmt: skip
    assert code != 0  # no output dtype 2
