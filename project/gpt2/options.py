"""The GPT-2 program's options: one parser whose types carry every bound, the presets (auto: GPT-2
124M on CUDA, a small model on a CPU), the combinations refused before anything runs, and the command
line that resumes a stopped run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from project.common.console import OneLineParser, command_line
from project.common.options import (
    NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, UNIT_INTERVAL, add_compute_options, given_options, option,
)  # fmt: skip
from project.common.parallel import add_parallel_options
from project.common.presets import AUTO, add_preset_option, apply_preset

FRESH_MODEL = ("depth", "channels", "heads", "max_seq_len", "vocab_size")
STARTING_MODEL = ("init_from", "resume_from")
DEFAULT_SHARDS = "runs/gpt2_data/*_train_*.bin"  # where project/gpt2_data.py writes by default
# --preset NAME: defaults of a run (explicit options still win). full: GPT-2 124M as llm.c trains it;
# tiny: a small fresh model that trains in minutes on a 2-core CPU; auto: full on CUDA, tiny on a CPU.
PRESETS = {
    "full": {},
    "tiny": {
        "depth": 4, "channels": 128, "heads": 4, "max_seq_len": 128, "seq_len": 128, "batch_size": 8, "steps": 200,
        "lr": 1e-3, "warmup_steps": 20, "final_lr_frac": 0.1, "val_every": 50, "val_batches": 4, "sample_every": 100,
    },
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The program's options; a value out of its bound is a one-line usage error naming the option."""
    p = OneLineParser(
        description="Train GPT-2 with minitorch on llm.c token shards; reads and writes llm.c checkpoints.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_preset_option(p, PRESETS)
    model = p.add_argument_group("model (a fresh one with GPT-2's initialisation unless --init-from/--resume-from)")
    model.add_argument("--init-from", default=None, metavar="FILE.bin", help="llm.c checkpoint to start from (float32, version 3, or bfloat16, version 5)")
    model.add_argument("--resume-from", default=None, metavar="DIR",
                       help="checkpoint directory of an earlier run (<out-dir>/checkpoint_NNNNNN): model, AdamW moments, "
                       "step and data position; the other options come from this command line")
    model.add_argument("--depth", type=POSITIVE_INT, default=12, help="layers of a fresh model")
    model.add_argument("--channels", type=POSITIVE_INT, default=768, help="width C of a fresh model")
    model.add_argument("--heads", type=POSITIVE_INT, default=12, help="attention heads of a fresh model")
    model.add_argument("--max-seq-len", type=POSITIVE_INT, default=1024, help="positions of a fresh model")
    model.add_argument("--vocab-size", type=POSITIVE_INT, default=None,
                       help="vocabulary V of a fresh model, padded to a multiple of 128 (None: the vocabulary of the "
                       "tokenizer beside the training shards, else GPT-2's 50257)")
    data = p.add_argument_group("data")
    data.add_argument("--train-shards", default=DEFAULT_SHARDS, metavar="GLOB",
                      help="llm.c token shards to train on (the default: what project/gpt2_data.py writes from the "
                      "bundled Multi30k English)")
    data.add_argument("--val-shards", default=None, metavar="GLOB",
                      help="llm.c token shards for validation (None: with the default --train-shards, the *_val_* "
                      "shards beside them if there are any; else no validation)")
    data.add_argument("--batch-size", type=POSITIVE_INT, default=4,
                      help="sequences of --seq-len tokens per step, over all processes under torchrun (see "
                      "--micro-batch-size, --scale-batch-with-world)")
    data.add_argument("--seq-len", type=POSITIVE_INT, default=1024, help="tokens per sequence")
    opt = p.add_argument_group("optimization")
    opt.add_argument("--steps", type=POSITIVE_INT, default=None,
                     help="updates to run (None: one pass over the training shards, as llm.c)")
    opt.add_argument("--lr", type=NON_NEGATIVE, default=3e-4, help="peak learning rate of AdamW")
    opt.add_argument("--weight-decay", type=NON_NEGATIVE, default=0.0,
                     help="AdamW's decoupled weight decay, on every parameter as in llm.c's fp32 trainer")
    opt.add_argument("--warmup-steps", type=NON_NEGATIVE_INT, default=0, help="linear warm-up, then cosine decay")
    opt.add_argument("--final-lr-frac", type=UNIT_INTERVAL, default=1.0,
                     help="the cosine decays to lr * this at the last step (1: constant, llm.c's default)")
    opt.add_argument("--grad-clip", type=NON_NEGATIVE, default=0.0, help="global gradient-norm clip (0: off, as llm.c fp32)")
    run = p.add_argument_group("evaluation, samples, checkpoints")
    run.add_argument("--val-every", type=NON_NEGATIVE_INT, default=20,
                     help="validation loss every N steps and after the last (0: never)")
    run.add_argument("--val-batches", type=POSITIVE_INT, default=20, help="batches per validation")
    run.add_argument("--sample-every", type=NON_NEGATIVE_INT, default=0,
                     help="print a sample every N steps and after the last (0: never)")
    run.add_argument("--sample-tokens", type=POSITIVE_INT, default=64, help="tokens per sample")
    run.add_argument("--prompt", default="", help="text the samples continue (after <|endoftext|>)")
    run.add_argument("--top-k", type=POSITIVE_INT, default=None, help="sample among the k likeliest tokens")
    run.add_argument("--temperature", type=NON_NEGATIVE, default=1.0, help="sampling temperature (0: greedy)")
    run.add_argument("--tokenizer", default=None, metavar="FILE.json",
                     help="tokenizers JSON for the prompt and samples (default: the one *_tokenizer.json beside "
                     "the training shards if there is exactly one; without any, samples are token ids after "
                     "--eot-id)")
    run.add_argument("--eot-id", type=NON_NEGATIVE_INT, default=50256,
                     help="token that starts samples when there is no tokenizer (GPT-2's <|endoftext|>)")
    run.add_argument("--checkpoint-every", type=NON_NEGATIVE_INT, default=5000,
                     help="save <out-dir>/checkpoint_NNNNNN/ (model.bin, state.npz) every N steps (0: not by steps)")
    run.add_argument("--checkpoint-every-minutes", type=NON_NEGATIVE, default=10.0,
                     help="also save one when this many minutes passed since the last (0: not by time); Ctrl-C or "
                     "SIGTERM saves one too and stops")
    run.add_argument("--keep-checkpoints", type=NON_NEGATIVE_INT, default=2,
                     help="checkpoint directories kept in --out-dir, the newest (0: all)")
    add_parallel_options(p, rows="sequences")
    add_compute_options(p, attention="fused", loss="fused")
    p.add_argument("--out-dir", default="runs/gpt2", help="metrics, plot, checkpoints and the final model.bin")
    p.add_argument("--seed", type=int, default=0, help="initialisation of a fresh model and sampling")
    return p


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The options (each within the bound of its type), --preset applied ("auto" resolved for
    --backend; args.preset is the preset used, args.auto_preset whether auto chose it), after
    refusing combinations that would silently ignore one of them."""
    parser = build_parser()
    preset = apply_preset(parser, PRESETS, argv)
    args = parser.parse_args(argv)
    given = given_options(build_parser(), argv)
    args.auto_preset, args.preset = args.preset == AUTO, preset
    if args.init_from and args.resume_from:
        parser.error("--init-from and --resume-from both name the starting model; pass one")
    fresh = [option(name) for name in FRESH_MODEL if name in given]
    if fresh and (args.init_from or args.resume_from):
        parser.error(f"{' '.join(fresh)} describe a fresh model; the model of --init-from/--resume-from has its own")
    return args


def resume_command(argv: Optional[Sequence[str]], directory: Path) -> str:
    """The command that continues a run from its checkpoint directory: the run's own options, less
    those that name or describe its starting model, then --resume-from directory."""
    dropped = {option(name) for name in (*FRESH_MODEL, *STARTING_MODEL)}
    kept, words = [], list(sys.argv[1:] if argv is None else argv)
    while words:
        word = words.pop(0)
        name = word.split("=", 1)[0]
        if name in dropped:
            if "=" not in word and words:
                words.pop(0)
            continue
        kept.append(word)
    return command_line(Path(__file__).parents[1] / "train_gpt2.py", *kept, "--resume-from", str(directory))

