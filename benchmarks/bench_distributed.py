"""Data-parallel training speed: a GPT-2 124M-shaped DecoderLM step on one GPU and on two.

Launched with `torchrun --nproc_per_node 2` (NCCL; set NCCL_NVLS_ENABLE=0 where the machine asks).
Every rank builds the model (n_embd 768, 12 heads, 12 layers, vocab 50304, T 1024, B 4 per GPU,
fused LayerNorm, fused attention, fused linear cross-entropy, AdamW with global-norm clipping) and
times training steps (forward, backward, gradient synchronization, AdamW; a device sync after
each step; median after warm-up) in these modes:

  1 GPU         rank 0 alone, no communication (rank 1 waits): the baseline
  2 GPUs local  both ranks step at once with no communication: the compute floor of a 2-GPU step
  2 GPUs phase  DistributedDataParallel(overlap=False): backward, then sync_gradients()
  2 GPUs overlap DistributedDataParallel(overlap=True): bucket all-reduces during backward

plus, on their own: the all-reduce of every bucket (comm), one sync_gradients() (the bucket copies
and the all-reduces), per-tensor in-place all-reduces of the gradients (no copy, one collective
each), and backward alone.  Reported: tokens/s (global batch: B x T x GPUs per step), the 2-GPU /
1-GPU ratio, the exposed communication of each mode (its step minus the local step) and the share
of communication the overlap hides, 1 - exposed(overlap) / exposed(phase).

Usage: torchrun --nproc_per_node 2 benchmarks/bench_distributed.py [--steps N] [--out DIR]
Writes DIR/bench_distributed.json and DIR/bench_distributed.png (default DIR:
benchmarks/results/bench_distributed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

from common import Column, Panel, Table, out_option, wall_clock, write_results
import minitorch
from minitorch import distributed

GPT2 = dict(n_vocab=50304, n_embd=768, n_head=12, n_layers=12, seq=1024, batch=4)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="timed steps per mode (after 3 warm-up steps)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    out_option(p, "bench_distributed")
    return p


class Trainer:
    """One rank's model, optimizer and fixed random batch."""

    def __init__(self, rank: int):
        self.backend = minitorch.TensorBackend(minitorch.CudaKernelOps)
        minitorch.manual_seed(0)
        c = GPT2
        self.model = minitorch.DecoderLM(
            c["n_vocab"], c["n_embd"], c["n_head"], c["seq"], n_layers=c["n_layers"], p_dropout=0.0,
            backend=self.backend, use_fused_kernel=True, attention="fused",
        )  # fmt: skip
        self.optimizer = minitorch.AdamW(self.model.parameters(), lr=6e-4, weight_decay=0.1, max_grad_norm=1.0)
        rng = np.random.default_rng(rank)
        B, T = c["batch"], c["seq"]
        self.tokens = minitorch.tensor_from_numpy(rng.integers(0, c["n_vocab"], (B, T)).astype(np.float32), backend=self.backend)
        self.targets = minitorch.tensor_from_numpy(rng.integers(0, c["n_vocab"], B * T).astype(np.float32), backend=self.backend)
        self.weights = minitorch.ones((B * T,), backend=self.backend)

    def loss(self) -> minitorch.Tensor:
        hidden = self.model.hidden_states(self.tokens)
        B, T, C = hidden.shape
        head = self.model.lm_head
        bias = None if head.bias is None else head.bias.value
        return minitorch.fused_linear_cross_entropy(hidden.view(B * T, C), head.weight.value.T, self.targets, self.weights, bias=bias)

    def step(self, sync: Callable[[], None] = lambda: None) -> None:
        loss = self.loss()
        self.optimizer.zero_grad()
        loss.backward()
        sync()
        self.optimizer.step()


def timed(fn: Callable[[], Any], steps: int, warmup: int = 3) -> float:
    """Median seconds of fn() with a device sync around each call."""
    import torch

    return wall_clock(fn, steps, warmup, sync=torch.cuda.synchronize).median


