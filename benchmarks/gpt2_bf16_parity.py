"""Loss parity of bf16 training: GPT-2 124M for 300 steps with minitorch's --dtype bf16 against PyTorch
autocast bf16, from the same initial weights and token stream.

Both start from one fresh GPT-2 124M checkpoint (GPT-2's initialisation, llm.c's format) and read the
same token shards in order (B 4 x T 1024 per step): minitorch through project/train_gpt2.py --backend
cuda --dtype bf16 (fused kernels, attention and loss: float32 master weights, bf16 working copies and
activations), PyTorch through benchmarks/gpt2_torch_peer.py --dtype bf16 (torch.autocast(bfloat16),
float32 master weights), both with AdamW (0.9, 0.999, eps 1e-8, --weight-decay) under the same
schedule (--lr, --warmup-steps, then a cosine decay to --final-lr-frac of it) and no clipping. The
tokens: a byte-level BPE (8192 tokens, project/gpt2_data.py) of --corpus, by default the Multi30k
English training text, so that the loss has something to learn.

Passes when the mean loss of the last --window steps is within --mean-tolerance (0.02) of PyTorch's
and no step's loss is more than --step-tolerance (0.1) apart; prints the verdict (exit status 1 when
it fails) and writes DIR/gpt2_bf16_parity.json and .png (loss curves and their difference).

Usage (on the GPU machine):
    python benchmarks/gpt2_bf16_parity.py [--steps 300] [--corpus train.en.gz] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from common import ROOT, Panel, out_option, write_results
from project.gpt2.data import DEFAULT_INPUT, prepare_shards
from project.gpt2.llmc import GPT2_124M, write_checkpoint
from project.gpt2.model import gpt2_init_params

MINITORCH_OPTIONS = ["--use-fused-kernel", "true", "--attention", "fused", "--loss", "fused", "--dtype", "bf16"]


def run(cmd: list[str], log: Path, timeout: float) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    log.write_text(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}); last output:\n{proc.stdout[-3000:]}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup-steps", type=int, default=30)
    p.add_argument("--final-lr-frac", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--corpus", type=Path, default=DEFAULT_INPUT, help="text (or .gz) to train on")
    p.add_argument("--window", type=int, default=50, help="last steps whose mean losses are compared")
    p.add_argument("--mean-tolerance", type=float, default=0.02)
    p.add_argument("--step-tolerance", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0, help="the initial weights")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds each run may take")
    out_option(p, "gpt2_bf16_parity")
    args = p.parse_args(argv)
    if not args.corpus.exists():
        p.error(f"--corpus {args.corpus} does not exist")

    import torch

    work = Path(args.work or tempfile.mkdtemp(prefix="gpt2_bf16_parity_"))
    work.mkdir(parents=True, exist_ok=True)
    init = write_checkpoint(work / "gpt2_124M.bin", GPT2_124M, gpt2_init_params(GPT2_124M, args.seed))
    data = prepare_shards(args.corpus, work / "data", vocab_size=8192, val_fraction=0.05, progress=False, overwrite=True)
    shared = ["--init-from", str(init), "--train-shards", data.train_pattern, "--batch-size", str(args.batch_size),
              "--seq-len", str(args.seq_len), "--steps", str(args.steps), "--lr", str(args.lr),
              "--warmup-steps", str(args.warmup_steps), "--final-lr-frac", str(args.final_lr_frac),
              "--weight-decay", str(args.weight_decay)]  # fmt: skip
    mini_dir = work / "minitorch"
    run([sys.executable, str(ROOT / "project" / "train_gpt2.py"), "--backend", "cuda", *shared, "--grad-clip", "0",
         "--val-every", "0", "--out-dir", str(mini_dir), *MINITORCH_OPTIONS], work / "minitorch.log", args.timeout)  # fmt: skip
    ours = [r["loss"] for r in map(json.loads, (mini_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    run([sys.executable, str(ROOT / "benchmarks" / "gpt2_torch_peer.py"), *shared, "--dtype", "bf16",
         "--out", str(work / "torch.json")], work / "torch.log", args.timeout)  # fmt: skip
    theirs = json.loads((work / "torch.json").read_text())["losses"]

    diff = np.array(ours) - np.array(theirs)
    window = slice(-args.window, None)
    mean_gap = float(np.mean(ours[window]) - np.mean(theirs[window]))
    worst = int(np.argmax(np.abs(diff)))
    passed = bool(abs(mean_gap) <= args.mean_tolerance and abs(diff[worst]) <= args.step_tolerance)
    device = torch.cuda.get_device_name()
    print(f"GPT-2 124M, B {args.batch_size} x T {args.seq_len}, {args.steps} steps of {args.corpus.name} "
          f"(BPE 8192), {device}: minitorch --dtype bf16 vs PyTorch autocast bf16")  # fmt: skip
    for step in sorted({0, 9, 49, 99, 199, args.steps - 1} & set(range(args.steps))):
        print(f"  step {step + 1:4d}: minitorch {ours[step]:.4f}  torch {theirs[step]:.4f}  diff {diff[step]:+.4f}")
    print(f"mean loss of the last {args.window} steps: minitorch {np.mean(ours[window]):.4f}, torch "
          f"{np.mean(theirs[window]):.4f}, gap {mean_gap:+.4f} (tolerance {args.mean_tolerance}); largest step "
          f"difference {diff[worst]:+.4f} at step {worst + 1} (tolerance {args.step_tolerance}): "
          f"{'PASS' if passed else 'FAIL'}")  # fmt: skip
    report = {"device": device, "torch": torch.__version__, "config": {k: str(v) for k, v in vars(args).items()},
              "minitorch": ours, "torch_losses": theirs, "mean_gap": mean_gap, "max_step_diff": float(diff[worst]),
              "worst_step": worst + 1, "passed": passed}  # fmt: skip
    steps = list(range(1, args.steps + 1))
    panels = [
        Panel(steps, {"minitorch bf16": ours, "torch autocast bf16": theirs}, kind="lines", xlabel="step",
              ylabel="train loss", title="loss per step"),
        Panel(steps, {"minitorch - torch": diff.tolist()}, kind="lines", xlabel="step", ylabel="loss difference",
              ref=0.0, title=f"difference (last-{args.window} mean {mean_gap:+.4f})"),
    ]  # fmt: skip
    write_results(args.out, "gpt2_bf16_parity", report, panels, title=f"bf16 loss parity on {device}")
    if not passed:
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
