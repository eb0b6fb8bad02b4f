"""Benchmark of fused attention (src/attention_kernel.cu) against the unfused paths, forward + backward.

For each shape [B, H, T, D] (self-attention, fp32, no mask; --causal for causal masking) it measures:
  fused            minitorch.fused_attention on the CUDA backend;
  fused high       the same under minitorch.set_float32_matmul_precision("high") (one TF32 product);
  minitorch naive  (q * scale) @ k^T -> Tensor.attn_softmax -> @ v through minitorch tensors (our
                   matmul and fused softmax kernels, the [T, T] scores and probabilities stored);
  torch naive      the same three steps in PyTorch;
  torch sdpa       torch.nn.functional.scaled_dot_product_attention;
  torch sdpa tf32  the same with torch.backends.cuda.matmul.allow_tf32 = True.
TF32 is off for PyTorch otherwise (torch.backends.cuda.matmul.allow_tf32 = False, cudnn too), so
every other path computes in fp32.  With --dtype bf16 the inputs are bfloat16 and the paths are
  fused            minitorch.fused_attention (src/attention_bf16_kernel.cu);
  torch sdpa flash scaled_dot_product_attention on its FlashAttention-2 backend;
  torch sdpa cudnn the same on cuDNN's fused attention (what torch.compile's GPT-2 step runs);
and the shapes start with GPT-2 124M's at B 4 and B 16 and one of head dim 128.
Times: median GPU milliseconds of one forward (no autograd graph) and of one forward + backward,
from minitorch.cuda.timer.gpu_ms: CUDA events around back-to-back iterations (batches of about
100 ms, at most 20) queued behind a spin kernel (Python overhead hidden as long as the GPU is the
bottleneck). Memory: torch.cuda.max_memory_allocated during one forward +
backward after reset_peak_memory_stats (minitorch allocates through torch's caching allocator), as
the total peak and as the peak beyond the inputs q, k, v and the output gradient. A path that cannot
run a shape (out of memory, or minitorch's 32-bit element indexing for a [B, H, T, T] tensor) is
skipped with the reason. TFLOP/s counts 4 B H T^2 D flops forward and 2.5x that backward (halved
when causal), the usual FlashAttention convention.

Usage: python benchmarks/bench_attention.py [--out DIR] [--causal] [--quick] [--dtype fp32|bf16]
Writes DIR/bench_attention[_bf16][_causal].json and .png (default DIR: benchmarks/results/bench_attention).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Dict, List, Optional

from common import Column, Panel, Table, out_option, write_results
from minitorch.cuda.timer import gpu_ms

SHAPES = [(8, 12, 1024, 64), (2, 12, 4096, 64), (1, 12, 16384, 64)]
METHODS = ["fused", "fused high", "minitorch naive", "torch naive", "torch sdpa", "torch sdpa tf32"]
# GPT-2 124M at B 4 and B 16 (whose backward's operands exceed the L2: grouped heads), a head dim of 128
BF16_SHAPES = [(4, 12, 1024, 64), (16, 12, 1024, 64), (4, 6, 1024, 128)] + SHAPES
BF16_METHODS = ["fused", "torch sdpa flash", "torch sdpa cudnn"]
INT_LIMIT = 2**31  # minitorch's CUDA kernels index tensors with 32-bit ints


def make_paths(torch: Any, minitorch: Any, shape: tuple, causal: bool, bf16: bool = False) -> Dict[str, Any]:
    """For each method: (forward-only fn, forward+backward fn) on shared inputs, or a skip reason."""
    import torch.nn.functional as F

    B, H, T, D = shape
    scale = 1.0 / math.sqrt(D)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.bfloat16 if bf16 else torch.float32
    q, k, v, g = (torch.randn(shape, device="cuda", generator=gen).to(dtype) for _ in range(4))
    paths: Dict[str, Any] = {}

    mq, mk, mv = (minitorch.from_torch(t).requires_grad_(True) for t in (q, k, v))
    mg = minitorch.from_torch(g)
    leaves = (mq, mk, mv)

    def fused_fw() -> None:
        with minitorch.no_grad():
            minitorch.fused_attention(mq, mk, mv, causal=causal)

    def fused_fwbw() -> None:
        for t in leaves:
            t.zero_grad_()
        minitorch.fused_attention(mq, mk, mv, causal=causal).backward(mg)

    paths["fused"] = (fused_fw, fused_fwbw)
    if bf16:
        paths.update(sdpa_paths(torch, q, k, v, g, causal))
        paths["_leaves"] = (mq, mk, mv, q, k, v)
        return paths

    def high(fn: Any) -> Any:
        def run() -> None:
            with minitorch.float32_matmul_precision("high"):
                fn()

        return run

    paths["fused high"] = (high(fused_fw), high(fused_fwbw))

    if B * H * T * T >= INT_LIMIT:
        paths["minitorch naive"] = f"[{B}, {H}, {T}, {T}] scores exceed minitorch's 32-bit element indexing"
    else:

        def naive(q_, k_, v_):
            scores = (q_ * scale) @ k_.permute(0, 1, 3, 2)
            return scores.attn_softmax(None, causal=causal) @ v_

        def naive_fw() -> None:
            with minitorch.no_grad():
                naive(mq, mk, mv)

        def naive_fwbw() -> None:
            for t in leaves:
                t.zero_grad_()
            naive(mq, mk, mv).backward(mg)

        paths["minitorch naive"] = (naive_fw, naive_fwbw)

    tq, tk, tv = (t.requires_grad_(True) for t in (q, k, v))  # the same buffers: nothing else stays alive

    def torch_naive(q_, k_, v_):
        s = (q_ @ k_.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device="cuda").triu_(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v_

    def torch_naive_fw() -> None:
        with torch.no_grad():
            torch_naive(tq, tk, tv)

    def torch_naive_fwbw() -> None:
        for t in (tq, tk, tv):
            t.grad = None
        torch_naive(tq, tk, tv).backward(g)

    paths["torch naive"] = (torch_naive_fw, torch_naive_fwbw)

    def sdpa_fw() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def sdpa_fwbw() -> None:
        for t in (tq, tk, tv):
            t.grad = None
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(g)

    paths["torch sdpa"] = (sdpa_fw, sdpa_fwbw)

    def tf32(fn: Any) -> Any:
        def run() -> None:
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                fn()
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False

        return run

    paths["torch sdpa tf32"] = (tf32(sdpa_fw), tf32(sdpa_fwbw))
    paths["_leaves"] = (mq, mk, mv, tq, tk, tv)
    return paths


def sdpa_paths(torch: Any, q: Any, k: Any, v: Any, g: Any, causal: bool) -> Dict[str, Any]:
    """torch sdpa flash / cudnn: scaled_dot_product_attention pinned to one backend (q, k, v become leaves)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for t in (q, k, v):
        t.requires_grad_(True)
    paths: Dict[str, Any] = {}
    for name, backend in (("torch sdpa flash", SDPBackend.FLASH_ATTENTION), ("torch sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):

        def fw(backend: Any = backend) -> None:
            with torch.no_grad(), sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def fwbw(backend: Any = backend) -> None:
            for t in (q, k, v):
                t.grad = None
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)

        paths[name] = (fw, fwbw)
    return paths


def timed(fn: Any, reps: int) -> float:
    """Median GPU ms of fn() over batches of back-to-back calls lasting about 100 ms (at most 20)."""
    return gpu_ms(fn, warmup=1, reps=reps, batch_ms=100.0, max_inner=20)


def clear_grads(leaves: tuple) -> None:
    for t in leaves:
        if hasattr(t, "zero_grad_"):
            t.zero_grad_()
        else:
            t.grad = None


def run_shape(torch: Any, minitorch: Any, reps: int, shape: tuple, causal: bool, bf16: bool = False) -> List[Dict[str, Any]]:
    B, H, T, D = shape
    fw_flops = 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)
    paths = make_paths(torch, minitorch, shape, causal, bf16)
    rows = []
    for method in BF16_METHODS if bf16 else METHODS:
        row: Dict[str, Any] = {"method": method, "shape": list(shape), "causal": causal}
        path = paths[method]
        if isinstance(path, str):
            row["skipped"] = path
            rows.append(row)
            continue
        fw, fwbw = path
        try:
            # Memory first, from a state where only the inputs (no gradients) are alive.
            fwbw()
            clear_grads(paths["_leaves"])
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fwbw()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            row["peak_mib"] = peak / 2**20
            row["peak_beyond_inputs_mib"] = (peak - base) / 2**20
            row["fw_ms"] = timed(fw, reps)
            row["fwbw_ms"] = timed(fwbw, reps)
            row["fwbw_tflops"] = 3.5 * fw_flops / (row["fwbw_ms"] * 1e-3) / 1e12
        except torch.cuda.OutOfMemoryError:
            row = {"method": method, "shape": list(shape), "causal": causal, "skipped": "out of GPU memory"}
        except RuntimeError as e:  # an sdpa backend that does not take this shape or device
            row = {"method": method, "shape": list(shape), "causal": causal, "skipped": str(e).splitlines()[0][:80]}
        rows.append(row)
        torch.cuda.empty_cache()
    del paths
    torch.cuda.empty_cache()
    by_method = {r["method"]: r for r in rows}
    fused = by_method["fused"]
    for r in rows:
        if "fwbw_ms" in r and "fwbw_ms" in fused:
            r["fused_speedup"] = r["fwbw_ms"] / fused["fwbw_ms"]
            r["fused_memory_ratio"] = fused["peak_mib"] / r["peak_mib"]
    return rows


