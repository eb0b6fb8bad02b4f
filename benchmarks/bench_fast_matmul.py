"""Benchmark of FastOps (numba, CPU) matmul against NumPy's (BLAS) on [256, 256] x [256, 256] float32.

Both run on the same inputs in the same process after warm-up (the first FastOps call compiles
the kernel); each figure is the median of many timed runs.  FastOps is timed with all of numba's
threads (the ratio) and with one.  The target of issue 2: FastOps within 10x of NumPy.  Prints a
table and writes <out>/bench_fast_matmul.json (default out: benchmarks/results/bench_fast_matmul).

    python benchmarks/bench_fast_matmul.py [--size N] [--reps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any, Callable, Dict

import numba
import numpy as np

from common import Column, Table, out_option, wall_clock, write_results
import minitorch

TARGET_RATIO = 10.0


def median_seconds(fn: Callable[[], Any], reps: int, warmup: int) -> Dict[str, float]:
    clock = wall_clock(fn, reps, warmup)
    return {"median_s": clock.median, "min_s": min(clock.seconds)}


def run(size: int, reps: int) -> Dict[str, Any]:
    backend = minitorch.TensorBackend(minitorch.FastOps)
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((size, size)).astype(np.float32)
    b_np = rng.standard_normal((size, size)).astype(np.float32)
    a = minitorch.tensor_from_numpy(a_np, backend=backend)
    b = minitorch.tensor_from_numpy(b_np, backend=backend)

    ref = a_np.astype(np.float64) @ b_np.astype(np.float64)
    ours = (a @ b).to_numpy()
    rel_err = float(np.abs(ours - ref).max() / np.abs(ref).max())

    flops = 2.0 * size**3
    threads = numba.get_num_threads()
    timings = {"fastops": median_seconds(lambda: a @ b, reps, warmup=5)}
    # One thread too: on a shared machine the parallel figure swings with the other load.
    numba.set_num_threads(1)
    timings["fastops_1_thread"] = median_seconds(lambda: a @ b, reps, warmup=5)
    numba.set_num_threads(threads)
    timings["numpy"] = median_seconds(lambda: a_np @ b_np, reps, warmup=5)
    for t in timings.values():
        t["gflops"] = flops / t["median_s"] / 1e9
    ratio = timings["fastops"]["median_s"] / timings["numpy"]["median_s"]
    return {
        "shape": [[size, size], [size, size]],
        "dtype": "float32",
        "reps": reps,
        "timings": timings,
        "ratio_fastops_over_numpy": ratio,
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "max_rel_err_vs_float64": rel_err,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "numba_threads": threads,
            "numba_threading_layer": numba.threading_layer(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "numba": numba.__version__,
        },
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_table(result: Dict[str, Any]) -> None:
    size = result["shape"][0][0]
    print(f"matmul [{size},{size}] x [{size},{size}] float32, median of {result['reps']} runs")
    table = Table(
        Column("backend", 17, "backend", left=True),
        Column("median ms", 10, lambda t: 1e3 * t["median_s"], ".3f"),
        Column("min ms", 10, lambda t: 1e3 * t["min_s"], ".3f"),
        Column("GFLOP/s", 10, "gflops", ".2f"),
    )
    table.header()
    for name, t in result["timings"].items():
        table.row({"backend": name, **t})
    verdict = "within" if result["within_target"] else "OUTSIDE"
    print(
        f"ratio FastOps / NumPy: {result['ratio_fastops_over_numpy']:.2f}x "
        f"({verdict} the {result['target_ratio']:.0f}x target); "
        f"max rel err vs float64: {result['max_rel_err_vs_float64']:.2e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--reps", type=int, default=200)
    out_option(parser, "bench_fast_matmul")
    args = parser.parse_args()
    result = run(args.size, args.reps)
    print_table(result)
    write_results(args.out, "bench_fast_matmul", result)


if __name__ == "__main__":
    main()
