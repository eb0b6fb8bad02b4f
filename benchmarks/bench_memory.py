"""Memory-lean training benchmark (GPU): peak memory and time, side by side in one run.

  loss     hidden [16384, 768] -> logits over a 50257-word vocabulary -> weighted cross-entropy,
           forward + backward:
             minitorch fused    minitorch.fused_linear_cross_entropy (chunks of logits, fused
                                classifier kernel, gradients in the forward pass), several chunk sizes;
             minitorch unfused  hidden @ W (our matmul) + nn.cross_entropy (composed ops), what
                                Linear + cross_entropy run;
             torch unfused      hidden @ W + F.cross_entropy (fp32, TF32 off), for scale.
  train    one DecoderLM training step (forward, backward, AdamW, loss read back) at the translation
           program's default configuration and at a GPT-2-small-like one (12 layers, 768 wide,
           12 heads, T = 256, vocab 50257): plain (logits + cross_entropy) against the fused loss,
           gradient checkpointing, both, and both with fused attention (DecoderLM(attention="fused"),
           minitorch.fused_attention). All variants use the fused softmax / LayerNorm kernels and the
           same random batches and seeds.
  adamw    fused AdamW on 64M parameters: 28 bytes per parameter / kernel time, against a
           device-to-device copy measured in the same run; also through minitorch.AdamW, the
           composed (unfused) minitorch update, and torch.optim.AdamW (fused and foreach).

Peak memory is what tensors held (minitorch.cuda_memory_stats, i.e. torch's allocator), for the
whole process ("peak") and above what was allocated before the measured call ("working": the
call's own activations, gradients and scratch).  Times are medians of synchronized wall-clock
runs after warm-up (whole steps), or of CUDA-event-timed batches of calls (AdamW, with
minitorch.cuda.timer.gpu_ms).

Usage: python benchmarks/bench_memory.py [--out DIR] [--quick]
Writes DIR/bench_memory.json and DIR/bench_memory.png (default DIR: benchmarks/results/bench_memory).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from common import Column, Panel, Table, copy_gbps, out_option, wall_clock, write_results
import minitorch
from minitorch import AdamW, DecoderLM, fused_linear_cross_entropy, nn
from minitorch.cuda.libraries import kernel_library
from minitorch.cuda.timer import gpu_ms
from minitorch.fused.linear_cross_entropy import default_chunk_size

LOSS_SHAPE = dict(tokens=16384, hidden=768, vocab=50257)
LOSS_CHUNKS = [512, None, 4096]  # None: fused_loss.default_chunk_size
TRAIN_CONFIGS = {
    "mt default": dict(n_vocab=8000, n_embd=256, n_head=8, n_layers=4, seq_len=128, batch=128),
    "12x768, T=256": dict(n_vocab=50257, n_embd=768, n_head=12, n_layers=12, seq_len=256, batch=16),
}
ADAMW_PARAMS = 64 << 20
QUICK = dict(
    loss=dict(tokens=2048, hidden=256, vocab=8000),
    train={"mt default": dict(n_vocab=1000, n_embd=64, n_head=4, n_layers=2, seq_len=32, batch=8)},
    adamw=4 << 20,
)
TARGETS = {"loss_peak_fraction": 0.10, "loss_speed_ratio": 0.8, "checkpoint_overhead": 0.40, "adamw_copy_fraction": 0.80}


# ---- measuring ----------------------------------------------------------------------------------------
def measure(torch: Any, fn: Callable[[], Any], repeats: int, warmup: int = 1) -> Dict[str, Any]:
    """Median wall time (synchronized) of fn() and the memory of one run: peak of the process and
    peak above what was held before the run.  An out-of-memory error is reported, not raised."""
    try:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        gc.collect()
        base = minitorch.cuda_memory_stats(reset=True)["current"]
        fn()
        torch.cuda.synchronize()
        peak = minitorch.cuda_memory_stats()["peak"]
        seconds = wall_clock(fn, repeats, sync=torch.cuda.synchronize).median
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {"ms": None, "peak_bytes": None, "working_bytes": None, "error": f"out of memory: {str(e).splitlines()[0]}"}
    return {"ms": 1e3 * seconds, "peak_bytes": peak, "working_bytes": peak - base}


def gib(key: str) -> Callable[[Dict[str, Any]], Optional[float]]:
    """A row's bytes under `key` in GiB (None where the row ran out of memory)."""
    return lambda r: None if r[key] is None else r[key] / 2**30


