"""Benchmark of the general CUDA kernels (src/combine.cu) against PyTorch on the same GPU, fp32.

Measured side by side in one run:
  - device-to-device copy bandwidth (64M floats; bytes read + written): the floor every
    memory-bound kernel is judged against;
  - map (neg, exp, id = our strided-copy kernel) and zip (add) over 64M contiguous floats, and a
    sum over the last dim of [16384, 4096]: GB/s and % of the copy bandwidth, next to torch's;
  - matmul [4096]^3 and batched [96, 1024, 64] @ [96, 64, 1024]: TFLOP/s and ratio to torch.matmul
    (TF32 off on both sides);
  - host overhead per call of a tiny add (10k calls, wall clock): our backend op, our Tensor op
    (with autodiff bookkeeping), torch.

GPU times are medians over many runs of one call (minitorch.cuda.timer.gpu_ms: CUDA events, after
warm-up, behind a spin kernel that hides the launch).  Backend ops take TensorData, so ours are
called on the TensorData of minitorch tensors sharing torch's buffers.  Results go to
<out>/bench_ops.json and <out>/bench_ops.png (default out: benchmarks/results/bench_ops).

    python benchmarks/bench_ops.py [--out DIR] [--reps N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any, Callable, Dict, List

from common import Column, Panel, Table, copy_gbps, out_option, wall_clock, write_results
import minitorch
from minitorch import cuda_kernel_ops
from minitorch.cuda.timer import gpu_ms

BIG = 64 * 1024 * 1024
REDUCE_SHAPE = (16384, 4096)
MATMULS = [((4096, 4096), (4096, 4096)), ((96, 1024, 64), (96, 64, 1024))]
OVERHEAD_CALLS = 10_000


def host_time_per_call(torch: Any, fns: Dict[str, Callable[[], Any]], calls: int, rounds: int = 5) -> Dict[str, float]:
    """Wall-clock seconds per call of each fn: median over `rounds` rounds of calls // rounds
    back-to-back calls (each round ends with a synchronize).  The fns take turns round by round, so
    a drifting CPU clock affects them alike."""
    per_round = calls // rounds
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            clock = wall_clock(lambda: [fn() for _ in range(per_round)], 1, sync=torch.cuda.synchronize)
            samples[name].append(clock.seconds[0] / per_round)
    return {name: statistics.median(v) for name, v in samples.items()}


def max_rel_err(torch: Any, ours: Any, ref: Any) -> float:
    ref64 = ref.double()
    return float((ours.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1e-30))


def run(reps: int) -> Dict[str, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = minitorch.TensorBackend(minitorch.CudaKernelOps)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", generator=gen)

    def ours(x: Any) -> minitorch.TensorData:
        return minitorch.from_torch(x, backend=cuda)._tensor

    def as_torch(td: minitorch.TensorData) -> Any:
        return minitorch.Tensor(td, backend=cuda).to_torch()

    def gpu_time(fn: Callable[[], Any]) -> float:
        """Median seconds of one call of fn() on the GPU."""
        return gpu_ms(fn, reps=reps, inner=1) / 1e3

    rows: List[Dict[str, Any]] = []

    # ---- bandwidth ----------------------------------------------------------------------------
    x, y = randn(BIG), randn(BIG)
    mx, my = ours(x), ours(y)
    copy = copy_gbps(BIG, reps)

    def bandwidth(name: str, nbytes: int, ours_fn: Callable, torch_fn: Callable, check: Callable) -> None:
        t_ours = gpu_time(ours_fn)
        t_torch = gpu_time(torch_fn)
        rows.append({
            "name": name, "kind": "bandwidth", "bytes": nbytes,
            "ours_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3,
            "ours_gbps": nbytes / t_ours / 1e9, "torch_gbps": nbytes / t_torch / 1e9,
            "ours_pct_copy": 100 * nbytes / t_ours / 1e9 / copy,
            "torch_pct_copy": 100 * nbytes / t_torch / 1e9 / copy,
            "max_rel_err": check(),
        })  # fmt: skip

    bandwidth("copy (map id) [64M]", 2 * BIG * 4, lambda: cuda.id_map(mx), lambda: x.clone(),
              lambda: max_rel_err(torch, as_torch(cuda.id_map(mx)), x))
    bandwidth("neg [64M]", 2 * BIG * 4, lambda: cuda.neg_map(mx), lambda: torch.neg(x),
              lambda: max_rel_err(torch, as_torch(cuda.neg_map(mx)), -x))
    bandwidth("exp [64M]", 2 * BIG * 4, lambda: cuda.exp_map(mx), lambda: torch.exp(x),
              lambda: max_rel_err(torch, as_torch(cuda.exp_map(mx)), torch.exp(x.double())))
    bandwidth("add [64M]", 3 * BIG * 4, lambda: cuda.add_zip(mx, my), lambda: torch.add(x, y),
              lambda: max_rel_err(torch, as_torch(cuda.add_zip(mx, my)), x.double() + y.double()))
    r = randn(*REDUCE_SHAPE)
    mr = ours(r)
    bandwidth(f"sum last dim {list(REDUCE_SHAPE)}", r.numel() * 4 + REDUCE_SHAPE[0] * 4,
              lambda: cuda.add_reduce(mr, 1), lambda: r.sum(1, keepdim=True),
              lambda: max_rel_err(torch, as_torch(cuda.add_reduce(mr, 1)), r.double().sum(1, keepdim=True)))

    # ---- matmul -------------------------------------------------------------------------------
    for sa, sb in MATMULS:
        a, b = randn(*sa), randn(*sb)
        ma, mb = ours(a), ours(b)
        flops = 2.0 * a.numel() * sb[-1]  # batch * M * K multiply-adds per output column
        t_ours = gpu_time(lambda: cuda.matrix_multiply(ma, mb))
        t_torch = gpu_time(lambda: torch.matmul(a, b))
        err = max_rel_err(torch, as_torch(cuda.matrix_multiply(ma, mb)), torch.matmul(a.double(), b.double()))
        rows.append({
            "name": f"matmul {list(sa)} @ {list(sb)}", "kind": "matmul", "flops": flops,
            "ours_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3,
            "ours_tflops": flops / t_ours / 1e12, "torch_tflops": flops / t_torch / 1e12,
            "ratio_to_torch": t_torch / t_ours, "max_rel_err": err,
        })  # fmt: skip

    # ---- host overhead ------------------------------------------------------------------------
    s, u = randn(16), randn(16)
    ms, mu = ours(s), ours(u)
    ts, tu = minitorch.from_torch(s), minitorch.from_torch(u)
    per_call = host_time_per_call(
        torch,
        {"ours_backend_us": lambda: cuda.add_zip(ms, mu), "ours_tensor_us": lambda: ts + tu, "torch_us": lambda: s + u},
        OVERHEAD_CALLS,
    )
    overhead: Dict[str, Any] = {"calls": OVERHEAD_CALLS, **{k: 1e6 * v for k, v in per_call.items()}}
    overhead["ours_backend_vs_torch"] = overhead["ours_backend_us"] / overhead["torch_us"]
    overhead["ours_tensor_vs_torch"] = overhead["ours_tensor_us"] / overhead["torch_us"]

    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": "float32",
        "tf32": False,
        "reps": reps,
        "copy_gbps": copy,
        "rows": rows,
        "overhead": overhead,
    }


BANDWIDTH_TABLE = Table(
    Column("op", 44, "name", left=True),
    Column("ours", 12, "ours_gbps", ".0f", " GB/s"),
    Column("torch", 12, "torch_gbps", ".0f", " GB/s"),
    Column("ours/copy", 10, "ours_pct_copy", ".1f", "%"),
    Column("torch/copy", 10, "torch_pct_copy", ".1f", "%"),
    Column("rel err", 9, "max_rel_err", ".1e"),
)
MATMUL_TABLE = Table(
    Column("op", 44, "name", left=True),
    Column("ours", 14, "ours_tflops", ".1f", " TFLOP/s"),
    Column("torch", 14, "torch_tflops", ".1f", " TFLOP/s"),
    Column("ours/torch", 10, lambda r: 100 * r["ratio_to_torch"], ".1f", "%"),
    Column("rel err", 9, "max_rel_err", ".1e"),
)


def print_table(res: Dict[str, Any]) -> None:
    print(f"{res['device']}  torch {res['torch']}  fp32, TF32 off  median of {res['reps']} runs")
    print(f"device-to-device copy (64M floats): {res['copy_gbps']:.0f} GB/s")
    for table, kind in ((BANDWIDTH_TABLE, "bandwidth"), (MATMUL_TABLE, "matmul")):
        table.header()
        for row in res["rows"]:
            if row["kind"] == kind:
                table.row(row)
    o = res["overhead"]
    print(f"host overhead of a tiny add ({o['calls']} calls): backend op {o['ours_backend_us']:.1f} us, "
          f"Tensor op {o['ours_tensor_us']:.1f} us, torch {o['torch_us']:.1f} us "
          f"(backend / torch = {o['ours_backend_vs_torch']:.2f}x, Tensor / torch = {o['ours_tensor_vs_torch']:.2f}x)")


def panels(res: Dict[str, Any]) -> List[Panel]:
    """Memory-bound kernels as % of the copy bandwidth, matmul TFLOP/s, and host time per call, ours
    next to torch's."""
    bw = [r for r in res["rows"] if r["kind"] == "bandwidth"]
    mm = [r for r in res["rows"] if r["kind"] == "matmul"]
    o = res["overhead"]
    return [
        Panel([r["name"] for r in bw], {"minitorch": [r["ours_pct_copy"] for r in bw],
                                        "torch": [r["torch_pct_copy"] for r in bw]},
              ref=100, rotation=20, ylabel=f"% of copy bandwidth ({res['copy_gbps']:.0f} GB/s)",
              title="memory-bound kernels"),
        Panel([r["name"].replace("matmul ", "").replace(" @ ", "\n@ ") for r in mm],
              {"minitorch": [r["ours_tflops"] for r in mm], "torch": [r["torch_tflops"] for r in mm]},
              ylabel="TFLOP/s (fp32, no TF32)", title="matmul"),
        Panel(["minitorch\nbackend op", "minitorch\nTensor op", "torch"],
              {"us": [o["ours_backend_us"], o["ours_tensor_us"], o["torch_us"]]}, colors=["C0", "C0", "C1"],
              ylabel="host time per call (us)", title=f"tiny add, {o['calls']} calls"),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    out_option(parser, "bench_ops")
    parser.add_argument("--reps", type=int, default=30, help="timed runs per measurement (median reported)")
    args = parser.parse_args()
    reason = cuda_kernel_ops.unavailable_reason()
    if reason is not None:
        print(f"bench_ops: cannot run: {reason}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench_ops: needs a torch CUDA device", file=sys.stderr)
        return 2
    res = run(args.reps)
    print_table(res)
    write_results(args.out, "bench_ops", res, panels(res), title=f"minitorch CUDA kernels vs torch on {res['device']}",
                  size=(17, 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
