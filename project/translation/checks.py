"""Checks of the translation program's input, all made before any training: option values and
combinations, and the sizes of the corpus splits. A failure is an InputError whose one-line message
names the option or file, what is wrong and what to do."""

from __future__ import annotations

from typing import Any, Dict, List

from project.translation.batches import EncodedPairs

from project.translation.corpus import Corpus

from project.translation.tokenizer import MIN_VOCAB_SIZE


class InputError(ValueError):
    """Input the program cannot train with; the message says which and how to fix it."""


def option(key: str) -> str:
    """The command-line spelling of a configuration key: n_embd -> --n-embd."""
    return "--" + key.replace("_", "-")


def check_options(config: Dict[str, Any]) -> None:
    """Option values out of range and options that cannot work together (all reported at once)."""
    problems: List[str] = []
    if config["n_embd"] % config["n_head"]:
        problems.append(f"--n-embd {config['n_embd']} is not a multiple of --n-head {config['n_head']}")
    if not 0.0 <= config["dropout"] < 1.0:
        problems.append(f"--dropout {config['dropout']} is outside [0, 1)")
    if not config["lr"] > 0.0:
        problems.append(f"--lr {config['lr']} must be positive")
    if not 0.0 <= config["label_smoothing"] <= 1.0:
        problems.append(f"--label-smoothing {config['label_smoothing']} is outside [0, 1]")
    for key in ("warmup_steps", "grad_clip", "save_every_steps", "save_every_minutes", "length_penalty"):
        if config[key] < 0:
            problems.append(f"{option(key)} {config[key]} must be >= 0")
    if config["vocab_size"] < MIN_VOCAB_SIZE:
        problems.append(
            f"--vocab-size {config['vocab_size']} is below {MIN_VOCAB_SIZE} (3 special tokens + 256 bytes)"
        )
    if config["max_len"] < 3:
        problems.append(f"--max-len {config['max_len']} leaves no room for a German token, <eos_de> and a reply")
    if problems:
        raise InputError("; ".join(problems))


def check_corpus(corpus: Corpus, config: Dict[str, Any]) -> None:
    """Sample limits the splits cannot satisfy (empty files were refused when they were read)."""
    for split, key in (("train", "samples_per_epoch"), ("valid", "valid_samples"), ("test", "test_samples")):
        available = len(getattr(corpus, split))
        if config[key] is not None and config[key] > available:
            raise InputError(
                f"{option(key)} {config[key]} exceeds the {available} {split} pairs in {corpus.directory}"
            )


def check_encoded(train: EncodedPairs, valid: EncodedPairs, config: Dict[str, Any]) -> None:
    """Splits left empty or too small once pairs longer than --max-len are dropped."""
    for split, pairs in (("training", train), ("validation", valid)):
        if not pairs.sequences:
            raise InputError(
                f"all {pairs.n_dropped} {split} pairs are longer than --max-len {config['max_len']} tokens; "
                f"raise --max-len"
            )
    wanted = config["samples_per_epoch"]
    if wanted is not None and wanted > len(train.sequences):
        raise InputError(
            f"--samples-per-epoch {wanted} exceeds the {len(train.sequences)} training pairs that fit "
            f"--max-len {config['max_len']} ({train.n_dropped} longer ones dropped)"
        )
