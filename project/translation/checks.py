"""Checks of the translation program's data, made before any training (the options: options.py):
the sizes of the corpus splits against the sample options, before and after encoding. A failure is
an InputError whose one-line message names the option or file, what is wrong and what to do."""

from __future__ import annotations

from typing import Any, Dict

from project.common.options import InputError, option
from project.translation.batches import EncodedPairs
from project.translation.corpus import Corpus


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
