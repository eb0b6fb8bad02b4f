"""Benchmark of the tensor-core matmul (src/matmul_kernel.cu, through its C ABI) against torch.matmul,
float32 inputs, side by side on the same inputs in one run:
  ours highest  3xTF32 (float32 accuracy), the library's default;
  ours high     one TF32 product;
  torch fp32    torch.matmul with TF32 off (cuBLAS float32);
  torch tf32    torch.matmul with TF32 on.
Shapes: [4096]^3 and the GPT-2 small products for 4096 tokens (C = 768): each linear layer's forward
X @ W, and its backward products dX = dY @ W^T and dW = X^T @ dY (transposed views, read in place);
the LM head multiplies by the tied embedding, X @ E^T with E [50257, 768], and runs its three products
as the library does: logits and their gradient dY in rows padded to a multiple of 4 floats (50260, the
classifier's layout, which the TMA path needs), the embedding's gradient as dE = dY^T @ X [50257, 768].
Times: minitorch.cuda.timer.gpu_ms, the median over repetitions of CUDA-event-timed runs of 5 back-to-back
calls (queued behind a spin kernel, so launch gaps stay hidden), after warm-up; when an input set fits
twice in L2 the calls rotate over several sets so that they do not run from cache. Each variant's error
against a float64 product (torch on the GPU) is reported as max|out - ref| / max|ref|.

Usage: python benchmarks/bench_matmul.py [--out DIR] [--reps N] [--quick]
Writes DIR/bench_matmul.json and DIR/bench_matmul.png (default DIR: benchmarks/results/bench_matmul).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Tuple

import torch

from common import ROOT, Column, Panel, Table, buffer_sets, out_option, rotating, write_results
from minitorch.cuda.layout import MtLayout
from minitorch.cuda.matmul import SIGNATURES
from minitorch.cuda.runtime import load_library
from minitorch.cuda.timer import gpu_ms

LIB_PATH = ROOT / "minitorch" / "cuda_kernels" / "matmul_kernel.so"
VARIANTS = ["ours highest", "ours high", "torch fp32", "torch tf32"]
T, C, VOCAB = 4096, 768, 50257


def load_matmul_library() -> Any:
    if not LIB_PATH.exists():
        sys.exit(f"{LIB_PATH} is missing: build it with `bash compile_cuda.sh`")
    return load_library("matmul_kernel", SIGNATURES)


def shapes() -> List[Tuple[str, Tuple[int, int, int], str, str, str]]:
    """(name, (M, K, N), A layout, B layout, output layout); layout "n" = row-major, "t" = a transposed
    view, "p" = row-major in rows padded to a multiple of 4 floats, "pt" = a transposed view of that."""
    out = [("square 4096^3", (4096, 4096, 4096), "n", "n", "n")]
    for layer, (cin, cout) in {"qkv": (C, 3 * C), "attn proj": (C, C), "fc": (C, 4 * C), "fc proj": (4 * C, C)}.items():
        out.append((f"{layer} fwd", (T, cin, cout), "n", "n", "n"))
        out.append((f"{layer} dX", (T, cout, cin), "n", "t", "n"))  # dY @ W^T
        out.append((f"{layer} dW", (cin, T, cout), "t", "n", "n"))  # X^T @ dY
    out.append(("lm head fwd", (T, C, VOCAB), "n", "t", "p"))  # logits = X @ E^T
    out.append(("lm head dX", (T, VOCAB, C), "p", "n", "n"))  # dY @ E
    out.append(("lm head dE", (VOCAB, T, C), "pt", "n", "n"))  # dY^T @ X
    return out


def padded(shape: Tuple[int, int]) -> torch.Tensor:
    """Uninitialized [rows, cols] view of a buffer whose rows are padded to a multiple of 4 floats."""
    rows, cols = shape
    return torch.empty(rows, -(-cols // 4) * 4, device="cuda")[:, :cols]


def make_operand(shape: Tuple[int, int], layout: str, gen: torch.Generator) -> torch.Tensor:
    stored = shape[::-1] if layout.endswith("t") else shape
    x = padded(stored) if layout.startswith("p") else torch.empty(stored, device="cuda")
    x.normal_(generator=gen)
    return x.t() if layout.endswith("t") else x


def run_shape(lib, name, mkn, la, lb, lo, reps: int) -> Dict[str, Any]:
    M, K, N = mkn
    gen = torch.Generator(device="cuda").manual_seed(0)
    set_bytes = 4 * (M * K + K * N + M * N)
    sets = buffer_sets(set_bytes, l2_multiple=2.0, most=8)
    inputs = [(make_operand((M, K), la, gen), make_operand((K, N), lb, gen)) for _ in range(sets)]
    outs = [padded((M, N)) if lo == "p" else torch.empty(M, N, device="cuda") for _ in range(sets)]
    # torch.matmul wants a contiguous out=: its own outputs where ours are padded
    torch_outs = [torch.empty(M, N, device="cuda") for _ in range(sets)] if lo == "p" else outs
    a0, b0 = inputs[0]
    strides = (a0.stride(0), a0.stride(1), b0.stride(0), b0.stride(1))
    ws_floats = max(lib.matmul_workspace_floats(M, N, K, 1, *strides, precision) for precision in (0, 1))
    ws = torch.empty(max(ws_floats, 1), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    empty = MtLayout()

    def ours(precision: int) -> Callable[[int], None]:
        def call(i: int) -> None:
            a, b = inputs[i]
            code = lib.launch_matmul(
                outs[i].data_ptr(), outs[i].stride(0), a.data_ptr(), b.data_ptr(), M, N, K, a.stride(0), a.stride(1),
                b.stride(0), b.stride(1), empty, empty, None, 0, None, 0, precision, ws.data_ptr(),
                ws_floats, stream,
            )  # fmt: skip
            if code:
                raise RuntimeError(lib.minitorch_error_string(code).decode())

        return call

    def theirs(tf32: bool) -> Callable[[int], None]:
        def call(i: int) -> None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.matmul(*inputs[i], out=torch_outs[i])

        return call

    fns = {"ours highest": ours(0), "ours high": ours(1), "torch fp32": theirs(False), "torch tf32": theirs(True)}
    a, b = inputs[0]
    ref = a.double() @ b.double()
    scale = float(ref.abs().max())
    result: Dict[str, Any] = {"shape": name, "M": M, "K": K, "N": N, "A": la, "B": lb, "out": lo, "input_sets": sets}
    for v, fn in fns.items():
        fn(0)
        torch.cuda.synchronize()
        err = float(((outs if v.startswith("ours") else torch_outs)[0].double() - ref).abs().max()) / scale
        ms = gpu_ms(rotating(lambda i: fn(i % sets)), warmup=3, reps=reps, inner=5)
        result[v] = {"ms": ms, "tflops": 2.0 * M * N * K / ms / 1e9, "rel_err": err}
    torch.backends.cuda.matmul.allow_tf32 = False
    result["highest_over_fp32"] = result["torch fp32"]["ms"] / result["ours highest"]["ms"]
    result["high_over_tf32"] = result["torch tf32"]["ms"] / result["ours high"]["ms"]
    return result


def panels(results: List[Dict[str, Any]]) -> List[Panel]:
    """TFLOP/s of every variant per product."""
    return [Panel([r["shape"] for r in results], {v: [r[v]["tflops"] for r in results] for v in VARIANTS},
                  ylabel="TFLOP/s", rotation=45)]


TABLE = Table(
    Column("shape", 14, "shape", left=True),
    Column("M", 6, "M"),
    Column("K", 6, "K"),
    Column("N", 6, "N"),
    *(Column(v, 20, lambda r, v=v: f"{r[v]['ms']:8.3f}ms {r[v]['tflops']:6.1f}TF/s") for v in VARIANTS),
    Column("hi/fp32", 7, "highest_over_fp32", ".2f", "x"),
    Column("high/tf32", 9, "high_over_tf32", ".2f", "x"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out_option(parser, "bench_matmul")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="only the square shape and the GPT-2 fc layer")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch")
    lib = load_matmul_library()
    todo = shapes()
    if args.quick:
        todo = [s for s in todo if s[0].startswith(("square", "fc "))]
    results = []
    TABLE.header()
    for name, mkn, la, lb, lo in todo:
        r = run_shape(lib, name, mkn, la, lb, lo, args.reps)
        results.append(r)
        TABLE.row(r)
        print(" " * 36 + "errors: " + "  ".join(f"{v} {r[v]['rel_err']:.2e}" for v in VARIANTS), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps}
    write_results(args.out, "bench_matmul", {"meta": meta, "results": results}, panels(results),
                  title=f"float32 matmul on {meta['device']}", size=(14, 5))


if __name__ == "__main__":
    main()
