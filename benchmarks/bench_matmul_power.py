"""The bf16 square product under sustained load: SM clock and board power beside the time per product.

A GPU held at its power limit lowers its SM clock, so two kernels that do the same work per cycle can
still differ in speed by the energy each cycle costs. Each contender (minitorch's bf16 library, and
torch.matmul in bf16: cuBLAS) runs the product back to back for --seconds on rotating input sets, as
bench_matmul.py feeds it, while `nvidia-smi` samples the SM clock and the board power every 50 ms; the
first 4 samples and the last 2 (the loop starting and stopping) are dropped. The time per product is the
loop's CUDA-event time over its products, so it counts the clock the loop ran at, unlike
bench_matmul.py's short medians.

Usage: python benchmarks/bench_matmul_power.py [--size M,K,N] [--seconds S] [--rounds R] [--out DIR]
Writes DIR/bench_matmul_power.json and DIR/bench_matmul_power.png (default DIR:
benchmarks/results/bench_matmul_power): the SM clock of each contender's loop over time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any, Callable, Dict, List

import torch

from bench_matmul import contenders, load_libraries, product_buffers
from common import Column, Panel, Table, buffer_sets, out_option, write_results

QUERY = "clocks.sm,power.draw,temperature.gpu"
SKIP_FIRST, SKIP_LAST = 4, 2


def parse_samples(text: str) -> List[List[float]]:
    """nvidia-smi's csv lines (clock MHz, power W, temperature C) as numbers, the loop's start and end
    dropped; lines that are not three numbers (a sample cut off by the stop) are skipped."""
    rows = []
    for line in text.strip().splitlines():
        cells = line.split(",")
        if len(cells) != 3:
            continue
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            continue
    return rows[SKIP_FIRST:len(rows) - SKIP_LAST]


def summarize(name: str, us: float, samples: List[List[float]]) -> Dict[str, Any]:
    """One round of one contender: its time per product and its samples' medians and extremes."""
    if not samples:
        raise RuntimeError(f"{name}: nvidia-smi gave no samples; run longer (--seconds)")
    clocks, power = [s[0] for s in samples], [s[1] for s in samples]
    return {"contender": name, "us": us, "clock_mhz": statistics.median(clocks), "clock_min": min(clocks),
            "power_w": statistics.median(power), "temp_c": max(s[2] for s in samples), "samples": len(samples),
            "clocks": clocks}  # fmt: skip


def sustained(fn: Callable[[int], None], sets: int, seconds: float) -> Dict[str, Any]:
    """fn over the input sets for `seconds` while nvidia-smi samples: us per product and the samples."""
    for i in range(50):  # warm-up
        fn(i % sets)
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    products, t0 = 0, time.time()
    start.record()
    while time.time() - t0 < seconds:
        for i in range(100):
            fn(i % sets)
        products += 100
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    return {"us": start.elapsed_time(end) / products * 1000.0, "samples": parse_samples(smi.communicate()[0])}


TABLE = Table(Column("round", 5, "round"), Column("contender", 12, "contender", left=True),
              Column("us/product", 10, "us", ".1f"), Column("SM MHz", 7, "clock_mhz", ".0f"),
              Column("min MHz", 7, "clock_min", ".0f"), Column("power W", 7, "power_w", ".0f"),
              Column("max C", 5, "temp_c", ".0f"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4096,4096,4096", help="M,K,N of the product (default 4096^3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="each contender's loop (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both contenders in turn (default 2)")
    out_option(parser, "bench_matmul_power")
    args = parser.parse_args()
    M, K, N = (int(x) for x in args.size.split(","))
    lib = load_libraries(["bf16"])["bf16"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = buffer_sets(2 * (M * K + K * N + M * N), l2_multiple=2.0, most=8)
    inputs, outs, torch_outs = product_buffers((M, K, N), "n", "n", "n", gen, torch.bfloat16, sets)
    fns = contenders(lib, "bf16", inputs, outs, torch_outs, (M, K, N))
    print(f"bf16 {M} x {K} x {N} on {torch.cuda.get_device_name()}, {args.seconds:.0f} s a loop")
    TABLE.header()
    rounds = []
    for r in range(1, args.rounds + 1):
        for name, fn in fns.items():
            run = sustained(fn, sets, args.seconds)
            row = {"round": r, **summarize(name, run["us"], run["samples"])}
            rounds.append(row)
            print(TABLE.line(row), flush=True)
    report(rounds, (M, K, N), args.seconds, args.out)


def report(rounds: List[Dict[str, Any]], size, seconds: float, out) -> None:
    """The rounds as JSON, and each loop's SM clock over time as a PNG."""
    longest = max(len(row["clocks"]) for row in rounds)
    series = {f"{row['contender']} #{row['round']}": row["clocks"] + [None] * (longest - len(row["clocks"]))
              for row in rounds}  # fmt: skip
    panel = Panel(list(range(longest)), series, kind="lines", xlabel="nvidia-smi sample (~50 ms apart)",
                  ylabel="SM clock (MHz)", title="bf16 {} x {} x {}, looped".format(*size))  # fmt: skip
    write_results(out, "bench_matmul_power", {"size": list(size), "seconds": seconds, "rounds": rounds}, [panel],
                  title="SM clock under sustained load")  # fmt: skip


if __name__ == "__main__":
    main()
