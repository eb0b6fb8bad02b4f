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
Writes DIR/bench_distributed.json and DIR/bench_distributed.png (default DIR: benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import minitorch  # noqa: E402
from minitorch import distributed  # noqa: E402

GPT2 = dict(n_vocab=50304, n_embd=768, n_head=12, n_layers=12, seq=1024, batch=4)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="timed steps per mode (after 3 warm-up steps)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
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
        return minitorch.fused_linear_cross_entropy(hidden.view(B * T, C), head.weights.value, self.targets, self.weights, bias=bias)

    def step(self, sync: Callable[[], None] = lambda: None) -> None:
        loss = self.loss()
        self.optimizer.zero_grad()
        loss.backward()
        sync()
        self.optimizer.step()


def timed(fn: Callable[[], Any], steps: int, warmup: int = 3) -> float:
    """Median seconds of fn() with a device sync around each call."""
    import torch

    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    out["parameters"] = float(sum(p.value.size for p in trainer.model.parameters()))
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
    print(f"{'mode':<18}{'step ms':>10}{'tokens/s':>12}{'vs 1 GPU':>10}")
    for mode, rate in rates.items():
        print(f"{mode:<18}{1e3 * t[mode]:>10.1f}{rate:>12,.0f}{rate / rates['1 GPU']:>10.2f}")
    for name in ("backward", "all-reduce of the buckets", "sync_gradients alone", "per-tensor all-reduce, no copy"):
        print(f"{name:<34}{1e3 * t[name]:>8.2f} ms")
    hidden = result["hidden_share_of_comm"]
    print(f"exposed communication: phase {1e3 * exposed_phase:.2f} ms, overlap {1e3 * exposed_overlap:.2f} ms; "
          f"hidden share {'n/a' if hidden is None else f'{hidden:.0%}'}; all-reduce / backward "
          f"{result['comm_share_of_backward']:.1%}")  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_distributed.json").write_text(json.dumps(result, indent=2))
    plot(rates, out_dir / "bench_distributed.png")
    return result


def plot(rates: Dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(rates)
    ax.bar(names, [rates[n] for n in names], color=["gray", "silver", "tab:orange", "tab:blue"])
    for i, n in enumerate(names):
        ax.text(i, rates[n], f"{rates[n] / rates['1 GPU']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("tokens/s")
    ax.set_title("GPT-2 124M step, data parallel (minitorch + NCCL)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    args = build_parser().parse_args()
    info = distributed.init_from_torchrun("cuda")
    if info.world_size != 2:
        raise SystemExit(f"run with torchrun --nproc_per_node 2 (got {info.world_size} process(es))")
    import torch

    trainer = Trainer(info.rank)
    t = measure(trainer, info, args)
    if info.is_main:
        report(t, torch.cuda.get_device_name(), Path(args.out))
    distributed.destroy_process_group()


if __name__ == "__main__":
    main()