# ---- 1. the loss ----------------------------------------------------------------------------------------
def loss_bench(torch: Any, shape: Dict[str, int], repeats: int) -> List[Dict[str, Any]]:
    N, C, V = shape["tokens"], shape["hidden"], shape["vocab"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(N, C, device="cuda", generator=gen)
    weight = torch.randn(C, V, device="cuda", generator=gen) / math.sqrt(C)
    targets = torch.randint(0, V, (N,), device="cuda", generator=gen)
    weights = (torch.rand(N, device="cuda", generator=gen) > 0.1).float()  # ~10% of tokens ignored
    targets_f = targets.float()
    mt = {name: minitorch.from_torch(t) for name, t in
          (("hidden", hidden), ("weight", weight), ("targets", targets_f), ("weights", weights))}

    def leaves():
        return (minitorch.from_torch(hidden).requires_grad_(True), minitorch.from_torch(weight).requires_grad_(True))

    def fused(chunk: Optional[int]) -> Callable[[], float]:
        def run() -> float:
            h, w = leaves()
            loss = fused_linear_cross_entropy(h, w, mt["targets"], mt["weights"], chunk_size=chunk)
            loss.backward()
            return loss.item()

        return run

    def minitorch_unfused() -> float:
        h, w = leaves()
        loss = nn.cross_entropy(h @ w, mt["targets"], mt["weights"])
        loss.backward()
        return loss.item()

    def torch_unfused() -> float:
        h = hidden.detach().requires_grad_(True)
        w = weight.detach().requires_grad_(True)
        ce = torch.nn.functional.cross_entropy(h @ w, targets, reduction="none")
        loss = (ce * weights).sum() / weights.sum()
        loss.backward()
        return loss.item()

    reference = torch_unfused()
    paths: List[tuple] = [
        (f"minitorch fused, chunk {c or default_chunk_size(N, V)}", fused(c)) for c in LOSS_CHUNKS
    ]
    paths += [("minitorch unfused", minitorch_unfused), ("torch unfused", torch_unfused)]
    rows = []
    for name, fn in paths:
        row = {"path": name, **measure(torch, fn, repeats)}
        if row["ms"] is not None:
            value = fn()
            row["loss"] = value
            row["loss_rel_err_vs_torch"] = abs(value - reference) / abs(reference)
        rows.append(row)
        gc.collect()
    return rows


# ---- 2. training steps ------------------------------------------------------------------------------------
TRAIN_VARIANTS = [
    {"name": "plain", "loss": "naive", "checkpoint": False, "attention": "naive"},
    {"name": "fused loss", "loss": "fused", "checkpoint": False, "attention": "naive"},
    {"name": "checkpoint", "loss": "naive", "checkpoint": True, "attention": "naive"},
    {"name": "checkpoint + fused loss", "loss": "fused", "checkpoint": True, "attention": "naive"},
    {"name": "fused attention", "loss": "naive", "checkpoint": False, "attention": "fused"},
    {"name": "checkpoint + fused loss + fused attention", "loss": "fused", "checkpoint": True, "attention": "fused"},
]


def train_bench(torch: Any, configs: Dict[str, Dict[str, int]], repeats: int) -> List[Dict[str, Any]]:
    backend = minitorch.TensorBackend(minitorch.CudaKernelOps)
    rows = []
    for config_name, cfg in configs.items():
        B, T, V = cfg["batch"], cfg["seq_len"], cfg["n_vocab"]
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, V, (B, T + 1))
        counted = (np.arange(T)[None, :] >= T // 3).astype(np.float32).repeat(B, 0)  # the "English" part
        batch = (
            minitorch.tensor_from_numpy(tokens[:, :-1], backend=backend),
            minitorch.tensor_from_numpy(tokens[:, 1:].reshape(-1), backend=backend),
            minitorch.tensor_from_numpy(counted.reshape(-1), backend=backend),
        )
        for variant in TRAIN_VARIANTS:
            minitorch.manual_seed(0)
            model = DecoderLM(V, cfg["n_embd"], cfg["n_head"], T, n_layers=cfg["n_layers"], p_dropout=0.1,
                              backend=backend, use_fused_kernel=True, recompute_layers=variant["checkpoint"],
                              attention=variant["attention"])
            optimizer = AdamW(model.parameters(), lr=1e-4)

            def step(model=model, optimizer=optimizer, loss_kind=variant["loss"]) -> float:
                idx, targets, weights = batch
                optimizer.zero_grad()
                if loss_kind == "fused":
                    hidden = model.hidden_states(idx).view(B * T, model.n_embd)
                    head = model.lm_head
                    loss = fused_linear_cross_entropy(hidden, head.weight.value.T, targets, weights, bias=head.bias.value)
                else:
                    loss = nn.cross_entropy(model(idx).view(B * T, V), targets, weights)
                loss.backward()
                optimizer.step()
                return loss.item()

            result = measure(torch, step, repeats, warmup=2)
            rows.append({"config": config_name, **cfg, "tokens": B * T, "variant": variant["name"], **result,
                         "tokens_per_s": None if result["ms"] is None else B * T / (result["ms"] * 1e-3)})
            del model, optimizer, step
            gc.collect()
    return rows


# ---- 3. fused AdamW ------------------------------------------------------------------------------------------
class ComposedAdamW(minitorch.CudaKernelOps):
    """The CUDA backend without the AdamW kernel hook: minitorch.adamw_step runs its composed update."""

    adamw_step = None


def adamw_bench(torch: Any, n: int) -> Dict[str, Any]:
    lib = kernel_library("optimizer_kernel")
    stream = torch.cuda.current_stream().cuda_stream
    gen = torch.Generator(device="cuda").manual_seed(0)
    p, g, m = (torch.randn(n, device="cuda", generator=gen) for _ in range(3))
    v = torch.rand(n, device="cuda", generator=gen)
    hyper = (1e-4, 0.9, 0.999, 1e-8, 0.01)
    step = [0]

    def kernel() -> None:
        step[0] += 1
        lib.launch_adamw(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), n, *hyper, step[0], stream)

    copy_gbs = copy_gbps(4 * n)  # as many floats as the update touches
    kernel_ms = gpu_ms(kernel, inner=20)

    param = minitorch.Parameter(minitorch.from_torch(p))
    param.value.grad = minitorch.from_torch(g)
    opt = AdamW([param], lr=hyper[0], weight_decay=hyper[4])
    api_ms = gpu_ms(opt.step, inner=20)
    composed = minitorch.TensorBackend(ComposedAdamW)
    tp, tg, tm, tv = (minitorch.from_torch(t, backend=composed) for t in (p, g, m, v))
    composed_ms = gpu_ms(lambda: minitorch.adamw_step(tp, tg, tm, tv, *hyper, 5), reps=3, inner=3)

    results = {"params": n, "bytes_per_param": 28, "copy_gbs": copy_gbs, "kernel_ms": kernel_ms,
               "kernel_gbs": 28 * n / (kernel_ms * 1e-3) / 1e9, "minitorch_adamw_ms": api_ms,
               "minitorch_composed_ms": composed_ms}
    results["kernel_copy_fraction"] = results["kernel_gbs"] / copy_gbs
    tparam = torch.nn.Parameter(p.clone())
    tparam.grad = g.clone()
    for impl in ("fused", "foreach"):
        try:
            topt = torch.optim.AdamW([tparam], lr=hyper[0], weight_decay=hyper[4], **{impl: True})
            results[f"torch_{impl}_ms"] = gpu_ms(topt.step, inner=20)
        except (RuntimeError, TypeError) as e:
            results[f"torch_{impl}_ms"] = None
            results[f"torch_{impl}_error"] = str(e).splitlines()[0]
    return results


