"""The translation program's tokenizer: one byte-level BPE vocabulary shared by German and English,
with three special tokens at fixed ids, trained on the training split and kept as JSON in the
output directory (so a resumed run tokenizes identically); and the prompts and detokenized
outputs of decoding.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from minitorch.serialization import atomic_write

from project.translation.corpus import Pair


EOS_DE = "<eos_de>"
EOS_EN = "<eos_en>"
PAD = "<pad>"
SPECIAL_TOKENS = (EOS_DE, EOS_EN, PAD)
# The trainer assigns special tokens the first ids, in the order given.
EOS_DE_ID, EOS_EN_ID, PAD_ID = 0, 1, 2
# Special tokens plus the 256-symbol byte alphabet; BPE merges come on top.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256



def _check_special_ids(tokenizer: Tokenizer, origin: str) -> None:
    for token, expected in zip(SPECIAL_TOKENS, (EOS_DE_ID, EOS_EN_ID, PAD_ID)):
        if tokenizer.token_to_id(token) != expected:
            raise ValueError(
                f"{origin}: special token {token} has id {tokenizer.token_to_id(token)}, "
                f"expected {expected}"
            )


def train_tokenizer(pairs: Sequence[Pair], vocab_size: int = 8000) -> Tokenizer:
    """A byte-level BPE tokenizer trained on both sides of ``pairs`` (one shared vocabulary
    of at most ``vocab_size`` tokens; fewer when the text supports fewer merges).

    Special tokens get fixed ids: ``<eos_de>`` = 0, ``<eos_en>`` = 1, ``<pad>`` = 2. The
    ByteLevel pre-tokenizer (no added prefix space) and decoder make decode(encode(s)) == s.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} is below {MIN_VOCAB_SIZE} "
            f"(the {len(SPECIAL_TOKENS)} special tokens plus the 256-byte alphabet)"
        )
    if not pairs:
        raise ValueError("cannot train a tokenizer on zero pairs")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (text for pair in pairs for text in pair)
    tokenizer.train_from_iterator(texts, trainer, length=2 * len(pairs))
    # Sentences that happen to contain "<eos_de>" etc. stay text, never special ids.
    tokenizer.encode_special_tokens = True
    _check_special_ids(tokenizer, "trained tokenizer")
    return tokenizer


def tokenizer_path(out_dir: str | os.PathLike, vocab_size: int) -> Path:
    """Where the tokenizer of a given vocabulary size is kept in an output directory."""
    return Path(out_dir) / f"tokenizer-bpe{vocab_size}.json"


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """A tokenizer saved by ``load_or_train_tokenizer``, its special-token ids checked."""
    tokenizer = Tokenizer.from_file(str(path))
    # Not part of the JSON format, so it is set again after loading.
    tokenizer.encode_special_tokens = True
    _check_special_ids(tokenizer, str(path))
    return tokenizer


def load_or_train_tokenizer(
    out_dir: str | os.PathLike, train_pairs: Sequence[Pair], vocab_size: int = 8000
) -> Tokenizer:
    """The tokenizer saved in ``out_dir`` for this vocabulary size, or a new one trained on
    ``train_pairs`` and saved there atomically, so a resumed run tokenizes identically."""
    path = tokenizer_path(out_dir, vocab_size)
    if path.is_file():
        return load_tokenizer(path)
    tokenizer = train_tokenizer(train_pairs, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(tokenizer.to_str(pretty=True).encode("utf-8")))
    return tokenizer





def encode_prompts(tokenizer: Tokenizer, sources: Sequence[str], max_len: int) -> list[np.ndarray]:
    """German sources as prompts ``de <eos_de>`` (int64 arrays), for generating English.

    A source longer than ``max_len - 2`` tokens is truncated to that length, keeping room for
    ``<eos_de>`` and at least one generated token; every source must get a translation, so
    none is dropped. Truncation is reported with a warning.
    """
    if max_len < 3:
        raise ValueError(f"max_len must be at least 3, got {max_len}")
    room = max_len - 2
    prompts = []
    n_truncated = 0
    for encoding in tokenizer.encode_batch(list(sources), add_special_tokens=False):
        ids = encoding.ids
        if len(ids) > room:
            ids = ids[:room]
            n_truncated += 1
        prompts.append(np.array(ids + [EOS_DE_ID], dtype=np.int64))
    if n_truncated:
        warnings.warn(
            f"{n_truncated} of {len(prompts)} sources exceed {room} tokens "
            f"(max_len {max_len} - 2) and were truncated",
            stacklevel=2,
        )
    return prompts


def decode_translations(tokenizer: Tokenizer, generated: Iterable[Sequence[int]]) -> list[str]:
    """Detokenized English text of each row of generated ids (the tokens produced after the
    prompt), cut at the first ``<eos_en>``; other special tokens are skipped."""
    rows = []
    for ids in generated:
        row = [int(token) for token in ids]
        if EOS_EN_ID in row:
            row = row[: row.index(EOS_EN_ID)]
        rows.append(row)
    return tokenizer.decode_batch(rows, skip_special_tokens=True)