def measure(trainer: Trainer, info: distributed.ProcessInfo, args: argparse.Namespace) -> Dict[str, float]:
    import torch
    import torch.distributed as dist

    out: Dict[str, float] = {}
    distributed.barrier()
    if info.rank == 0:
        out["1 GPU"] = timed(trainer.step, args.steps)
    distributed.barrier()
    out["2 GPUs local"] = timed(trainer.step, args.steps)

    def backward_only() -> None:
        loss = trainer.loss()
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        backward_times.append(time.perf_counter() - start)
        trainer.optimizer.zero_grad()

    backward_times: List[float] = []
    timed(backward_only, args.steps)
    out["backward"] = statistics.median(backward_times[3:])

    ddp = distributed.DistributedDataParallel(trainer.model, bucket_cap_mb=args.bucket_cap_mb, overlap=False)
    distributed.barrier()
    out["2 GPUs phase"] = timed(lambda: trainer.step(ddp.sync_gradients), args.steps)
    out["sync_gradients alone"] = timed(ddp.sync_gradients, args.steps)
    buckets = [torch.empty(n, device="cuda") for n in ddp.bucket_sizes]
    out["all-reduce of the buckets"] = timed(lambda: [dist.all_reduce(b) for b in buckets], args.steps)
    grads = [p.value.grad.to_torch() for p in trainer.model.parameters()]
    out["per-tensor all-reduce, no copy"] = timed(lambda: [dist.all_reduce(g) for g in grads], args.steps)
    out["buckets"] = float(len(buckets))
    out["parameters"] = float(sum(p.value.numel() for p in trainer.model.parameters()))
    del buckets, grads
    ddp = distributed.DistributedDataParallel(trainer.model, bucket_cap_mb=args.bucket_cap_mb, overlap=True)
    distributed.barrier()
    out["2 GPUs overlap"] = timed(lambda: trainer.step(ddp.sync_gradients), args.steps)
    ddp.close()
    return out


def report(t: Dict[str, float], device: str, out_dir: Path) -> Dict[str, Any]:
    tokens = GPT2["batch"] * GPT2["seq"]
    rates = {
        "1 GPU": tokens / t["1 GPU"],
        "2 GPUs local": 2 * tokens / t["2 GPUs local"],
        "2 GPUs phase": 2 * tokens / t["2 GPUs phase"],
        "2 GPUs overlap": 2 * tokens / t["2 GPUs overlap"],
    }
    exposed_phase = t["2 GPUs phase"] - t["2 GPUs local"]
    exposed_overlap = t["2 GPUs overlap"] - t["2 GPUs local"]
    result = {
        "device": device,
        "config": GPT2,
        "seconds": t,
        "tokens_per_s": rates,
        "speedup_2_vs_1": {k: v / rates["1 GPU"] for k, v in rates.items() if k != "1 GPU"},
        "exposed_comm_s": {"phase": exposed_phase, "overlap": exposed_overlap},
        "hidden_share_of_comm": 1.0 - exposed_overlap / exposed_phase if exposed_phase > 0 else None,
        "comm_share_of_backward": t["all-reduce of the buckets"] / t["backward"],
    }
    print(f"GPT-2 124M shape, B {GPT2['batch']} x T {GPT2['seq']} per GPU, {int(t['parameters']):,} parameters, "
          f"{int(t['buckets'])} buckets, {device}")  # fmt: skip
    modes = Table(Column("mode", 17, "mode", left=True), Column("step ms", 10, "ms", ".1f"),
                  Column("tokens/s", 11, "rate", ",.0f"), Column("vs 1 GPU", 9, "vs", ".2f"))  # fmt: skip
    modes.header()
    for mode, rate in rates.items():
        modes.row({"mode": mode, "ms": 1e3 * t[mode], "rate": rate, "vs": rate / rates["1 GPU"]})
    parts = Table(Column("part", 33, "part", left=True), Column("ms", 8, "ms", ".2f", " ms"))
    for name in ("backward", "all-reduce of the buckets", "sync_gradients alone", "per-tensor all-reduce, no copy"):
        parts.row({"part": name, "ms": 1e3 * t[name]})
    hidden = result["hidden_share_of_comm"]
    print(f"exposed communication: phase {1e3 * exposed_phase:.2f} ms, overlap {1e3 * exposed_overlap:.2f} ms; "
          f"hidden share {'n/a' if hidden is None else f'{hidden:.0%}'}; all-reduce / backward "
          f"{result['comm_share_of_backward']:.1%}")  # fmt: skip
    write_results(out_dir, "bench_distributed", result, panels(rates), size=(7, 3.5))
    return result


def panels(rates: Dict[str, float]) -> List[Panel]:
    """Tokens/s of each mode, labelled with its ratio to one GPU."""
    names = list(rates)
    return [Panel(names, {"tokens/s": [rates[n] for n in names]}, colors=["gray", "silver", "tab:orange", "tab:blue"],
                  notes=[f"{rates[n] / rates['1 GPU']:.2f}x" for n in names], ylabel="tokens/s",
                  title="GPT-2 124M step, data parallel (minitorch + NCCL)")]


def main() -> None:
    args = build_parser().parse_args()
    info = distributed.init_from_torchrun("cuda")
    if info.world_size != 2:
        raise SystemExit(f"run with torchrun --nproc_per_node 2 (got {info.world_size} process(es))")
    import torch

    trainer = Trainer(info.rank)
    t = measure(trainer, info, args)
    if info.is_main:
        report(t, torch.cuda.get_device_name(), args.out)
    distributed.destroy_process_group()


if __name__ == "__main__":
    main()
