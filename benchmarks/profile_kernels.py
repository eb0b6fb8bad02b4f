"""Where a program's GPU time goes: run a Python program under torch.profiler and list its kernels.

Our kernels are launched through ctypes on PyTorch's current stream, so CUPTI (which torch.profiler
reads) records them next to PyTorch's own, by their C++ names, including those replayed from CUDA
graphs. The table gives each kernel's total GPU time, launches, mean time and share of all kernel
time, then the program's wall time and the part of it the GPU spent in kernels (the rest is host
time or idle GPU).

Usage: python benchmarks/profile_kernels.py [--top 25] [--out FILE.json] -- program.py [its arguments]
(benchmarks/results/profile_kernels/ keeps the tables quoted in the README and the notes.)
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from common import Column, Table, write_json


def kernel_rows(profiler: Any) -> List[Dict[str, Any]]:
    """One row per kernel name: total and mean GPU microseconds and launches, largest total first."""
    from torch.autograd import DeviceType

    rows: Dict[str, Dict[str, Any]] = {}
    for event in profiler.events():
        if event.device_type != DeviceType.CUDA or event.device_time <= 0:
            continue
        row = rows.setdefault(event.name, {"kernel": event.name, "total_us": 0.0, "launches": 0})
        row["total_us"] += event.device_time
        row["launches"] += 1
    ordered = sorted(rows.values(), key=lambda r: -r["total_us"])
    for row in ordered:
        row["mean_us"] = row["total_us"] / row["launches"]
    return ordered


def main(argv: List[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=25, help="kernels to print")
    parser.add_argument("--out", default=None, help="write the whole table as JSON here")
    args = parser.parse_args(argv[:split])
    program = argv[split + 1 :]
    if not program:
        parser.error("give the program after '--', e.g. -- project/train_gpt2.py --help")
    if not Path(program[0]).is_file():
        parser.error(f"no program file {program[0]}")

    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.argv = program
    sys.path.insert(0, str(Path(program[0]).resolve().parent))
    start = time.perf_counter()
    gpu = torch.cuda.is_available()  # without one, the program still runs (CPU activity), and no kernel is listed
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        try:
            runpy.run_path(program[0], run_name="__main__")
        finally:
            if gpu:
                torch.cuda.synchronize()
    wall = time.perf_counter() - start
    rows = kernel_rows(prof)
    total = sum(r["total_us"] for r in rows)
    table = Table(
        Column("kernel", 89, lambda r: r["kernel"][:89], left=True),
        Column("total ms", 9, lambda r: r["total_us"] / 1e3, ".2f"),
        Column("launches", 9, "launches"),
        Column("mean us", 9, "mean_us", ".1f"),
        Column("share", 7, lambda r: 100 * r["total_us"] / max(total, 1e-9), ".1f", "%"),
    )
    print()
    table.header()
    for r in rows[: args.top]:
        table.row(r)
    print(f"{len(rows)} kernels, {total / 1e3:.1f} ms of kernel time in {wall:.2f} s of wall time "
          f"({100 * total / 1e6 / wall:.1f}% of the wall time)")  # fmt: skip
    if args.out:
        write_json(args.out, {"program": program, "wall_s": wall, "kernels": rows})


if __name__ == "__main__":
    main()