# ---- report ---------------------------------------------------------------------------------------------------
LOSS_TABLE = Table(
    Column("path", 34, "path", left=True),
    Column("ms", 9, "ms", ".1f"),
    Column("peak GiB", 9, gib("peak_bytes"), ".2f"),
    Column("working GiB", 12, gib("working_bytes"), ".2f"),
    Column("peak/base", 10, "peak_fraction_of_baseline", ".3f"),
    Column("speed vs base", 14, "speed_vs_baseline", ".2f", "x"),
    Column("loss err", 9, "loss_rel_err_vs_torch", ".1e"),
)
TRAIN_TABLE = Table(
    Column("config", 15, "config", left=True),
    Column("variant", 42, "variant", left=True),
    Column("ms", 9, "ms", ".1f"),
    Column("tokens/s", 10, "tokens_per_s", ",.0f"),
    Column("peak GiB", 9, gib("peak_bytes"), ".2f"),
    Column("working GiB", 12, gib("working_bytes"), ".2f"),
    Column("time vs plain", 14, "time_vs_plain", ".2f", "x"),
)


def print_tables(loss_shape: Dict[str, int], loss_rows: List[Dict[str, Any]], train_rows: List[Dict[str, Any]],
                 adamw: Dict[str, Any]) -> Dict[str, Any]:
    verdict: Dict[str, Any] = {}
    # The baseline is minitorch's own unfused path; torch's stands in if ours ran out of memory.
    unfused = next(r for r in loss_rows if r["path"] == "minitorch unfused")
    if unfused["ms"] is None:
        unfused = next(r for r in loss_rows if r["path"] == "torch unfused")
    verdict["loss_baseline"] = unfused["path"]
    print(f"\n== loss: {loss_shape['tokens']} tokens x hidden {loss_shape['hidden']} x vocab {loss_shape['vocab']}, "
          f"forward + backward; baseline: {unfused['path']} ==")
    LOSS_TABLE.header()
    for r in loss_rows:
        frac = r["peak_bytes"] / unfused["peak_bytes"] if r["peak_bytes"] and unfused["peak_bytes"] else None
        speed = unfused["ms"] / r["ms"] if r["ms"] and unfused["ms"] else None
        r["peak_fraction_of_baseline"], r["speed_vs_baseline"] = frac, speed
        LOSS_TABLE.row(r, note=r.get("error", ""))
    fused_rows = [r for r in loss_rows if r["path"].startswith("minitorch fused") and r["ms"] is not None]
    if fused_rows and unfused["ms"] is not None:
        best = min(fused_rows, key=lambda r: r["ms"])
        verdict["loss"] = {"path": best["path"], "peak_fraction": best["peak_fraction_of_baseline"],
                           "speed_ratio": best["speed_vs_baseline"]}
        frac, speed = best["peak_fraction_of_baseline"], best["speed_vs_baseline"]
        verdict["loss"]["meets_target"] = (frac is not None and speed is not None
                                           and frac <= TARGETS["loss_peak_fraction"] and speed >= TARGETS["loss_speed_ratio"])
    print("\n== DecoderLM training step (AdamW, fused softmax/LayerNorm kernels) ==")
    TRAIN_TABLE.header()
    for r in train_rows:
        plain = next(p for p in train_rows if p["config"] == r["config"] and p["variant"] == "plain")
        r["time_vs_plain"] = r["ms"] / plain["ms"] if r["ms"] and plain["ms"] else None
        TRAIN_TABLE.row(r, note=r.get("error", ""))
    overheads = {r["config"]: r["time_vs_plain"] - 1.0 for r in train_rows if r["variant"] == "checkpoint" and r["time_vs_plain"]}
    verdict["checkpoint_overhead"] = overheads
    print("\n== fused AdamW ==")
    n = adamw["params"]
    print(f"{n / 2**20:.0f}M parameters, 28 bytes each: kernel {adamw['kernel_ms']:.3f} ms = {adamw['kernel_gbs']:.0f} GB/s, "
          f"{100 * adamw['kernel_copy_fraction']:.0f}% of the device-to-device copy ({adamw['copy_gbs']:.0f} GB/s)")
    for key, label in (("minitorch_adamw_ms", "minitorch.AdamW.step"), ("minitorch_composed_ms", "minitorch composed (unfused)"),
                       ("torch_fused_ms", "torch AdamW fused=True"), ("torch_foreach_ms", "torch AdamW foreach=True")):
        ms = adamw.get(key)
        print(f"  {label:30} {'-' if ms is None else f'{ms:.3f} ms'}")
    verdict["adamw_copy_fraction"] = adamw["kernel_copy_fraction"]
    return verdict


