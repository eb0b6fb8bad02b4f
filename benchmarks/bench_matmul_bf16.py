"""Benchmark of the bf16 tensor-core matmul (src/matmul_bf16_kernel.cu, through its C ABI) against
torch.matmul in bf16 (cuBLAS), side by side on the same inputs in one run, both writing bf16 outputs.
Shapes as bench_matmul.py's: [4096]^3 and the GPT-2 small products for 4096 tokens (C = 768) in the
layouts autodiff gives them (X @ W, dX = dY @ W^T, dW = X^T @ dY as transposed views read in place) and
the LM head's three products with the tied embedding [50257, 768]; our logits and dY rows are padded to
a multiple of 8 elements (16 bytes, what TMA reads), torch's are contiguous.
Times: median over repetitions of CUDA-event-timed runs of 5 back-to-back calls queued behind a spin
kernel, after warm-up, rotating over several input sets where one set fits in L2 (bench_matmul.median_ms).
Errors: max|out - ref| / max|ref| against a float64 product of the same bf16 inputs.

Usage: python benchmarks/bench_matmul_bf16.py [--out DIR] [--reps N] [--quick]
Writes DIR/bench_matmul_bf16.json and DIR/bench_matmul_bf16.png (default DIR: benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_matmul import median_ms, shapes  # noqa: E402

from minitorch.cuda.layout import MtLayout  # noqa: E402
from minitorch.cuda.matmul_bf16 import OUT_DTYPES, SIGNATURES  # noqa: E402
from minitorch.cuda.runtime import library_path, load_library  # noqa: E402

VARIANTS = ["ours bf16", "torch bf16"]


def operand(shape: Tuple[int, int], layout: str, gen: torch.Generator) -> torch.Tensor:
    """bf16 N(0, 1) operand; layout "n" row-major, "t" a transposed view, "p" rows padded to a multiple
    of 8 elements, "pt" a transposed view of that."""
    stored = shape[::-1] if layout.endswith("t") else shape
    rows, cols = stored
    width = -(-cols // 8) * 8 if layout.startswith("p") else cols
    x = torch.randn(rows, width, generator=gen, device="cuda").to(torch.bfloat16)[:, :cols]
    return x.t() if layout.endswith("t") else x


def run_shape(lib: Any, name: str, mkn: Tuple[int, int, int], la: str, lb: str, lo: str, reps: int, l2_bytes: int) -> Dict[str, Any]:
    M, K, N = mkn
    gen = torch.Generator(device="cuda").manual_seed(0)
    set_bytes = 2 * (M * K + K * N + M * N)
    sets = min(8, max(1, -(-2 * l2_bytes // set_bytes)))
    inputs = [(operand((M, K), la, gen), operand((K, N), lb, gen)) for _ in range(sets)]
    outs = [operand((M, N), "p" if lo == "p" else "n", gen) for _ in range(sets)]
    torch_outs = [torch.empty(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    a0, b0 = inputs[0]
    strides = (a0.stride(0), a0.stride(1), b0.stride(0), b0.stride(1))
    ws_bytes = lib.matmul_bf16_workspace_bytes(M, N, K, 1, *strides)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    single = MtLayout()

    def ours(i: int) -> None:
        a, b = inputs[i]
        code = lib.launch_matmul_bf16(
            outs[i].data_ptr(), OUT_DTYPES["bfloat16"], outs[i].stride(0), a.data_ptr(), b.data_ptr(), M, N, K,
            *strides, single, single, None, 0, None, 0, ws.data_ptr(), ws_bytes, stream,
        )  # fmt: skip
        if code:
            raise RuntimeError(lib.minitorch_error_string(code).decode())

    def theirs(i: int) -> None:
        torch.matmul(*inputs[i], out=torch_outs[i])

    ref = a0.double() @ b0.double()
    scale = float(ref.abs().max())
    result: Dict[str, Any] = {"shape": name, "M": M, "K": K, "N": N, "A": la, "B": lb, "out": lo, "input_sets": sets}
    for variant, fn, results in (("ours bf16", ours, outs), ("torch bf16", theirs, torch_outs)):
        results[0].fill_(float("nan"))
        fn(0)
        torch.cuda.synchronize()
        err = float((results[0].double() - ref).abs().max()) / scale
        ms = median_ms(fn, sets, reps)
        result[variant] = {"ms": ms, "tflops": 2.0 * M * N * K / ms / 1e9, "rel_err": err}
    result["ours_over_torch"] = result["torch bf16"]["ms"] / result["ours bf16"]["ms"]
    return result


def plot(results: List[Dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.4
    xs = range(len(results))
    for j, v in enumerate(VARIANTS):
        ax.bar([x + (j - 0.5) * width for x in xs], [r[v]["tflops"] for r in results], width, label=v)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["shape"] for r in results], rotation=45, ha="right")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"bf16 matmul on {torch.cuda.get_device_name()}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="only the square shape and the GPT-2 fc layer")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch")
    if not library_path("matmul_bf16_kernel").exists():
        sys.exit(f"{library_path('matmul_bf16_kernel')} is missing: build it with `bash compile_cuda.sh`")
    lib = load_library("matmul_bf16_kernel", SIGNATURES)
    props = torch.cuda.get_device_properties(0)
    todo = shapes()
    if args.quick:
        todo = [s for s in todo if s[0].startswith(("square", "fc "))]
    results = []
    print(f"{'shape':<15}{'M':>6}{'K':>7}{'N':>7} " + "".join(f"{v:>22}" for v in VARIANTS) + "  ours/torch  errors")
    for name, mkn, la, lb, lo in todo:
        r = run_shape(lib, name, mkn, la, lb, lo, args.reps, props.L2_cache_size)
        results.append(r)
        cells = "".join(f"{r[v]['ms']:9.4f}ms {r[v]['tflops']:6.1f}TF/s " for v in VARIANTS)
        errors = "  ".join(f"{r[v]['rel_err']:.2e}" for v in VARIANTS)
        print(f"{name:<15}{r['M']:>6}{r['K']:>7}{r['N']:>7} {cells} {r['ours_over_torch']:7.2f}x   {errors}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps}
    (out / "bench_matmul_bf16.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    plot(results, out / "bench_matmul_bf16.png")
    print(f"wrote {out / 'bench_matmul_bf16.json'} and {out / 'bench_matmul_bf16.png'}")


if __name__ == "__main__":
    main()