TABLE = Table(
    Column("shape", 20, lambda r: "x".join(str(s) for s in r["shape"]), left=True),
    Column("method", 16, "method", left=True),
    Column("fw ms", 8, "fw_ms", ".3f"),
    Column("fw+bw ms", 9, "fwbw_ms", ".3f"),
    Column("TFLOP/s", 8, "fwbw_tflops", ".1f"),
    Column("peak MiB", 9, "peak_mib", ".0f"),
    Column("beyond in", 10, "peak_beyond_inputs_mib", ".0f"),
    Column("fused speedup", 14, "fused_speedup", ".2f", "x"),
    Column("fused mem", 10, lambda r: 100 * r["fused_memory_ratio"] if "fused_memory_ratio" in r else None, ".0f", "%"),
)


def print_row(r: Dict[str, Any]) -> None:
    if "skipped" in r:
        TABLE.row(r, first=2, note=f"skipped: {r['skipped']}")
    else:
        TABLE.row(r)


def panels(results: List[Dict[str, Any]]) -> List[Panel]:
    """Forward + backward time and peak memory of every method per shape (no bar: skipped)."""
    shapes = sorted({tuple(r["shape"]) for r in results}, key=lambda s: s[2])
    ran = {(r["method"], tuple(r["shape"])): r for r in results if "skipped" not in r}

    methods = list(dict.fromkeys(r["method"] for r in results))

    def series(value: Any) -> Dict[str, List[Optional[float]]]:
        return {m: [value(ran[m, s]) if (m, s) in ran else None for s in shapes] for m in methods}

    labels = ["x".join(str(v) for v in s) for s in shapes]
    return [
        Panel(labels, series(lambda r: r["fwbw_ms"]), log=True, ylabel="forward + backward, ms (log)"),
        Panel(labels, series(lambda r: r["peak_mib"] / 1024), log=True, ylabel="peak GPU memory, GiB (log)"),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    out_option(parser, "bench_attention")
    parser.add_argument("--causal", action="store_true", help="causal masking (default: none)")
    parser.add_argument("--quick", action="store_true", help="only the first shape, fewer repeats")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="inputs' dtype (default fp32)")
    args = parser.parse_args(argv)
    bf16 = args.dtype == "bf16"

    import torch

    if not torch.cuda.is_available():
        print("bench_attention.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import minitorch

    reps = 3 if args.quick else 7
    device = torch.cuda.get_device_name(0)
    precision = "bfloat16" if bf16 else "float32, TF32 off except the tf32 / high rows"
    print(f"device: {device}; torch {torch.__version__}; {precision}; causal={args.causal}")
    print("fused speedup = this path's fw+bw time / fused's; fused mem = fused peak / this path's peak")
    TABLE.header()
    results: List[Dict[str, Any]] = []
    shapes = BF16_SHAPES if bf16 else SHAPES
    for shape in shapes[:1] if args.quick else shapes:
        rows = run_shape(torch, minitorch, reps, shape, args.causal, bf16)
        for r in rows:
            print_row(r)
        results += rows

    report = {
        "device": device,
        "torch": torch.__version__,
        "causal": args.causal,
        "dtype": args.dtype,
        "timing": "minitorch.cuda.timer.gpu_ms: median GPU ms per call (events around back-to-back calls behind a spin kernel)",
        "memory": "torch.cuda.max_memory_allocated during one fw+bw; peak_beyond_inputs subtracts q, k, v, grad",
        "results": results,
    }
    title = f"Attention {args.dtype}{' causal' if args.causal else ''}, {device} (missing bar: skipped)"
    name = "bench_attention" + ("_bf16" if bf16 else "") + ("_causal" if args.causal else "")
    write_results(args.out, name, report, panels(results),
                  title=title, columns=1, size=(10, 9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
