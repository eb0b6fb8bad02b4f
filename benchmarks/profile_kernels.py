"""Where a program's GPU time goes: run a Python program under torch.profiler and list its kernels.

Our kernels are launched through ctypes on PyTorch's current stream, so CUPTI (which torch.profiler
reads) records them next to PyTorch's own, by their C++ names, including those replayed from CUDA
graphs. The table gives each kernel's total GPU time, launches, mean time and share of all kernel
time, then the program's wall time and the part of it the GPU spent in kernels (the rest is host
time or idle GPU), and the GPU's idle gaps between kernels: a CUDA graph's kernels start one after
another, and each boundary costs the drain of one kernel's last blocks and the launch of the next,
so the short gaps (under --gap-us) add up what launches cost a program that is otherwise GPU-bound.
Kernel times overlap (two streams, or a dependent launch waiting through the tail of the kernel
before it), so the table also charges each kernel with the time it adds to the GPU's busy span
("adds ms": launches in start order, each with how far it extends the union of the earlier ones); that
column sums to the busy time and is each kernel's share of a GPU-bound program's time.

Usage: python benchmarks/profile_kernels.py [--top 25] [--out FILE.json] [--trace TRACE.json] -- program.py [args]
(benchmarks/results/profile_kernels/ keeps the tables quoted in the README and the notes.)
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from common import Column, Table, write_json


def device_spans(profiler: Any) -> List[Tuple[float, float, str]]:
    """(start, end, name) in microseconds of every device activity (kernels, copies), by start."""
    from torch.autograd import DeviceType

    return sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in profiler.events()
        if e.device_type == DeviceType.CUDA and e.device_time > 0
    )


def kernel_rows(profiler: Any) -> List[Dict[str, Any]]:
    """One row per kernel name: total and mean GPU microseconds, launches and the microseconds the
    launches add to the busy span (adds_us, see the module notes), largest total first."""
    from torch.autograd import DeviceType

    rows: Dict[str, Dict[str, Any]] = {}
    for event in profiler.events():
        if event.device_type != DeviceType.CUDA or event.device_time <= 0:
            continue
        row = rows.setdefault(event.name, {"kernel": event.name, "total_us": 0.0, "launches": 0, "adds_us": 0.0})
        row["total_us"] += event.device_time
        row["launches"] += 1
    end = None
    for start, stop, name in device_spans(profiler):
        rows[name]["adds_us"] += stop - start if end is None or start > end else max(0.0, stop - end)
        end = stop if end is None else max(end, stop)
    ordered = sorted(rows.values(), key=lambda r: -r["total_us"])
    for row in ordered:
        row["mean_us"] = row["total_us"] / row["launches"]
    return ordered


def idle_gaps(profiler: Any, short_us: float) -> Dict[str, float]:
    """The union of all device activity and the idle gaps inside it: busy_ms, and the count, total
    and median of the gaps shorter than short_us (those between launches, not host pauses)."""
    busy, gaps, end = 0.0, [], None
    for start, stop, _ in device_spans(profiler):
        if end is None or start > end:
            if end is not None:
                gaps.append(start - end)
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    short = sorted(g for g in gaps if g < short_us)
    return {
        "busy_ms": busy / 1e3,
        "short_gaps": len(short),
        "short_gap_ms": sum(short) / 1e3,
        "median_short_gap_us": short[len(short) // 2] if short else 0.0,
    }


def main(argv: List[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=25, help="kernels to print")
    parser.add_argument("--out", default=None, help="write the whole table as JSON here")
    parser.add_argument("--gap-us", type=float, default=50.0, help="idle gaps shorter than this count as launch gaps")
    parser.add_argument("--trace", default=None, help="also write the kernels in order as a Chrome trace (Perfetto)")
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
    busy = sum(r["adds_us"] for r in rows)
    table = Table(
        Column("kernel", 89, lambda r: r["kernel"][:89], left=True),
        Column("total ms", 9, lambda r: r["total_us"] / 1e3, ".2f"),
        Column("launches", 9, "launches"),
        Column("mean us", 9, "mean_us", ".1f"),
        Column("share", 7, lambda r: 100 * r["total_us"] / max(total, 1e-9), ".1f", "%"),
        Column("adds ms", 8, lambda r: r["adds_us"] / 1e3, ".2f"),
        Column("of busy", 8, lambda r: 100 * r["adds_us"] / max(busy, 1e-9), ".1f", "%"),
    )
    print()
    table.header()
    for r in rows[: args.top]:
        table.row(r)
    print(f"{len(rows)} kernels, {total / 1e3:.1f} ms of kernel time in {wall:.2f} s of wall time "
          f"({100 * total / 1e6 / wall:.1f}% of the wall time)")  # fmt: skip
    gaps = idle_gaps(prof, args.gap_us)
    print(f"GPU busy (union of all device activity) {gaps['busy_ms']:.1f} ms; {gaps['short_gaps']} idle gaps under "
          f"{args.gap_us:g} us add up to {gaps['short_gap_ms']:.2f} ms (median {gaps['median_short_gap_us']:.2f} us)")
    if args.trace:
        prof.export_chrome_trace(args.trace)
    if args.out:
        write_json(args.out, {"program": program, "wall_s": wall, "kernels": rows, "gaps": gaps})


if __name__ == "__main__":
    main()
