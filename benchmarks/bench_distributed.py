"""Data-parallel training speed: the GPT-2 124M step of the GPT-2 program on N GPUs against PyTorch DDP.

Launched with `torchrun --nproc_per_node N` (NCCL; NCCL_NVLS_ENABLE=0), once per N; each launch
writes DIR/world<N>.json, and `--report` prints the launches side by side (tokens/s and the
speed-up over the same contender's 1-GPU run) and writes DIR/bench_distributed.json and .png.
Every contender trains GPT-2 124M (fresh, n_embd 768, 12 layers, vocab 50257 padded to 50304) on
B 4 x T 1024 random tokens per GPU (a global batch of 4N sequences), AdamW with global-norm
clipping at 1.0; a step's time is the median over --steps steps after --warmup, the host waiting
for each step's loss:

  minitorch            the program's step (project/gpt2/training.py GPT2Step: fused kernels, fused
                       attention and loss, one CUDA graph replay per step); with N > 1 through
                       DistributedDataParallel: buckets all-reduced while backward runs, in the graph
  minitorch ZeRO-1     the same with DistributedDataParallel(shard=True) + ShardedAdamW: buckets
                       reduce-scattered, each GPU updating its 1/N of the weights and AdamW moments,
                       weights all-gathered (its AdamW state per GPU is reported beside AdamW's)
  minitorch profiled   the DDP step run eagerly (no graph) with DistributedDataParallel(profile=True):
                       how long the all-reduces ran, how much of that came after backward had ended
                       (exposed) and the hidden share 1 - exposed / all-reduce
  torch DDP tf32/bf16  benchmarks/gpt2_torch_peer.py's TorchGPT2 (SDPA attention) under
                       torch.nn.parallel.DistributedDataParallel with fused AdamW, TF32 matmuls or
                       bf16 autocast: the peer (with N = 1 without the DDP wrapper)

--precision sets minitorch's float32 matmuls: "high" (one TF32 product, against torch's TF32) or
"highest" (3xTF32, float32 accuracy).

    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py [--steps 20] [--precision high] [--out DIR]
    python benchmarks/bench_distributed.py --report [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from common import Column, Panel, Table, out_option, write_json, write_results
import minitorch
from minitorch import distributed

B, T, LR = 4, 1024, 3e-4
CONTENDERS = ("minitorch", "minitorch ZeRO-1", "torch DDP tf32", "torch DDP bf16")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="timed steps per contender")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (graph capture, NCCL set-up)")
    p.add_argument("--precision", choices=("high", "highest"), default="high", help="minitorch's float32 matmuls")
    p.add_argument("--report", action="store_true", help="print and plot the world<N>.json of --out")
    out_option(p, "bench_distributed")
    return p


def median_seconds(step: Callable[[], Any], args: argparse.Namespace) -> float:
    """Median wall time of a step (each returns after reading its loss, so the device is done)."""
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def minitorch_step(info: distributed.ProcessInfo, mode: str, args: argparse.Namespace) -> Dict[str, Any]:
    """mode "ddp", "zero" or "profiled" (see the module docstring)."""
    from project.gpt2.llmc import GPT2_124M
    from project.gpt2.model import GPT2
    from project.gpt2.training import GPT2Step

    backend = minitorch.TensorBackend(minitorch.CudaKernelOps)
    minitorch.set_float32_matmul_precision(args.precision)
    model = GPT2.fresh(GPT2_124M, seed=0, backend=backend, use_fused_kernel=True, attention="fused")
    hyper = dict(lr=LR, weight_decay=0.0, eps=1e-8, max_grad_norm=1.0)
    ddp = None
    if info.world_size > 1:
        ddp = distributed.DistributedDataParallel(model, shard=mode == "zero", profile=mode == "profiled")
        ddp.gradient_weight = 1.0
    optimizer = distributed.ShardedAdamW(ddp, **hyper) if mode == "zero" and ddp else minitorch.AdamW(model.parameters(), **hyper)
    step = GPT2Step(model, optimizer, "fused", ddp, use_graphs=mode != "profiled", weight=1.0 / info.world_size)
    rng = np.random.default_rng(info.rank)
    tokens = rng.integers(0, GPT2_124M.vocab_size, (B, T + 1))
    seconds = median_seconds(lambda: step(tokens[:, :-1], tokens[:, 1:], LR), args)
    state = optimizer.state_floats if isinstance(optimizer, distributed.ShardedAdamW) else 2 * sum(
        p.value.numel() for p in model.parameters())  # fmt: skip
    out = {"ms": 1e3 * seconds, "optimizer_state_gib": 4 * state / 2**30}
    if mode == "profiled" and ddp is not None:
        out["overlap"] = ddp.overlap_summary(skip=args.warmup)
        out["buckets"] = len(ddp.bucket_sizes)
    step.release_graphs()
    if ddp is not None:
        ddp.close()
    return out


def torch_step(info: distributed.ProcessInfo, precision: str, args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    from gpt2_torch_peer import TorchGPT2
    from project.gpt2.llmc import GPT2_124M

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    model = TorchGPT2(GPT2_124M).cuda()
    if info.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[info.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=1e-8, weight_decay=0.0, fused=True)
    rng = np.random.default_rng(info.rank)
    tokens = torch.from_numpy(rng.integers(0, GPT2_124M.vocab_size, (B, T + 1))).cuda()

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    return {"ms": 1e3 * median_seconds(step, args)}


def measure(info: distributed.ProcessInfo, args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    runs: Dict[str, Dict[str, Any]] = {}
    for name, run in (("minitorch", lambda: minitorch_step(info, "ddp", args)),
                      ("minitorch ZeRO-1", lambda: minitorch_step(info, "zero", args)),
                      ("minitorch profiled", lambda: minitorch_step(info, "profiled", args)),
                      ("torch DDP tf32", lambda: torch_step(info, "tf32", args)),
                      ("torch DDP bf16", lambda: torch_step(info, "bf16", args))):  # fmt: skip
        distributed.barrier()
        runs[name] = run()
        gc.collect()
        torch.cuda.empty_cache()
        if info.is_main:
            print(f"{name}: {runs[name]['ms']:.1f} ms/step", flush=True)
    for result in runs.values():
        result["tokens_per_s"] = info.world_size * B * T / (result["ms"] / 1e3)
    return {"world": info.world_size, "device": torch.cuda.get_device_name(), "precision": args.precision,
            "tokens_per_gpu_step": B * T, "contenders": runs}  # fmt: skip


def gpus(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}"


def report(out: Path) -> Dict[str, Any]:
    worlds = sorted((json.loads(p.read_text()) for p in out.glob("world*.json")), key=lambda w: w["world"])
    if not worlds:
        raise SystemExit(f"no world*.json in {out}: run the benchmark under torchrun first")
    sizes = [w["world"] for w in worlds]
    base = next((w for w in worlds if w["world"] == 1), None)
    print(f"GPT-2 124M, B {B} x T {T} per GPU, {worlds[-1]['device']}, minitorch matmuls {worlds[-1]['precision']}")
    table = Table(Column("contender", 20, "name", left=True),
                  *(Column(f"{gpus(n)} tok/s", 16, f"rate{n}", ",.0f") for n in sizes),
                  *(Column(f"x{n}", 6, f"speedup{n}", ".2f") for n in sizes if n > 1))  # fmt: skip
    table.header()
    series: Dict[str, List[Optional[float]]] = {}
    for name in CONTENDERS:
        row: Dict[str, Any] = {"name": name}
        for w in worlds:
            rate = w["contenders"].get(name, {}).get("tokens_per_s")
            row[f"rate{w['world']}"] = rate
            one = base and base["contenders"].get(name, {}).get("tokens_per_s")
            row[f"speedup{w['world']}"] = rate / one if rate and one else None
        table.row(row)
        series[name] = [row[f"rate{n}"] for n in sizes]
    for w in worlds:
        profiled = w["contenders"]["minitorch profiled"]
        overlap = profiled.get("overlap") or {}
        if overlap.get("comm_ms") is not None:
            print(f"{gpus(w['world'])}, eager minitorch step ({profiled['buckets']} buckets): all-reduce "
                  f"{overlap['comm_ms']:.2f} ms, exposed after backward {overlap['exposed_ms']:.2f} ms, hidden "
                  f"{overlap['hidden_share']:.0%}")  # fmt: skip
        state = {k: w["contenders"][k]["optimizer_state_gib"] for k in ("minitorch", "minitorch ZeRO-1")}
        print(f"{gpus(w['world'])}: AdamW state per GPU {state['minitorch']:.2f} GiB, ZeRO-1 {state['minitorch ZeRO-1']:.2f} GiB")
    result = {"worlds": worlds}
    write_results(out, "bench_distributed", result, [Panel([gpus(n) for n in sizes], series,
                  ylabel="tokens/s", title="GPT-2 124M training, data parallel")], size=(8, 4))  # fmt: skip
    return result


def main() -> None:
    args = build_parser().parse_args()
    if args.report:
        report(args.out)
        return
    info = distributed.init_from_torchrun("cuda")
    result = measure(info, args)
    if info.is_main:
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / f"world{info.world_size}.json", result)
        print(f"wrote {args.out / f'world{info.world_size}.json'}")
    distributed.destroy_process_group()


if __name__ == "__main__":
    main()
