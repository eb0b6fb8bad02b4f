"""The GPT-2 program's inputs, opened and checked before anything trains: the token shards (their
headers, and their token ids against the model's vocabulary as each shard is opened), the model's
configuration (a fresh one's options, or the header of --init-from / --resume-from), the tokenizer
and the sequence length. Each problem is an InputError (or an LlmcFormatError naming the file) whose
one-line message says which option or file is wrong and what to do."""

from __future__ import annotations

import argparse
import glob
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from tokenizers import Tokenizer

from project.common.options import InputError
from project.gpt2.data import EOT_TOKEN
from project.gpt2.llmc import GPT2Config, checkpoint_config
from project.gpt2.options import DEFAULT_SHARDS
from project.gpt2.shards import ShardLoader, expand_shard_pattern
from project.gpt2.training import STATE_MODEL, STATE_NAME

GPT2_VOCAB_SIZE = 50257
MAKE_SHARDS = "python project/gpt2_data.py writes them from the bundled Multi30k English (no download needed)"


@dataclass(frozen=True)
class Inputs:
    """What a run trains on: the model's configuration (start: the llm.c checkpoint it is read from,
    None for a fresh model), the training and validation loaders and the tokenizer (or None)."""

    config: GPT2Config
    start: Optional[Path]
    train: ShardLoader
    val: Optional[ShardLoader]
    tokenizer: Optional[Tokenizer]


def shard_paths(name: str, pattern: str) -> List[Path]:
    """The shards a --*-shards pattern matches; InputError naming the option when none does."""
    try:
        return expand_shard_pattern(pattern)
    except FileNotFoundError:
        hint = f"; {MAKE_SHARDS}" if pattern == DEFAULT_SHARDS else ""
        raise InputError(f"{name} {pattern!r} matches no file{hint}") from None


def validation_pattern(args: argparse.Namespace) -> Optional[str]:
    """--val-shards; without it, the *_val_* shards beside the default training shards, if any."""
    if args.val_shards is not None:
        return args.val_shards
    beside = DEFAULT_SHARDS.replace("_train_", "_val_")
    return beside if args.train_shards == DEFAULT_SHARDS and glob.glob(beside) else None


def find_tokenizer(args: argparse.Namespace, train_paths: List[Path]) -> Optional[Tokenizer]:
    """--tokenizer, or the single *_tokenizer.json that project/gpt2_data.py left beside the shards."""
    found = [Path(args.tokenizer)] if args.tokenizer else sorted({p for s in train_paths for p in s.parent.glob("*_tokenizer.json")})
    if len(found) != 1:
        return None
    try:
        tokenizer = Tokenizer.from_file(str(found[0]))
    except Exception as err:  # tokenizers raises plain Exceptions for unreadable files
        raise InputError(f"--tokenizer {found[0]}: not a tokenizers JSON file ({err})") from None
    if args.sample_every and tokenizer.token_to_id(EOT_TOKEN) is None and not args.prompt:
        raise InputError(f"the tokenizer {found[0]} has no {EOT_TOKEN!r} token for samples to start from; give a --prompt")
    return tokenizer


def starting_checkpoint(args: argparse.Namespace) -> Optional[Path]:
    """The llm.c checkpoint the model starts from (--init-from, or --resume-from's model.bin), after
    checking that it is there; None for a fresh model."""
    if args.init_from:
        path = Path(args.init_from)
        if not path.is_file():
            raise InputError(f"--init-from {path} does not exist (an llm.c float32 checkpoint such as llm.c's "
                             f"gpt2_124M.bin; leave it out to train a fresh model)")  # fmt: skip
        return path
    if args.resume_from:
        directory = Path(args.resume_from)
        if not (directory / STATE_MODEL).is_file() or not (directory / STATE_NAME).is_file():
            raise InputError(f"--resume-from {directory} holds no checkpoint ({STATE_MODEL} and {STATE_NAME}): "
                             f"pass a checkpoint_NNNNNN directory that an earlier run saved")  # fmt: skip
        return directory / STATE_MODEL
    return None


def fresh_config(args: argparse.Namespace, tokenizer: Optional[Tokenizer]) -> GPT2Config:
    """The configuration of a fresh model from the options (vocabulary: --vocab-size, else the
    tokenizer's, else GPT-2's)."""
    if args.channels % args.heads:
        raise InputError(f"--channels {args.channels} is not a multiple of --heads {args.heads}")
    vocab = args.vocab_size or (tokenizer.get_vocab_size() if tokenizer is not None else GPT2_VOCAB_SIZE)
    return GPT2Config.with_padded_vocab(
        max_seq_len=args.max_seq_len, vocab_size=vocab, num_layers=args.depth, num_heads=args.heads,
        channels=args.channels,
    )  # fmt: skip


def open_inputs(args: argparse.Namespace, rank: int = 0, world_size: int = 1, rows: Optional[int] = None) -> Inputs:
    """Every input of a run, checked; the loaders serve process `rank` of world_size `rows` sequences
    of each step (default: --batch-size)."""
    train_paths = shard_paths("--train-shards", args.train_shards)
    val_pattern = validation_pattern(args)
    val_paths = shard_paths("--val-shards", val_pattern) if val_pattern else None
    tokenizer = find_tokenizer(args, train_paths)
    start = starting_checkpoint(args)
    config = checkpoint_config(start) if start else fresh_config(args, tokenizer)
    if args.seq_len > config.max_seq_len:
        raise InputError(f"--seq-len {args.seq_len} exceeds the model's max_seq_len {config.max_seq_len}")

    def loader(paths: List[Path]) -> ShardLoader:
        return ShardLoader(paths, rows or args.batch_size, args.seq_len, rank, world_size, vocab_size=config.vocab_size)

    return Inputs(config, start, loader(train_paths), loader(val_paths) if val_paths else None, tokenizer)

