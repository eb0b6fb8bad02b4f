"""The KV cache's kernels on bfloat16 (src/kv_cache_kernel.cu's *_bf16 launchers through
fused.write_slot / fused.slot_attention and KVCache(dtype=bfloat16)): slot writes are exact copies,
and the cached attention step, against float64 on the same bf16 values, stays within 2x torch's own
bf16 error (SDPA in bf16 over the same slots).  Top-k and beam search take float32 logits (the
decoders' LM-head output), so they have no bf16 variant.
"""

import math
import sys
from pathlib import Path

import pytest

import minitorch
from minitorch.fused.device_indexed import write_slot
from minitorch.fused.slot_attention import slot_attention

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from minitorch_testing import slot_attention_reference  # noqa: E402

FLOOR = 1e-6
CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)


def rel_err(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def test_write_slot_copies_bf16_exactly_and_casts_float32_values() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    buffer = torch.zeros(3, 5, 24, device="cuda", dtype=torch.bfloat16)
    values = torch.randn(3, 24, generator=gen, device="cuda").to(torch.bfloat16)
    mb = minitorch.from_torch(buffer)
    write_slot(mb, minitorch.from_torch(values), minitorch.from_torch(torch.tensor([2.0], device="cuda")))
    got = mb.to_torch()
    assert torch.equal(got[:, 2], values) and float(got[:, [0, 1, 3, 4]].abs().max()) == 0.0
    wide = torch.randn(3, 24, generator=gen, device="cuda")
    write_slot(mb, minitorch.from_torch(wide), minitorch.from_torch(torch.tensor([4.0], device="cuda")))
    assert torch.equal(mb.to_torch()[:, 4], wide.to(torch.bfloat16))


@pytest.mark.parametrize("rows,width,heads,D", [(4, 37, 4, 16), (3, 200, 12, 64), (2, 9, 2, 48), (5, 64, 16, 128)])
def test_slot_attention_against_float64(rows: int, width: int, heads: int, D: int) -> None:
    C = heads * D
    gen = torch.Generator(device="cuda").manual_seed(rows * width + D)
    slots = width + 3
    q, keys, values = (torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)
                       for shape in ((rows, C), (rows, slots, C), (rows, slots, C)))  # fmt: skip
    s = width - 2
    pads = torch.tensor([[min(r, s)] for r in range(rows)], device="cuda", dtype=torch.float32)
    slot = torch.tensor([float(s)], device="cuda")
    out = slot_attention(*(minitorch.from_torch(t) for t in (q, keys, values, slot, pads)), width, heads)
    assert out.dtype == minitorch.bfloat16
    ref = torch.from_numpy(slot_attention_reference(
        *(t.double().cpu().numpy() for t in (q, keys, values)), float(s), pads.cpu().numpy()[:, 0].astype(int), width, heads,
    )).cuda()  # fmt: skip
    keep = torch.zeros(rows, 1, 1, width, device="cuda", dtype=torch.bool)
    for r in range(rows):
        keep[r, :, :, int(pads[r, 0]) : s + 1] = True
    split = lambda t, n: t.view(rows, n, heads, D).transpose(1, 2)  # noqa: E731
    theirs = torch.nn.functional.scaled_dot_product_attention(
        split(q, 1), split(keys[:, :width], width), split(values[:, :width], width), attn_mask=keep,
        scale=1.0 / math.sqrt(D),
    ).transpose(1, 2).reshape(rows, C)  # fmt: skip
    err, bound = rel_err(out.to_torch(), ref), max(2 * rel_err(theirs, ref), FLOOR)
    assert err <= bound, f"slot attention error {err:.3g} > 2 x torch's bf16 error ({bound:.3g})"