def panels(loss_rows: List[Dict[str, Any]], train_rows: List[Dict[str, Any]], adamw: Dict[str, Any]) -> List[Panel]:
    """Peak memory of the loss paths (with their times), of the training variants per configuration,
    and the AdamW bandwidths against the copy's."""
    ok = [r for r in loss_rows if r["ms"] is not None]
    configs = list(dict.fromkeys(r["config"] for r in train_rows))
    peak_gib = {(r["config"], r["variant"]): gib("peak_bytes")(r) for r in train_rows}
    variants = list(dict.fromkeys(r["variant"] for r in train_rows))
    n = adamw["params"]
    labels, ms = ["fused kernel", "minitorch.AdamW"], [adamw["kernel_ms"], adamw["minitorch_adamw_ms"]]
    for key, label in (("torch_fused_ms", "torch fused"), ("torch_foreach_ms", "torch foreach"),
                       ("minitorch_composed_ms", "minitorch composed")):
        if adamw.get(key):
            labels.append(label)
            ms.append(adamw[key])
    gbs = [adamw["copy_gbs"]] + [28 * n / (t * 1e-3) / 1e9 for t in ms]
    return [
        Panel([r["path"] for r in ok], {"peak GiB": [r["peak_bytes"] / 2**30 for r in ok]}, kind="barh",
              notes=[f"{r['ms']:.0f} ms" for r in ok], colors=["tab:blue"], xlabel="peak GiB (forward + backward)",
              title="LM head + cross-entropy"),
        Panel(configs, {v: [peak_gib.get((c, v)) for c in configs] for v in variants},
              ylabel="peak GiB of a training step", title="DecoderLM training step"),
        Panel(["copy (d2d)"] + labels, {"GB/s": gbs}, colors=["gray"] + ["tab:green"] * len(labels), rotation=20,
              ref=TARGETS["adamw_copy_fraction"] * adamw["copy_gbs"], ref_label="80% of copy",
              ylabel="GB/s (28 bytes per parameter; copy: read + write)", title=f"AdamW, {n / 2**20:.0f}M parameters"),
    ]  # fmt: skip


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out_option(parser, "bench_memory")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not the issue's figures)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement")
    args = parser.parse_args(argv)
    import torch

    reason = minitorch.cuda_kernel_ops.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"bench_memory needs the CUDA backend: {reason}")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    loss_shape = QUICK["loss"] if args.quick else LOSS_SHAPE
    configs = QUICK["train"] if args.quick else TRAIN_CONFIGS
    n_adamw = QUICK["adamw"] if args.quick else ADAMW_PARAMS

    loss_rows = loss_bench(torch, loss_shape, args.repeats)
    train_rows = train_bench(torch, configs, args.repeats)
    adamw = adamw_bench(torch, n_adamw)
    verdict = print_tables(loss_shape, loss_rows, train_rows, adamw)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "quick": args.quick,
        "loss_shape": loss_shape,
        "loss": loss_rows,
        "train": train_rows,
        "adamw": adamw,
        "targets": TARGETS,
        "verdict": verdict,
    }
    print(f"\nverdict: {json.dumps(verdict)}")
    write_results(args.out, "bench_memory", report, panels(loss_rows, train_rows, adamw), size=(19, 5.5))
    return report


if __name__ == "__main__":
    main()
