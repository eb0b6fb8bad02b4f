"""fused_linear_cross_entropy on CUDA (src/classifier_kernel.cu with the matmul library) against torch
float64, through the minitorch API, and the fused classifier launcher alone on torch buffers.

Vocab sizes {7, 1000, 10000, 50257} (odd ones take the kernel's scalar path and padded logits rows,
multiples of 4 its float4 path; dhidden's long vocab dim is split over K by the matmul), hidden {64, 768}, ~30% of the
tokens ignored (weight 0, target -100), chunk sizes that divide the token count, do not, exceed it,
and the default.  The loss is multiplied by 1.7 before backward, so the saved gradients are scaled.
Label smoothing against torch's cross_entropy(label_smoothing=...), through the API and the launcher.
"""

from typing import Optional

import numpy as np
import pytest

import minitorch
from minitorch import cuda_kernel_ops as cko
from minitorch.cuda.libraries import kernel_library
from minitorch.fused.embedding import embedding
from minitorch.fused.linear_cross_entropy import fused_linear_cross_entropy

from fused_testing import rel_err

torch = pytest.importorskip("torch")

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
N_TOKENS = 300
VOCABS = [7, 1000, 10000, 50257]
HIDDEN = [64, 768]
CHUNKS = [None, 64, 97, 1000]  # default, divides 300 unevenly x2, larger than 300
GRAD_SCALE = 1.7
LOSS_TOL = 2e-5
GRAD_TOL = 1e-4


