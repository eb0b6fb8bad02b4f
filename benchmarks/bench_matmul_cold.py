"""The bf16 products as a training step meets them: each launch timed alone, after other work.

bench_matmul.py times a product back to back, so each launch finds its instructions in the SMs' caches and
its neighbours' tails overlap it. Inside a step a product follows other kernels: its operands come from
DRAM or L2 as the kernel before left them, and its SMs fetch its instructions afresh. Here every timed
launch of each contender (minitorch's bf16 library, torch.matmul in bf16: cuBLAS) comes after
  - "flushed": a 256 MB write that evicts L2;
  - "after other": minitorch's float32 product of 2048^3 (another library's kernel on every SM), then
    that write.
CUDA events around the one launch, 40 launches a round, rounds of both contenders in turn; the median of a
contender's launches over the rounds. The products are bench_matmul.py's GPT-2 124M ones (bf16 output)
and each Linear's weight gradient as its backward writes it (d^T x into float32, which torch.mm gives with
out_dtype).

Usage: python benchmarks/bench_matmul_cold.py [--rounds R] [--launches L] [--out DIR]
Writes DIR/bench_matmul_cold.json and DIR/bench_matmul_cold.png (default DIR:
benchmarks/results/bench_matmul_cold): the ratio cuBLAS time / ours per product in both conditions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any, Callable, Dict, List, Tuple

import torch

from bench_matmul import LAYERS, T, contenders, load_libraries, product_buffers, shapes
from common import Column, Panel, Table, out_option, write_results

CONDITIONS = ("flushed", "after other")
CONTENDERS = ("ours bf16", "torch bf16")
FLUSH_BYTES = 256 << 20
OTHER = 2048  # the float32 product between launches: OTHER^3
TORCH_OUT = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def weight_gradient_shapes() -> List[Tuple[str, Tuple[int, int, int], str, str, str]]:
    """bench_matmul.shapes()'s entries for each GPT-2 Linear's weight gradient d^T x as its backward runs it:
    out features x T x in features, d [T, out] read transposed, x [T, in] row-major."""
    return [(f"{layer} dW f32", (cout, T, cin), "t", "n", "n") for layer, (cin, cout) in LAYERS.items()]


class Launches:
    """Times single launches after each condition's work."""

    def __init__(self, libs: Dict[str, Any], count: int) -> None:
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        gen = torch.Generator(device="cuda").manual_seed(1)
        a, b = (torch.randn(OTHER, OTHER, generator=gen, device="cuda") for _ in range(2))
        self.other = contenders(libs["fp32"], "fp32", [(a, b)], [torch.empty_like(a)], [], (OTHER,) * 3)["ours highest"]
        self.events = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) for _ in range(count)]

    def times(self, fn: Callable[[int], None], condition: str) -> List[float]:
        """Microseconds of each of the launches of fn, each after the condition's work."""
        for _ in range(3):
            fn(0)
        for start, end in self.events:
            if condition == "after other":
                self.other(0)
            self.flush.zero_()
            start.record()
            fn(0)
            end.record()
        torch.cuda.synchronize()
        return [1000.0 * start.elapsed_time(end) for start, end in self.events]


def run_product(launches: Launches, name: str, mkn, fns: Dict[str, Callable[[int], None]], rounds: int
                ) -> Dict[str, Any]:  # fmt: skip
    """Both contenders in both conditions, rounds in turn: median us and the ratio torch / ours."""
    samples: Dict[Tuple[str, str], List[float]] = {(v, c): [] for v in CONTENDERS for c in CONDITIONS}
    for _ in range(rounds):
        for v in CONTENDERS:
            for c in CONDITIONS:
                samples[(v, c)] += launches.times(fns[v], c)
    row: Dict[str, Any] = {"shape": name, "M": mkn[0], "K": mkn[1], "N": mkn[2]}
    for c in CONDITIONS:
        ours, theirs = (statistics.median(samples[(v, c)]) for v in CONTENDERS)
        row[c] = {"ours_us": ours, "torch_us": theirs, "ratio": theirs / ours}
    return row


def cells(c: str) -> Callable[[Dict[str, Any]], str]:
    return lambda r: f"{r[c]['ours_us']:8.1f} {r[c]['torch_us']:8.1f} {r[c]['ratio']:6.3f}x"


TABLE = Table(Column("product", 17, "shape", left=True), Column("M", 5, "M"), Column("K", 5, "K"), Column("N", 5, "N"),
              *(Column(f"{c}: ours / torch us, ratio", 26, cells(c)) for c in CONDITIONS))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both contenders in turn (default 2)")
    parser.add_argument("--launches", type=int, default=40, help="timed launches a round (default 40)")
    out_option(parser, "bench_matmul_cold")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch")
    libs = load_libraries(["fp32", "bf16"])
    launches = Launches(libs, args.launches)
    gen = torch.Generator(device="cuda").manual_seed(0)
    todo = [(*s, "bfloat16") for s in shapes()] + [(*s, "float32") for s in weight_gradient_shapes()]
    print(f"single launches on {torch.cuda.get_device_name()}, {args.rounds} x {args.launches} each")
    TABLE.header()
    results = []
    for name, mkn, la, lb, lo, out_dtype in todo:
        inputs, outs, torch_outs = product_buffers(mkn, la, lb, lo, gen, torch.bfloat16, 1, TORCH_OUT[out_dtype])
        fns = contenders(libs["bf16"], "bf16", inputs, outs, torch_outs, mkn, out_dtype)
        row = run_product(launches, name, mkn, fns, args.rounds)
        results.append(row)
        TABLE.row(row)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds,
            "launches": args.launches, "flush_bytes": FLUSH_BYTES, "other": f"float32 {OTHER}^3"}  # fmt: skip
    panel = Panel([r["shape"] for r in results], {c: [r[c]["ratio"] for r in results] for c in CONDITIONS},
                  ylabel="cuBLAS time / ours", rotation=45, ref=1.0, ref_label="cuBLAS",
                  title="single launches after other work")  # fmt: skip
    write_results(args.out, "bench_matmul_cold", {"meta": meta, "results": results}, [panel],
                  title=f"bf16 products as a step meets them, {meta['device']}", size=(14, 5))  # fmt: skip


if __name__ == "__main__":
    main()
