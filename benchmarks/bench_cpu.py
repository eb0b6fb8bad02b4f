"""CPU training-step benchmark: the translation program's default model on FastOps next to PyTorch CPU.

minitorch runs the program's own step (project.mt_steps.TrainStep, eager: the default DecoderLM with
n_embd 256, 8 heads, 4 layers, vocab 8000, dropout 0.1 and the fused ops' composed references,
naive loss, global-norm clipping at 1.0, AdamW with weight decay 0.01) on batches of B x T random
tokens laid out as the program's (targets = next token, loss weights on the last two thirds).
PyTorch CPU trains the same architecture (benchmarks/bench_train.py's torch_model) with the same
loss, clipping and AdamW, with as many threads as numba uses.  Each figure is the median wall time
of the timed steps after warm-up (every step reads the loss, as the program does).  The machine's
load average before and after is recorded: other processes on the cores slow every path, and
multithreaded ones (BLAS, numba's parallel kernels, torch) most.

--before FILE adds a column from a JSON this script wrote earlier (e.g. on the code before a
change) and the speedup over it.  --profile N prints cProfile's N most expensive functions of one
minitorch step (cumulative time), which is how the costs were found.

    python benchmarks/bench_cpu.py [--batch 128] [--seq-len 30] [--steps 5] [--warmup 2]
                                   [--before FILE] [--profile 0] [--out DIR]
Writes DIR/bench_cpu.json and DIR/bench_cpu.png (default DIR: benchmarks/results/bench_cpu).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
from pathlib import Path
from typing import Any, Callable, Dict, List

import numba
import numpy as np

from common import Column, Panel, Table, out_option, wall_clock, write_results
import minitorch
from bench_train import CONFIG, torch_model
from project.translation.batches import Batch
from project.translation.step import TranslationStep as TrainStep
from project.translation.model import build_model

MAX_LEN = 128  # the program's --max-len: the size of the position table
LR, WEIGHT_DECAY, GRAD_CLIP = 1e-3, 0.01, 1.0


def make_batches(n: int, batch: int, seq_len: int) -> List[Batch]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        tokens = rng.integers(3, CONFIG["n_vocab"], size=(batch, seq_len)).astype(np.float32)
        weights = np.zeros_like(tokens)
        weights[:, seq_len // 3 : seq_len - 1] = 1.0
        out.append(Batch(tokens=tokens, targets=np.roll(tokens, -1, axis=1), weights=weights))
    return out


def minitorch_step() -> Callable[[Batch], float]:
    backend = minitorch.TensorBackend(minitorch.FastOps)
    minitorch.manual_seed(0)
    config = dict(n_embd=CONFIG["n_embd"], n_head=CONFIG["n_head"], n_layers=CONFIG["n_layers"], max_len=MAX_LEN,
                  dropout=0.1, use_fused_kernel=True)  # fmt: skip
    model = build_model(config, CONFIG["n_vocab"], backend)
    optimizer = minitorch.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=GRAD_CLIP)
    train = TrainStep(model, optimizer, backend, "naive", use_graphs=False)

    def step(batch: Batch) -> float:
        before = train.loss_total()
        train(batch, LR)
        return (train.loss_total() - before) / batch.n_targets

    return step


def torch_step(torch: Any) -> Callable[[Batch], float]:
    F = torch.nn.functional
    model = torch_model(torch, MAX_LEN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def step(batch: Batch) -> float:
        tokens = torch.from_numpy(batch.tokens).long()
        targets = torch.from_numpy(batch.targets.reshape(-1)).long()
        weights = torch.from_numpy(batch.weights.reshape(-1))
        logits = model(tokens)
        loss = (F.cross_entropy(logits.view(-1, CONFIG["n_vocab"]), targets, reduction="none") * weights).sum() / weights.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        return loss.item()

    return step


def measure(step: Callable[[Batch], float], batches: List[Batch], warmup: int) -> Dict[str, Any]:
    each = iter(batches)
    clock = wall_clock(lambda: step(next(each)), len(batches) - warmup, warmup)
    return dict(step_s=clock.median, times_s=clock.seconds, losses=clock.results)


def profile(step: Callable[[Batch], float], batch: Batch, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    step(batch)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return text.getvalue()


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


TABLE = Table(  # rows: a path's results and its name under "path"
    Column("path", 20, "path", left=True),
    Column("ms/step", 10, lambda r: 1e3 * r["step_s"], ".0f"),
    Column("tokens/s", 10, "tokens_per_s", ".0f"),
    Column("loss first->last", 16, lambda r: f"{r['losses'][0]:.3f}->{r['losses'][-1]:.3f}", left=True),
)


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--batch", type=int, default=128, help="sequences per step (the program's --batch-size)")
    parser.add_argument("--seq-len", type=int, default=30, help="tokens per sequence (Multi30k pairs: ~30-40)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per path (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (numba compiles on the first)")
    parser.add_argument("--before", default=None, help="a bench_cpu.json of an earlier run to compare with")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions of one step")
    parser.add_argument("--skip-torch", action="store_true", help="time minitorch only")
    out_option(parser, "bench_cpu")
    args = parser.parse_args(argv)

    batches = make_batches(args.warmup + args.steps, args.batch, args.seq_len)
    tokens = args.batch * args.seq_len
    results: Dict[str, Any] = dict(
        machine=platform.processor() or platform.machine(), numba_threads=numba.get_num_threads(),
        batch=args.batch, seq_len=args.seq_len, steps=args.steps, config=CONFIG, paths={},
        load_average_before=os.getloadavg()[0],
    )  # fmt: skip
    step = minitorch_step()
    results["paths"]["minitorch FastOps"] = measure(step, batches, args.warmup)
    if args.profile:
        print(profile(step, batches[0], args.profile))
    if not args.skip_torch:
        import torch

        torch.set_num_threads(numba.get_num_threads())
        results["torch"] = torch.__version__
        results["paths"]["torch CPU"] = measure(torch_step(torch), batches, args.warmup)
    for r in results["paths"].values():
        r["tokens_per_s"] = tokens / r["step_s"]
    results["load_average_after"] = os.getloadavg()[0]

    ours = results["paths"]["minitorch FastOps"]["step_s"]
    before = None
    if args.before:
        before = json.loads(Path(args.before).read_text())["paths"]["minitorch FastOps"]["step_s"]
        results["before_step_s"] = before
        results["speedup_over_before"] = before / ours
    if "torch CPU" in results["paths"]:
        results["minitorch_over_torch"] = ours / results["paths"]["torch CPU"]["step_s"]

    print(f"CPU ({results['numba_threads']} threads)  batch {args.batch} x T {args.seq_len}, n_embd {CONFIG['n_embd']}, "
          f"{CONFIG['n_layers']} layers, vocab {CONFIG['n_vocab']}; median of {args.steps} steps after {args.warmup} warm-up; "
          f"load average {results['load_average_before']:.1f} -> {results['load_average_after']:.1f}")
    TABLE.header()
    if before is not None:
        TABLE.row({"path": "minitorch (before)", "step_s": before, "tokens_per_s": tokens / before}, first=3)
    for name, r in results["paths"].items():
        TABLE.row({"path": name, **r})
    if before is not None:
        print(f"speedup over before: {results['speedup_over_before']:.1f}x")
    if "minitorch_over_torch" in results:
        print(f"minitorch / torch CPU step time: {results['minitorch_over_torch']:.2f}x")

    write_results(args.out, "bench_cpu", results, panels(results), size=(7, 4))
    return results


def panels(results: Dict[str, Any]) -> List[Panel]:
    """Median ms per step of each path (and of the earlier run given with --before), log scale."""
    names, ms = [], []
    if "before_step_s" in results:
        names.append("minitorch (before)")
        ms.append(1e3 * results["before_step_s"])
    for name, r in results["paths"].items():
        names.append(name)
        ms.append(1e3 * r["step_s"])
    return [Panel(names, {"ms": ms}, log=True, notes=[f"{v:.0f}" for v in ms],
                  colors=["tab:gray", "tab:blue", "tab:orange"][-len(names):], ylabel="ms per training step (median)",
                  title=f"DecoderLM training step on the CPU, batch {results['batch']} x {results['seq_len']}")]


if __name__ == "__main__":
    main()
