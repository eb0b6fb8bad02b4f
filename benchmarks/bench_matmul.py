"""Benchmark of the tensor-core matmuls (src/matmul_kernel.cu and src/matmul_bf16_kernel.cu, through their
C ABIs) against torch.matmul (cuBLAS), side by side on the same inputs in one run:
  float32 inputs   ours highest  3xTF32 (float32 accuracy), the library's default;
                   ours high     one TF32 product;
                   torch fp32    torch.matmul with TF32 off;
                   torch tf32    torch.matmul with TF32 on;
  bfloat16 inputs  ours bf16     the bf16 library (float32 sums), bf16 output;
                   torch bf16    torch.matmul in bf16, bf16 output.
Shapes: [4096]^3 and the GPT-2 small products for 4096 tokens (C = 768): each linear layer's forward
X @ W, and its backward products dX = dY @ W^T and dW = X^T @ dY (transposed views, read in place);
the LM head multiplies by the tied embedding, X @ E^T with E [50257, 768], and runs its three products
as the library does: logits and their gradient dY in rows padded to 16 bytes (50260 floats or 50264
bf16, the classifier's layout, which the TMA paths need; torch writes contiguous rows), the embedding's
gradient as dE = dY^T @ X [50257, 768].
Times: minitorch.cuda.timer.gpu_ms, the median over repetitions of CUDA-event-timed runs of 5 back-to-back
calls (queued behind a spin kernel, so launch gaps stay hidden), after warm-up; when an input set fits
twice in L2 the calls rotate over several sets so that they do not run from cache. Each variant's error
against a float64 product of the same inputs (torch on the GPU) is reported as max|out - ref| / max|ref|.

--k-sweep runs instead the fc layer's forward product (M 4096, N 3072) at K = 768 .. 6144 and fits each
variant's time as a line in the number of 64-wide K tiles: the slope is the cost of a K tile of the
whole product, the intercept what its output tiles cost besides their K tiles (prologue, epilogue,
wave tails), the part that weighs most at GPT-2's K = 768.

Usage: python benchmarks/bench_matmul.py [--out DIR] [--reps N] [--quick | --k-sweep] [--dtypes fp32,bf16]
Writes DIR/bench_matmul.json and DIR/bench_matmul.png (default DIR: benchmarks/results/bench_matmul;
with --k-sweep, bench_matmul_k_sweep.json and .png).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from common import Column, Panel, Table, buffer_sets, out_option, rotating, write_results
from minitorch.cuda import matmul, matmul_bf16
from minitorch.cuda.layout import MtLayout
from minitorch.cuda.runtime import library_path, load_library
from minitorch.cuda.timer import gpu_ms

VARIANTS = {"fp32": ["ours highest", "ours high", "torch fp32", "torch tf32"], "bf16": ["ours bf16", "torch bf16"]}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RATIOS = {"highest_over_fp32": ("torch fp32", "ours highest"), "high_over_tf32": ("torch tf32", "ours high"),
          "bf16_over_torch": ("torch bf16", "ours bf16")}  # fmt: skip
T, C, VOCAB = 4096, 768, 50257


def load_libraries(dtypes: List[str]) -> Dict[str, Any]:
    """The C ABI of each dtype's library (dtype -> library)."""
    names = {"fp32": ("matmul_kernel", matmul.SIGNATURES), "bf16": ("matmul_bf16_kernel", matmul_bf16.SIGNATURES)}
    libs = {}
    for dtype in dtypes:
        name, signatures = names[dtype]
        if not library_path(name).exists():
            sys.exit(f"{library_path(name)} is missing: build it with `bash compile_cuda.sh`")
        libs[dtype] = load_library(name, signatures)
    return libs


# GPT-2 124M's Linear layers: name -> (in features, out features)
LAYERS = {"qkv": (C, 3 * C), "attn proj": (C, C), "fc": (C, 4 * C), "fc proj": (4 * C, C)}


def shapes() -> List[Tuple[str, Tuple[int, int, int], str, str, str]]:
    """(name, (M, K, N), A layout, B layout, output layout); layout "n" = row-major, "t" = a transposed
    view, "p" = row-major in rows padded to 16 bytes, "pt" = a transposed view of that."""
    out = [("square 4096^3", (4096, 4096, 4096), "n", "n", "n")]
    for layer, (cin, cout) in LAYERS.items():
        out.append((f"{layer} fwd", (T, cin, cout), "n", "n", "n"))
        out.append((f"{layer} dX", (T, cout, cin), "n", "t", "n"))  # dY @ W^T
        out.append((f"{layer} dW", (cin, T, cout), "t", "n", "n"))  # X^T @ dY
    out.append(("lm head fwd", (T, C, VOCAB), "n", "t", "p"))  # logits = X @ E^T
    out.append(("lm head dX", (T, VOCAB, C), "p", "n", "n"))  # dY @ E
    out.append(("lm head dE", (VOCAB, T, C), "pt", "n", "n"))  # dY^T @ X
    return out


