"""How evenly a data-parallel translation step splits its work: padded tokens per process, on the CPU.

Under torchrun with N processes and --scale-batch-with-world true a step hands each process one
batch of a group of N length neighbours (Batcher.epoch_groups) and lasts as long as the slowest
process, the one with the most padded tokens (batch size x width rounded up as the CUDA step pads
it).  (By default a step is one global batch whose rows are dealt out to the processes in turn.)  For each N this prints,
over the epochs of the real training split and its tokenizer:
- longest / mean: the padded tokens of each step's largest batch over the step's mean (1.0 = even);
- cap: one process's padded tokens per epoch over the sum of the steps' largest batches, the
  speed-up over one GPU that padding alone allows if a step's time follows its largest batch.

    python benchmarks/bench_step_balance.py [--data-dir DIR] [--processes 1 2 4 8]
                                            [--bucket-batches 50 100] [--epochs 3] [--out DIR]
Writes DIR/bench_step_balance.json and .png (default DIR: benchmarks/results/bench_step_balance).
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Dict, List

import numpy as np

from common import Column, Panel, Table, out_option, write_results
from project.common.options import POSITIVE_INT as positive_int
from project.translation import Batcher, encode_pairs, load_corpus, load_or_train_tokenizer, resolve_data_dir
from project.translation.step import WIDTH_MULTIPLE


def padded_tokens(lengths: np.ndarray, batch: np.ndarray) -> int:
    width = int(lengths[batch].max())
    return len(batch) * -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def balance(sequences: List[np.ndarray], args: argparse.Namespace, processes: int, bucket_batches: int) -> Dict:
    lengths = np.array([len(s) - 1 for s in sequences])
    ratios, caps = [], []
    for epoch in range(args.epochs):
        one = Batcher(sequences, args.batch_size, seed=epoch, bucket_batches=bucket_batches)
        alone = sum(padded_tokens(lengths, group[0]) for group in one.epoch_groups(1))
        shared = Batcher(sequences, args.batch_size, seed=epoch, bucket_batches=bucket_batches)
        steps = [[padded_tokens(lengths, b) for b in group] for group in shared.epoch_groups(processes)]
        longest = sum(max(step) for step in steps)
        ratios.append(longest / sum(float(np.mean(step)) for step in steps))
        caps.append(alone / longest)
    return {"processes": processes, "bucket_batches": bucket_batches,
            "longest_over_mean": float(np.mean(ratios)), "cap": float(np.mean(caps))}


def panels(rows: List[Dict]) -> List[Panel]:
    """cap / processes over the process counts, one line per length window."""
    processes = sorted({r["processes"] for r in rows})
    share = {(r["bucket_batches"], r["processes"]): r["cap"] / r["processes"] for r in rows}
    windows = sorted({r["bucket_batches"] for r in rows})
    return [Panel(processes, {f"--bucket-batches {w}": [share.get((w, n)) for n in processes] for w in windows},
                  kind="lines", x_log_base=2, xlabel="processes", ylabel="cap / processes (1.0 = no padding loss)",
                  title="Padding-bound scaling of a translation step")]


TABLE = Table(Column("processes", 9, "processes"), Column("bucket-batches", 14, "bucket_batches"),
              Column("longest/mean", 12, "longest_over_mean", ".3f"), Column("cap", 7, "cap", ".3f"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=None, help="Multi30k folder (default: the program's)")
    p.add_argument("--batch-size", type=positive_int, default=128, help="sequences per batch (per process)")
    p.add_argument("--max-len", type=positive_int, default=128, help="longest sequence kept")
    p.add_argument("--vocab-size", type=positive_int, default=8000, help="BPE vocabulary")
    p.add_argument("--processes", type=positive_int, nargs="+", default=[1, 2, 4, 8], help="process counts")
    p.add_argument("--bucket-batches", type=positive_int, nargs="+", default=[50, 100], help="steps per length window")
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs averaged (seeds 0..N-1)")
    out_option(p, "bench_step_balance")
    args = p.parse_args()

    corpus = load_corpus(resolve_data_dir(args.data_dir))
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_or_train_tokenizer(tmp, corpus.train, args.vocab_size)
    sequences = encode_pairs(tokenizer, corpus.train, args.max_len).sequences
    rows = [balance(sequences, args, n, w) for w in args.bucket_batches for n in args.processes]
    TABLE.header()
    for r in rows:
        TABLE.row(r)
    report = {"batch_size": args.batch_size, "rows": rows}
    write_results(args.out, "bench_step_balance", report, panels(rows), size=(6, 4))


if __name__ == "__main__":
    main()