def problem(N: int, C: int, V: int, seed: int, with_bias: bool, device: str = "cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(N, C, device=device, generator=gen)
    weight = torch.randn(C, V, device=device, generator=gen) * (3.0 / C**0.5)
    bias = torch.randn(V, device=device, generator=gen) if with_bias else None
    targets = torch.randint(0, V, (N,), device=device, generator=gen).float()
    weights = torch.rand(N, device=device, generator=gen) * 1.8 + 0.2
    ignored = torch.rand(N, device=device, generator=gen) < 0.3
    ignored[0] = True
    weights[ignored] = 0.0
    targets[ignored] = -100.0
    return hidden, weight, bias, targets, weights


def reference(hidden, weight, bias, targets, weights, label_smoothing: float = 0.0):
    """float64 loss and gradients of GRAD_SCALE * loss, on the GPU (torch float64)."""
    h = hidden.double().requires_grad_(True)
    w = weight.double().requires_grad_(True)
    b = bias.double().requires_grad_(True) if bias is not None else None
    logits = h @ w + (b if b is not None else 0.0)
    ce = torch.nn.functional.cross_entropy(
        logits, torch.where(weights != 0, targets, 0.0).long(), reduction="none", label_smoothing=label_smoothing
    )
    tw = weights.double()
    loss = (ce * tw).sum() / tw.sum()
    (loss * GRAD_SCALE).backward()
    grads = [h.grad, w.grad] + ([b.grad] if b is not None else [])
    return loss.item(), [g.cpu().numpy() for g in grads]


def run_minitorch(hidden, weight, bias, targets, weights, chunk_size: Optional[int], label_smoothing: float = 0.0):
    h = minitorch.from_torch(hidden.clone()).requires_grad_(True)
    w = minitorch.from_torch(weight.clone()).requires_grad_(True)
    b = minitorch.from_torch(bias.clone()).requires_grad_(True) if bias is not None else None
    loss = fused_linear_cross_entropy(
        h, w, minitorch.from_torch(targets), minitorch.from_torch(weights), chunk_size=chunk_size, bias=b,
        label_smoothing=label_smoothing,
    )
    (loss * GRAD_SCALE).backward()
    return loss, [h.grad.to_numpy(), w.grad.to_numpy()] + ([b.grad.to_numpy()] if b is not None else [])


@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("hidden_size", HIDDEN)
@pytest.mark.parametrize("vocab", VOCABS)
def test_fused_loss_matches_torch_float64(vocab: int, hidden_size: int, chunk_size: Optional[int]) -> None:
    with_bias = chunk_size in (None, 97)
    inputs = problem(N_TOKENS, hidden_size, vocab, seed=vocab + hidden_size, with_bias=with_bias)
    loss, grads = run_minitorch(*inputs, chunk_size)
    ref_loss, ref_grads = reference(*inputs)
    label = f"V={vocab} C={hidden_size} chunk={chunk_size} bias={with_bias}"
    assert loss.shape == ()
    assert abs(loss.item() - ref_loss) / abs(ref_loss) < LOSS_TOL, f"{label}: loss {loss.item()} vs {ref_loss}"
    for name, g, r in zip(("dhidden", "dweight", "dbias"), grads, ref_grads):
        err = rel_err(g, r)
        assert err < GRAD_TOL, f"{label}: {name} relative error {err:.3g}"
    ignored = (inputs[4] == 0).cpu().numpy()
    assert np.all(grads[0][ignored] == 0.0), f"{label}: an ignored token got a gradient"


@pytest.mark.parametrize("vocab", [1000, 50257])
@pytest.mark.parametrize("padded_classes", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_tied_head_is_read_in_place_and_gets_its_gradient_in_its_layout(
    vocab: int, padded_classes: bool, bf16: bool
) -> None:
    """GPT-2's head: the first `vocab` rows of a padded [V', C] embedding table, transposed (a view),
    or (padded_classes) the whole table with classes=vocab, as GPT-2's model passes it.  The loss
    reads it in place (the TMA path of the matmul library takes its 16-byte strides) and its
    gradient, written in the table's layout, reaches the table's rows; the padding rows (which hold
    values here) get a zero gradient.  bf16: under autocast, the head a bf16 working copy, the
    dweight float32; the bound is bf16's."""
    C, padded = 64, -(-vocab // 64) * 64
    hidden, weight, _, targets, weights = problem(N_TOKENS, C, vocab, seed=vocab + 5, with_bias=False)
    table = torch.randn(padded, C, device="cuda")
    table[:vocab] = weight.t()
    h = minitorch.from_torch(hidden.clone()).requires_grad_(True)
    wte = minitorch.from_torch(table).requires_grad_(True)
    head = wte.permute(1, 0) if padded_classes else wte[:vocab].permute(1, 0)
    ids, token_weights = minitorch.from_torch(targets), minitorch.from_torch(weights)
    with minitorch.autocast(dtype=minitorch.bfloat16, enabled=bf16):
        loss = fused_linear_cross_entropy(
            h, head, ids, token_weights, chunk_size=97, classes=vocab if padded_classes else None
        )
    (loss * GRAD_SCALE).backward()
    if bf16:
        hidden, weight = hidden.bfloat16().float(), weight.bfloat16().float()
    ref_loss, (ref_dh, ref_dw) = reference(hidden, weight, None, targets, weights)
    loss_tol, grad_tol = (1e-3, 2e-2) if bf16 else (LOSS_TOL, GRAD_TOL)
    assert abs(loss.item() - ref_loss) / abs(ref_loss) < loss_tol
    assert rel_err(h.grad.to_numpy(), ref_dh) < grad_tol
    grad = wte.grad.to_numpy()
    assert wte.grad.dtype is minitorch.float32
    assert rel_err(grad[:vocab], ref_dw.T) < grad_tol
    assert np.all(grad[vocab:] == 0.0)


@pytest.mark.parametrize("bf16", [False, True])
def test_tied_embedding_adds_its_rows_into_the_heads_gradient_buffer(bf16: bool) -> None:
    """A table read by the embedding and, transposed, by the fused loss (GPT-2's tie): the loss hands
    its float32 [V, C] gradient over, so the embedding's scatter adds its rows into that buffer itself
    (no copy of the table's gradient: Context.may_write_pending); the table's gradient is torch's."""
    V, C = 1000, 64
    gen = torch.Generator(device="cuda").manual_seed(11)
    table = torch.randn(V, C, device="cuda", generator=gen) * 0.3
    ids = torch.randint(0, V, (N_TOKENS,), device="cuda", generator=gen)
    ids[:40] = 7  # a repeated id
    targets = torch.randint(0, V, (N_TOKENS,), device="cuda", generator=gen).float()
    weights = torch.ones(N_TOKENS, device="cuda")
    wte = minitorch.from_torch(table.clone()).requires_grad_(True)
    with minitorch.autocast(dtype=minitorch.bfloat16, enabled=bf16):
        rows = embedding(wte, minitorch.from_torch(ids.float()))
        loss = fused_linear_cross_entropy(
            rows, wte.permute(1, 0), minitorch.from_torch(targets), minitorch.from_torch(weights)
        )
    head_grad = loss.history.inputs[0].history.ctx.saved_values[1]._tensor._storage.data_ptr()
    loss.backward()
    assert wte.grad._tensor._storage.data_ptr() == head_grad, "the scatter wrote a copy of the head's gradient"
    ref_table = (table.bfloat16().float() if bf16 else table).double().requires_grad_(True)
    torch.nn.functional.cross_entropy(ref_table[ids] @ ref_table.t(), targets.long()).backward()
    assert rel_err(wte.grad.to_numpy(), ref_table.grad.cpu().numpy()) < (2e-2 if bf16 else GRAD_TOL)


@pytest.mark.parametrize("label_smoothing", [0.1, 1.0])
@pytest.mark.parametrize("vocab", [7, 1003, 10000])
def test_label_smoothing_matches_torch_float64(vocab: int, label_smoothing: float) -> None:
    inputs = problem(N_TOKENS, 64, vocab, seed=vocab + 11, with_bias=vocab != 10000)
    loss, grads = run_minitorch(*inputs, 97, label_smoothing)
    ref_loss, ref_grads = reference(*inputs, label_smoothing)
    label = f"V={vocab} label_smoothing={label_smoothing}"
    assert abs(loss.item() - ref_loss) / abs(ref_loss) < LOSS_TOL, f"{label}: loss {loss.item()} vs {ref_loss}"
    for name, g, r in zip(("dhidden", "dweight", "dbias"), grads, ref_grads):
        err = rel_err(g, r)
        assert err < GRAD_TOL, f"{label}: {name} relative error {err:.3g}"


@pytest.mark.parametrize("vocab", [1000, 50257])
def test_loss_without_grad_is_the_same_number(vocab: int) -> None:
    hidden, weight, bias, targets, weights = problem(N_TOKENS, 64, vocab, seed=3, with_bias=True)
    args = [minitorch.from_torch(t) for t in (hidden, weight, targets, weights)]
    b = minitorch.from_torch(bias)
    with_grad = fused_linear_cross_entropy(
        args[0].requires_grad_(True), args[1].requires_grad_(True), args[2], args[3], chunk_size=97, bias=b
    )
    with minitorch.no_grad():
        plain = fused_linear_cross_entropy(*args, chunk_size=97, bias=b)
    assert plain.history is None
    # The same arithmetic, but in another instantiation of the kernel: equal up to rounding.
    assert abs(plain.item() - with_grad.item()) <= 1e-6 * abs(with_grad.item())


def test_all_zero_weights_give_zero_loss_and_gradients() -> None:
    hidden, weight, bias, targets, weights = problem(50, 64, 1000, seed=4, with_bias=True)
    weights.zero_()
    loss, grads = run_minitorch(hidden, weight, bias, targets, weights, 16)
    assert loss.item() == 0.0
    for name, g in zip(("dhidden", "dweight", "dbias"), grads):
        assert np.all(g == 0.0), f"{name} is not zero for all-zero token weights"


def test_bad_target_on_a_counted_token_makes_the_loss_nan() -> None:
    hidden, weight, _, targets, weights = problem(20, 64, 100, seed=5, with_bias=False)
    weights[7] = 1.0
    targets[7] = 100.0  # == V
    loss = fused_linear_cross_entropy(*(minitorch.from_torch(t) for t in (hidden, weight, targets, weights)))
    assert np.isnan(loss.item())


def test_no_host_device_copies() -> None:
    inputs = problem(N_TOKENS, 64, 1000, seed=6, with_bias=True)
    h, w, b, t, tw = (minitorch.from_torch(x) for x in inputs)
    h.requires_grad_(True)
    w.requires_grad_(True)
    cko.reset_transfer_stats()
    loss = fused_linear_cross_entropy(h, w, t, tw, chunk_size=97, bias=b)
    loss.backward()
    assert cko.transfer_stats()["h2d"] == 0 and cko.transfer_stats()["d2h"] == 0, cko.transfer_stats()


def test_memory_stays_within_one_chunk_of_logits() -> None:
    """With 4096 tokens x 50257 classes (823 MB of logits), a 256-row chunk must keep the extra
    memory of the call to the gradients, the weight-sized scratch and about one chunk of logits."""
    N, C, V, chunk = 4096, 256, 50257, 256
    hidden, weight, _, targets, weights = problem(N, C, V, seed=7, with_bias=False)
    h = minitorch.from_torch(hidden).requires_grad_(True)
    w = minitorch.from_torch(weight).requires_grad_(True)
    t, tw = minitorch.from_torch(targets), minitorch.from_torch(weights)
    torch.cuda.synchronize()
    base = minitorch.cuda_memory_stats(reset=True)["current"]
    loss = fused_linear_cross_entropy(h, w, t, tw, chunk_size=chunk)
    torch.cuda.synchronize()
    extra = minitorch.cuda_memory_stats()["peak"] - base
    grads_and_scratch = 4 * (N * C + 2 * C * V)
    budget = grads_and_scratch + 4 * chunk * V * 1.5 + (16 << 20)
    assert extra < budget, f"peak {extra / 2**20:.0f} MiB above the inputs, budget {budget / 2**20:.0f} MiB"
    assert extra < 0.5 * 4 * N * V, "the call used as much memory as the full logits"
    del loss


# ---- the launcher alone -------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [7, 64, 1000, 1003, 50257])
@pytest.mark.parametrize("misaligned", [False, True])
@pytest.mark.parametrize("write_grad", [True, False])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("pad", [0, 4])
@pytest.mark.parametrize("out_of_place", [False, True])
def test_classifier_launcher(
    vocab: int, misaligned: bool, write_grad: bool, label_smoothing: float, pad: int, out_of_place: bool
) -> None:
    """losses and dlogits (written over the logits, or out_of_place into rows of another buffer, 8
    floats longer than the vocab; the columns past the vocab zeros) of the raw launcher, incl. a row
    offset by one float (scalar path), rows `pad` floats longer than the vocab, a NaN-poisoned loss
    buffer, an ignored row, a bias and label smoothing."""
    rows = 37
    ld = vocab + pad
    gen = torch.Generator(device="cuda").manual_seed(vocab)
    off = 1 if misaligned else 0
    sentinel = 12345.0
    store = torch.full((rows * ld + 2,), sentinel, device="cuda")  # a float on each side of the rows
    logits = store[off : off + rows * ld].view(rows, ld)[:, :vocab]
    logits.copy_(torch.randn(rows, vocab, device="cuda", generator=gen) * 4.0)
    bias = torch.randn(vocab, device="cuda", generator=gen)
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=gen).float()
    weights = torch.rand(rows, device="cuda", generator=gen) + 0.5
    weights[3] = 0.0
    targets[3] = 1e9
    total = weights.sum().reshape(1)
    losses = torch.full((rows,), float("nan"), device="cuda")
    x = (logits.double() + bias.double())
    counted_targets = torch.where(weights != 0, targets, 0.0).long()
    ref_losses = torch.nn.functional.cross_entropy(x, counted_targets, reduction="none", label_smoothing=label_smoothing)
    ref_losses = ref_losses * weights.double() / total.double()
    smoothed = torch.nn.functional.one_hot(counted_targets, vocab) * (1.0 - label_smoothing) + label_smoothing / vocab
    ref_grad = torch.softmax(x, 1) - smoothed
    ref_grad = ref_grad * (weights.double() / total.double())[:, None]
    before = logits.clone()
    ld_grad = vocab + 8 if out_of_place else ld
    grad_store = torch.full((rows * ld_grad,), sentinel, device="cuda")
    dlogits = grad_store.view(rows, ld_grad)[:, :vocab] if out_of_place else logits
    stream = torch.cuda.current_stream().cuda_stream
    code = kernel_library("classifier_kernel").launch_fused_classifier(
        logits.data_ptr(), ld, dlogits.data_ptr(), ld_grad, losses.data_ptr(), bias.data_ptr(), targets.data_ptr(),
        weights.data_ptr(), total.data_ptr(), rows, vocab, label_smoothing, int(write_grad), stream,
    )
    assert code == 0
    torch.cuda.synchronize()
    assert rel_err(losses.cpu().numpy(), ref_losses.cpu().numpy()) < 1e-5
    if write_grad:
        assert rel_err(dlogits.cpu().numpy(), ref_grad.cpu().numpy()) < 1e-5
        assert torch.all(dlogits[3] == 0.0)
    if not write_grad or out_of_place:
        assert torch.equal(logits, before), "the launch wrote over the logits"
    if write_grad:
        grad_rows = grad_store.view(rows, ld_grad) if out_of_place else store[off : off + rows * ld].view(rows, ld)
        assert torch.all(grad_rows[:, vocab:] == 0.0), "the columns past the vocab must get zeros"
    inside = torch.zeros_like(store, dtype=torch.bool)
    inside[off : off + rows * ld].view(rows, ld)[:, : ld if write_grad and not out_of_place else vocab] = True
    assert torch.all(store[~inside] == sentinel), "the launcher wrote outside the rows"


def test_classifier_launcher_rejects_bad_sizes() -> None:
    lib = kernel_library("classifier_kernel")
    buf = torch.zeros(16, device="cuda")
    p = buf.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream

    def launch(logits, ld, dlogits, ld_grad, rows, vocab, smoothing=0.0, write_grad=1):
        return lib.launch_fused_classifier(logits, ld, dlogits, ld_grad, p, None, p, p, p, rows, vocab, smoothing,
                                           write_grad, stream)  # fmt: skip

    assert launch(p, 4, p, 4, 2, 0) != 0
    assert launch(p, 4, p, 4, -1, 4) != 0
    assert launch(None, 4, p, 4, 2, 4) != 0
    assert launch(p, 4, p, 4, 2, 4, 1.5) != 0
    assert launch(p, 4, p, 4, 2, 4, float("nan")) != 0
    assert launch(p, 3, p, 3, 2, 4) != 0  # rows shorter than V
    assert launch(p, 4, None, 4, 2, 4) != 0  # a gradient wanted and nowhere to write it
    assert launch(p, 4, p, 3, 2, 4) != 0  # gradient rows shorter than V
    assert launch(p, 4, None, 0, 2, 4, write_grad=0) == 0  # the losses alone need no gradient rows
    assert launch(p, 4, p, 4, 0, 4) == 0


def test_classifier_launcher_without_weights_gives_the_plain_rows() -> None:
    """NULL token weights and weight sum stand for weights of 1 and a sum of 1: the unscaled
    cross-entropy of each row, and softmax - onehot as its gradient."""
    rows, vocab = 5, 33
    gen = torch.Generator(device="cuda").manual_seed(1)
    logits = torch.randn(rows, vocab, device="cuda", generator=gen) * 3.0
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    losses, dlogits = torch.empty(rows, device="cuda"), torch.empty(rows, vocab, device="cuda")
    code = kernel_library("classifier_kernel").launch_fused_classifier(
        logits.data_ptr(), vocab, dlogits.data_ptr(), vocab, losses.data_ptr(), None, targets.float().data_ptr(), None,
        None, rows, vocab, 0.0, 1, torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    assert code == 0
    x = logits.double()
    ref = torch.nn.functional.cross_entropy(x, targets, reduction="none")
    assert rel_err(losses.cpu().numpy(), ref.cpu().numpy()) < 1e-5
    ref_grad = torch.softmax(x, 1) - torch.nn.functional.one_hot(targets, vocab)
    assert rel_err(dlogits.cpu().numpy(), ref_grad.cpu().numpy()) < 1e-5