K_SWEEP = (768, 1536, 3072, 6144)


def k_sweep_shapes() -> List[Tuple[str, Tuple[int, int, int], str, str, str]]:
    """The fc layer's forward product X @ W (M = T, N = 4C) at every K of K_SWEEP, row-major."""
    return [(f"fc fwd K {k}", (T, k, 4 * C), "n", "n", "n") for k in K_SWEEP]


def line_fit(ks: List[int], ms: List[float]) -> Dict[str, float]:
    """Least-squares ms = intercept + slope * (K / 64): us per K tile of the whole product, and the
    intercept in us (what the output tiles cost besides their K tiles)."""
    slope, intercept = np.polyfit(np.asarray(ks, dtype=float) / 64.0, np.asarray(ms, dtype=float), 1)
    return {"us_per_k_tile": 1000.0 * float(slope), "intercept_us": 1000.0 * float(intercept)}


def padded(shape: Tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """Uninitialized [rows, cols] view of a buffer whose rows are padded to a multiple of 16 bytes."""
    rows, cols = shape
    multiple = 16 // torch.empty((), dtype=dtype).element_size()
    return torch.empty(rows, -(-cols // multiple) * multiple, dtype=dtype, device="cuda")[:, :cols]


def make_operand(shape: Tuple[int, int], layout: str, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """N(0, 1) values (rounded to dtype) in `layout`."""
    stored = shape[::-1] if layout.endswith("t") else shape
    x = padded(stored, dtype) if layout.startswith("p") else torch.empty(stored, dtype=dtype, device="cuda")
    x.copy_(torch.randn(stored, generator=gen, device="cuda"))
    return x.t() if layout.endswith("t") else x


def product_buffers(mkn, la: str, lb: str, lo: str, gen: torch.Generator, dtype: torch.dtype, sets: int,
                    out_dtype: Optional[torch.dtype] = None) -> Tuple[List[Any], List[Any], List[Any]]:  # fmt: skip
    """`sets` input sets of an M x K x N product in layouts la and lb (make_operand), ours' outputs (rows
    padded where lo is "p") and torch's (torch.matmul wants a contiguous out=: its own where ours are
    padded); the outputs in out_dtype, by default the inputs' dtype."""
    M, K, N = mkn
    od = out_dtype or dtype
    inputs = [(make_operand((M, K), la, gen, dtype), make_operand((K, N), lb, gen, dtype)) for _ in range(sets)]
    outs = [padded((M, N), od) if lo == "p" else torch.empty(M, N, dtype=od, device="cuda") for _ in range(sets)]
    torch_outs = [torch.empty(M, N, dtype=od, device="cuda") for _ in range(sets)] if lo == "p" else outs
    return inputs, outs, torch_outs


def contenders(lib: Any, dtype: str, inputs: List[Any], outs: List[Any], torch_outs: List[Any], mkn,
               out_dtype: str = "bfloat16") -> Dict[str, Callable[[int], None]]:  # fmt: skip
    """variant -> a call on input set i, writing outs[i] (ours) or torch_outs[i] (torch). With bf16 inputs,
    out_dtype is ours' output dtype; with "float32" torch's call is torch.mm(out_dtype=torch.float32) (a
    weight gradient as a Linear's backward writes it), which allocates its output."""
    M, K, N = mkn
    a0, b0 = inputs[0]
    strides = (a0.stride(0), a0.stride(1), b0.stride(0), b0.stride(1))
    stream = torch.cuda.current_stream().cuda_stream
    single = MtLayout()
    if dtype == "bf16":
        ws_bytes = lib.matmul_bf16_workspace_bytes(M, N, K, 1, *strides)
        ws16 = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

    def check(code: int) -> None:
        if code:
            raise RuntimeError(lib.minitorch_error_string(code).decode())

    def ours(precision: int) -> Callable[[int], None]:
        ws_floats = lib.matmul_workspace_floats(M, N, K, 1, *strides, precision)
        ws = torch.empty(max(ws_floats, 1), device="cuda")
        return lambda i: check(lib.launch_matmul(
            outs[i].data_ptr(), outs[i].stride(0), inputs[i][0].data_ptr(), inputs[i][1].data_ptr(), M, N, K,
            *strides, single, single, None, 0, None, 0, precision, ws.data_ptr(), ws_floats, stream,
        ))  # fmt: skip

    def ours_bf16(i: int) -> None:
        check(lib.launch_matmul_bf16(
            outs[i].data_ptr(), matmul_bf16.OUT_DTYPES[out_dtype], outs[i].stride(0), inputs[i][0].data_ptr(),
            inputs[i][1].data_ptr(), M, N, K, *strides, single, single, None, 0, None, 0, None, 0, ws16.data_ptr(),
            ws_bytes, stream,
        ))  # fmt: skip

    def theirs(tf32: bool) -> Callable[[int], None]:
        def call(i: int) -> None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.matmul(*inputs[i], out=torch_outs[i])

        return call

    def theirs_float32(i: int) -> None:
        torch.mm(*inputs[i], out_dtype=torch.float32)

    if dtype == "bf16":
        return {"ours bf16": ours_bf16, "torch bf16": theirs(False) if out_dtype == "bfloat16" else theirs_float32}
    return {"ours highest": ours(0), "ours high": ours(1), "torch fp32": theirs(False), "torch tf32": theirs(True)}


def run_shape(libs: Dict[str, Any], name, mkn, la, lb, lo, reps: int) -> Dict[str, Any]:
    """Every variant of every dtype in libs on one product: ms, TFLOP/s, error."""
    M, K, N = mkn
    result: Dict[str, Any] = {"shape": name, "M": M, "K": K, "N": N, "A": la, "B": lb, "out": lo}
    for dtype, lib in libs.items():
        tdtype = TORCH_DTYPES[dtype]
        gen = torch.Generator(device="cuda").manual_seed(0)
        sets = buffer_sets(tdtype.itemsize * (M * K + K * N + M * N), l2_multiple=2.0, most=8)
        inputs, outs, torch_outs = product_buffers(mkn, la, lb, lo, gen, tdtype, sets)
        a, b = inputs[0]
        ref = a.double() @ b.double()
        scale = float(ref.abs().max())
        result[f"{dtype}_input_sets"] = sets
        for v, fn in contenders(lib, dtype, inputs, outs, torch_outs, mkn).items():
            written = (outs if v.startswith("ours") else torch_outs)[0]
            written.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            err = float((written.double() - ref).abs().max()) / scale
            ms = gpu_ms(rotating(lambda i: fn(i % sets)), warmup=3, reps=reps, inner=5)
            result[v] = {"ms": ms, "tflops": 2.0 * M * N * K / ms / 1e9, "rel_err": err}
        torch.backends.cuda.matmul.allow_tf32 = False
    for ratio, (theirs, ours) in RATIOS.items():
        if theirs in result:
            result[ratio] = result[theirs]["ms"] / result[ours]["ms"]
    return result


def panels(results: List[Dict[str, Any]], dtypes: List[str]) -> List[Panel]:
    """TFLOP/s of every variant per product, one panel per input dtype."""
    names = [r["shape"] for r in results]
    return [Panel(names, {v: [r[v]["tflops"] for r in results] for v in VARIANTS[d]}, ylabel="TFLOP/s", rotation=45,
                  title=f"{d} inputs") for d in dtypes]  # fmt: skip


def table(dtypes: List[str]) -> Table:
    variants = [v for d in dtypes for v in VARIANTS[d]]
    ratios = [r for r, (theirs, _) in RATIOS.items() if theirs in variants]
    return Table(
        Column("shape", 14, "shape", left=True), Column("M", 6, "M"), Column("K", 6, "K"), Column("N", 6, "N"),
        *(Column(v, 20, lambda r, v=v: f"{r[v]['ms']:8.3f}ms {r[v]['tflops']:6.1f}TF/s") for v in variants),
        *(Column(ratio.replace("_over_", "/"), 11, ratio, ".2f", "x") for ratio in ratios),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out_option(parser, "bench_matmul")
    parser.add_argument("--reps", type=int, default=20)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="only the square shape and the GPT-2 fc layer")
    which.add_argument("--k-sweep", action="store_true", help="fc fwd at K = 768 .. 6144 and each variant's line fit")
    parser.add_argument("--dtypes", default="fp32,bf16", help="input dtypes to run, of fp32 and bf16")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or set(dtypes) - set(VARIANTS):
        parser.error(f"--dtypes takes a comma-separated subset of {list(VARIANTS)}, got {args.dtypes!r}")
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch")
    libs = load_libraries(dtypes)
    todo = k_sweep_shapes() if args.k_sweep else shapes()
    if args.quick:
        todo = [s for s in todo if s[0].startswith(("square", "fc "))]
    results = []
    printed = table(dtypes)
    printed.header()
    for name, mkn, la, lb, lo in todo:
        r = run_shape(libs, name, mkn, la, lb, lo, args.reps)
        results.append(r)
        printed.row(r)
        print(" " * 36 + "errors: " + "  ".join(f"{v} {r[v]['rel_err']:.2e}" for d in dtypes for v in VARIANTS[d]), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps, "dtypes": dtypes}
    report: Dict[str, Any] = {"meta": meta, "results": results}
    if args.k_sweep:
        ks = [r["K"] for r in results]
        report["fits"] = {v: line_fit(ks, [r[v]["ms"] for r in results]) for d in dtypes for v in VARIANTS[d]}
        for v, fit in report["fits"].items():
            print(f"{v:14s} {fit['us_per_k_tile']:7.2f} us per K tile, intercept {fit['intercept_us']:7.1f} us")
    write_results(args.out, "bench_matmul_k_sweep" if args.k_sweep else "bench_matmul", report, panels(results, dtypes),
                  title=f"matmul on {meta['device']}", size=(14, 5 * len(dtypes)), columns=1)


if __name__ == "__main__":
    main()
