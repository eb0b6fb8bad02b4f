"""Benchmark of the fused attention-softmax and LayerNorm kernels (forward and backward).

For each shape it times, on the GPU:
  kernel   our launcher called directly through ctypes on torch buffers (data_ptr), the figure the
           bandwidth columns use;
  api      the same op through minitorch's kernel hook (CudaKernelOps on the TensorData of minitorch
           tensors sharing those buffers): the kernel plus whatever the binding launches around it;
  torch    PyTorch's own ops: softmax(x + mask) / softmax(x), aten._softmax_backward_data,
           layer_norm (native_layer_norm) and native_layer_norm_backward (what its autograd runs);
  unfused  minitorch's composed implementation (the references in minitorch/fused/softmax.py and
           layernorm.py) on the CUDA backend.
Times are medians of per-call GPU time from minitorch.cuda.timer.gpu_ms: a spin kernel holds the
GPU while a batch of calls is queued, so the CUDA events around the batch see back-to-back kernels
and no Python overhead.  Inputs (and the kernel's outputs) rotate over several buffers when one set
fits in L2, so the figures are DRAM figures. Bandwidth = bytes the op must move / kernel time, shown against a
device-to-device copy measured in the same run.

Usage: python benchmarks/bench_fused.py [--out DIR] [--quick]
Writes DIR/bench_fused.json and DIR/bench_fused.png (default DIR: benchmarks/results/bench_fused).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional

from common import Column, Panel, Table, buffer_sets, copy_gbps, out_option, rotating, write_results
import minitorch
from minitorch.cuda.libraries import kernel_library
from minitorch.cuda.timer import gpu_ms
from minitorch.fused.layernorm import layernorm_backward_reference, layernorm_reference
from minitorch.fused.softmax import softmax_backward_reference, softmax_reference

SOFTMAX_SHAPES = [(128, 8, 40, 40), (8, 12, 1024, 1024), (4, 16, 2048, 2048)]
LAYERNORM_SHAPES = [(5120, 256), (16384, 768), (65536, 1024), (8192, 4096)]
EPS = 1e-5


def softmax_cases(torch: Any, lib: Any, shapes: List[tuple]) -> List[Dict[str, Any]]:
    stream = torch.cuda.current_stream().cuda_stream
    cases = []
    for shape in shapes:
        B, H, Tq, Tk = shape
        n = B * H * Tq * Tk
        k = buffer_sets(2 * n * 4)
        gen = torch.Generator(device="cuda").manual_seed(0)
        xs = [torch.randn(shape, device="cuda", generator=gen) for _ in range(k)]
        ys = [torch.empty(shape, device="cuda") for _ in range(k)]
        mask = torch.zeros(B, Tk, device="cuda")
        mask[B // 2:, Tk // 2:] = float("-inf")
        mask4 = mask.view(B, 1, 1, Tk)
        xm = [minitorch.from_torch(x) for x in xs]
        mm = minitorch.from_torch(mask)

        for masked in (True, False):
            mptr = mask.data_ptr() if masked else None
            mmt = mm if masked else None
            mmd = mm._tensor if masked else None

            def kernel(i, mptr=mptr):
                j = i % k
                lib.launch_attn_softmax(0, ys[j].data_ptr(), xs[j].data_ptr(), mptr, B, H, Tq, Tk, 0, stream)

            def api(i, mmd=mmd):
                minitorch.CudaKernelOps.attn_softmax_fw(xm[i % k]._tensor, mmd, False)

            def reference(i, masked=masked):
                x = xs[i % k]
                torch.softmax(x + mask4 if masked else x, -1)

            def unfused(i, mmt=mmt):
                softmax_reference(xm[i % k], mmt, False)

            cases.append({
                "op": "softmax fw" + (" + mask" if masked else ""),
                "shape": list(shape),
                "bytes": 4 * (2 * n + (B * Tk if masked else 0)),
                "fns": (kernel, api, reference, unfused),
            })

        # Backward: y a softmax output, g a random gradient; dx rotates with them.
        gs = [torch.randn(shape, device="cuda", generator=gen) for _ in range(k)]
        ss = [torch.softmax(x, -1) for x in xs]
        gm = [minitorch.from_torch(g) for g in gs]
        sm = [minitorch.from_torch(s) for s in ss]

        def kernel_bw(i):
            j = i % k
            lib.launch_attn_softmax_bw(0, ys[j].data_ptr(), gs[j].data_ptr(), ss[j].data_ptr(), B * H * Tq, Tk, stream)

        def api_bw(i):
            minitorch.CudaKernelOps.attn_softmax_bw(gm[i % k]._tensor, sm[i % k]._tensor)

        def reference_bw(i):
            torch.ops.aten._softmax_backward_data(gs[i % k], ss[i % k], -1, torch.float32)

        def unfused_bw(i):
            softmax_backward_reference(gm[i % k], sm[i % k])

        cases.append({"op": "softmax bw", "shape": list(shape), "bytes": 4 * 3 * n,
                      "fns": (kernel_bw, api_bw, reference_bw, unfused_bw)})
    return cases


def layernorm_cases(torch: Any, lib: Any, shapes: List[tuple]) -> List[Dict[str, Any]]:
    stream = torch.cuda.current_stream().cuda_stream
    cases = []
    for rows, C in shapes:
        n = rows * C
        k = buffer_sets(3 * n * 4)
        gen = torch.Generator(device="cuda").manual_seed(1)
        xs = [torch.randn(rows, C, device="cuda", generator=gen) for _ in range(k)]
        dys = [torch.randn(rows, C, device="cuda", generator=gen) for _ in range(k)]
        outs = [torch.empty(rows, C, device="cuda") for _ in range(k)]
        means = [torch.empty(rows, device="cuda") for _ in range(k)]
        rstds = [torch.empty(rows, device="cuda") for _ in range(k)]
        gamma = 1.0 + 0.1 * torch.randn(C, device="cuda", generator=gen)
        beta = 0.1 * torch.randn(C, device="cuda", generator=gen)
        dgamma, dbeta = torch.empty(C, device="cuda"), torch.empty(C, device="cuda")
        ws = torch.empty(max(1, lib.layernorm_bw_workspace_floats(rows, C)), device="cuda")
        for j in range(k):
            lib.launch_layernorm(0, outs[j].data_ptr(), means[j].data_ptr(), rstds[j].data_ptr(), xs[j].data_ptr(),
                                 gamma.data_ptr(), beta.data_ptr(), rows, C, EPS, stream)
        xm, dym = [minitorch.from_torch(x) for x in xs], [minitorch.from_torch(d) for d in dys]
        mm, rm = [minitorch.from_torch(m) for m in means], [minitorch.from_torch(r) for r in rstds]
        gmt, bmt = minitorch.from_torch(gamma), minitorch.from_torch(beta)
        tmean_rstd = [torch.ops.aten.native_layer_norm(x, (C,), gamma, beta, EPS)[1:] for x in xs]

        def kernel(i):
            j = i % k
            lib.launch_layernorm(0, outs[j].data_ptr(), means[j].data_ptr(), rstds[j].data_ptr(), xs[j].data_ptr(),
                                 gamma.data_ptr(), beta.data_ptr(), rows, C, EPS, stream)

        def api(i):
            minitorch.CudaKernelOps.layernorm_fw(xm[i % k]._tensor, gmt._tensor, bmt._tensor, EPS)

        def reference(i):
            torch.nn.functional.layer_norm(xs[i % k], (C,), gamma, beta, EPS)

        def unfused(i):
            layernorm_reference(xm[i % k], gmt, bmt, EPS)

        cases.append({"op": "layernorm fw", "shape": [rows, C], "bytes": 4 * (2 * n + 2 * C + 2 * rows),
                      "fns": (kernel, api, reference, unfused)})

        def kernel_bw(i):
            j = i % k
            lib.launch_layernorm_bw(0, outs[j].data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), dys[j].data_ptr(),
                                    xs[j].data_ptr(), gamma.data_ptr(), means[j].data_ptr(), rstds[j].data_ptr(),
                                    None, ws.data_ptr(), rows, C, stream)

        def api_bw(i):
            j = i % k
            minitorch.CudaKernelOps.layernorm_bw(dym[j]._tensor, xm[j]._tensor, gmt._tensor, mm[j]._tensor, rm[j]._tensor)

        def reference_bw(i):
            j = i % k
            torch.ops.aten.native_layer_norm_backward(dys[j], xs[j], (C,), tmean_rstd[j][0], tmean_rstd[j][1],
                                                      gamma, beta, [True, True, True])

        def unfused_bw(i):
            j = i % k
            layernorm_backward_reference(dym[j], xm[j], gmt, mm[j], rm[j])

        cases.append({"op": "layernorm bw", "shape": [rows, C], "bytes": 4 * (3 * n + 3 * C + 2 * rows),
                      "fns": (kernel_bw, api_bw, reference_bw, unfused_bw)})
    return cases


def measure(torch: Any, reps: int, cases: List[Dict[str, Any]], copy: float) -> List[Dict[str, Any]]:
    results = []
    for case in cases:
        kernel, api, reference, unfused = case.pop("fns")
        t = {name: gpu_ms(rotating(fn), reps=reps) for name, fn in
             (("kernel", kernel), ("api", api), ("torch", reference), ("unfused", unfused))}
        torch.cuda.synchronize()
        gbps = case["bytes"] / (t["kernel"] * 1e-3) / 1e9
        torch_gbps = case["bytes"] / (t["torch"] * 1e-3) / 1e9
        row = dict(case)
        row.update({
            "kernel_us": t["kernel"] * 1e3, "api_us": t["api"] * 1e3, "torch_us": t["torch"] * 1e3,
            "unfused_us": t["unfused"] * 1e3, "gbps": gbps, "pct_copy": 100 * gbps / copy,
            "torch_gbps": torch_gbps, "torch_pct_copy": 100 * torch_gbps / copy,
            "speedup_vs_torch": t["torch"] / t["kernel"], "speedup_vs_unfused": t["unfused"] / t["api"],
        })
        results.append(row)
        TABLE.row(row)
    return results


TABLE = Table(
    Column("op", 18, "op", left=True),
    Column("shape", 20, lambda r: str(r["shape"]), left=True),
    Column("kernel us", 10, "kernel_us", ".1f"),
    Column("GB/s", 7, "gbps", ".0f"),
    Column("%copy", 6, "pct_copy", ".0f", "%"),
    Column("torch us", 10, "torch_us", ".1f"),
    Column("%copy", 6, "torch_pct_copy", ".0f", "%"),
    Column("vs torch", 8, "speedup_vs_torch", ".2f", "x"),
    Column("api us", 10, "api_us", ".1f"),
    Column("unfused us", 11, "unfused_us", ".1f"),
    Column("vs unfused", 10, "speedup_vs_unfused", ".1f", "x"),
)


def panels(results: List[Dict[str, Any]], copy: float) -> List[Panel]:
    """Share of the copy bandwidth (ours and torch's) and the speedups, per op and shape."""
    labels = [f"{r['op']}\n{'x'.join(str(s) for s in r['shape'])}" for r in results]

    def series(**keys: str) -> Dict[str, List[float]]:
        return {name: [r[key] for r in results] for name, key in keys.items()}

    return [
        Panel(labels, series(**{"minitorch fused kernel": "pct_copy", "PyTorch": "torch_pct_copy"}), ref=100,
              ylabel=f"% of copy bandwidth ({copy:.0f} GB/s)", rotation=60),
        Panel(labels, series(**{"speedup vs PyTorch": "speedup_vs_torch",
                                "speedup vs minitorch unfused": "speedup_vs_unfused"}),
              ref=1, log=True, ylabel="speedup (x)", rotation=60),
    ]  # fmt: skip


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    out_option(parser, "bench_fused")
    parser.add_argument("--quick", action="store_true", help="only the first shape of each kernel, fewer repeats")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_fused.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    softmax_lib = kernel_library("softmax_kernel")
    layernorm_lib = kernel_library("layernorm_kernel")
    reps = 3 if args.quick else 9
    device = torch.cuda.get_device_name(0)
    copy = copy_gbps(reps=reps)
    print(f"device: {device}; torch {torch.__version__}; device-to-device copy {copy:.0f} GB/s")
    print("kernel = our launcher through ctypes on torch buffers (GB/s and %copy use it); api = through minitorch;")
    print("torch = PyTorch's ops; unfused = minitorch's composed reference; all median GPU time per call")
    TABLE.header()

    sm_shapes = SOFTMAX_SHAPES[:1] if args.quick else SOFTMAX_SHAPES
    ln_shapes = LAYERNORM_SHAPES[:1] if args.quick else LAYERNORM_SHAPES
    results = []
    # One group at a time, so the buffers of a group are freed before the next is allocated.
    for make, lib, shapes in ((softmax_cases, softmax_lib, sm_shapes), (layernorm_cases, layernorm_lib, ln_shapes)):
        for shape in shapes:
            results += measure(torch, reps, make(torch, lib, [shape]), copy)
            torch.cuda.empty_cache()

    report = {
        "device": device,
        "torch": torch.__version__,
        "copy_gbps": copy,
        "timing": "minitorch.cuda.timer.gpu_ms: median GPU time per call (events around back-to-back calls behind a spin kernel)",
        "kernel_column": "launch_* through ctypes on torch buffers",
        "results": results,
    }
    write_results(args.out, "bench_fused", report, panels(results, copy), columns=1,
                  title=f"Fused softmax / LayerNorm, fp32, {device}", size=(max(10, 0.9 * len(results)), 9))
    return 0


if __name__ == "__main__":
    sys.exit(main())
