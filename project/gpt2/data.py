"""Turn a text file into llm.c token shards for GPT-2 training (``project/gpt2/llmc.py``).

Each document (by default one line; ``--documents paragraph`` takes blank-line separated blocks)
becomes ``<|endoftext|> tokens...``: the end-of-text token starts every document, as in GPT-2's
training data, so it both separates documents and gives the first token something to follow.
The first ``--val-fraction`` of the documents go to the validation shards, the rest to the
training shards; the token stream of each split is cut into near-equal shards of at most
``--shard-size`` tokens (near-equal, so no shard is a tiny remainder that a loader would refuse).

By default a byte-level BPE tokenizer (``--vocab-size`` tokens, ``<|endoftext|>`` = id 0) is
trained on the training documents. ``--tokenizer FILE.json`` uses an existing ``tokenizers`` JSON
instead; its ids must fit uint16 (at most 65536 tokens). Either way the tokenizer JSON is saved
beside the shards, so a trainer can read the vocabulary size and decode samples. Text that
happens to contain ``<|endoftext|>`` is encoded as ordinary text, never as the special token.

GPT-2's own BPE (50257 tokens, ``<|endoftext|>`` = 50256): with its ``vocab.json`` and
``merges.txt`` at hand, convert it once with::

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file("vocab.json", "merges.txt"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save("gpt2_tokenizer.json")

(with network access, ``Tokenizer.from_pretrained("gpt2").save("gpt2_tokenizer.json")`` gives
the same), then pass ``--tokenizer gpt2_tokenizer.json``.

    python project/gpt2_data.py                       # English side of the bundled Multi30k
    python project/gpt2_data.py --input book.txt --documents paragraph --out-dir runs/book

Everything is held in memory (two bytes a token), which suits corpora up to a few GB.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from minitorch.serialization import atomic_write
from project.common.console import OneLineParser
from project.common.options import FRACTION, POSITIVE_INT
from project.gpt2.llmc import MAX_TOKEN_ID, write_shard

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_INPUT = PROJECT_ROOT.parent / "shared" / "data" / "multi30k" / "train.en.gz"
EOT_TOKEN = "<|endoftext|>"
MAX_VOCAB_SIZE = MAX_TOKEN_ID + 1
MIN_VOCAB_SIZE = 257  # the 256 byte symbols plus the end-of-text token
ENCODE_CHUNK = 4096  # documents per encode_batch call: fast, and the progress bar moves


@dataclass(frozen=True)
class PreparedData:
    """What ``prepare_shards`` wrote: the tokenizer and each split's shards with their token
    counts. ``vocab_size`` is the largest token id + 1 (the model's V)."""

    tokenizer_path: Path
    vocab_size: int
    eot_id: int
    train_shards: tuple[tuple[Path, int], ...]
    val_shards: tuple[tuple[Path, int], ...]
    train_documents: int
    val_documents: int
    train_pattern: str
    val_pattern: str

    @property
    def train_tokens(self) -> int:
        """Tokens in all training shards."""
        return sum(count for _, count in self.train_shards)

    @property
    def val_tokens(self) -> int:
        """Tokens in all validation shards."""
        return sum(count for _, count in self.val_shards)


def read_documents(
    path: str | os.PathLike, documents: str = "line", max_lines: int | None = None
) -> list[str]:
    """The documents of a UTF-8 text file, plain or gzip'd (recognised by its content).

    ``documents="line"``: every non-blank line is one document (without its newline).
    ``documents="paragraph"``: blocks of lines separated by blank lines, joined with newlines.
    ``max_lines`` reads only that many lines of the file.
    """
    if documents not in ("line", "paragraph"):
        raise ValueError(f"documents must be 'line' or 'paragraph', got {documents!r}")
    with open(path, "rb") as f:
        is_gzip = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if is_gzip else open
    docs: list[str] = []
    block: list[str] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f):
                if max_lines is not None and number >= max_lines:
                    break
                line = line.rstrip("\n")
                if documents == "line":
                    if line.strip():
                        docs.append(line)
                elif line.strip():
                    block.append(line)
                elif block:
                    docs.append("\n".join(block))
                    block = []
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err})") from err
    if block:
        docs.append("\n".join(block))
    if not docs:
        raise ValueError(f"{path}: no text (every line read was blank)")
    return docs


def _check_vocab_size(vocab_size: int) -> None:
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be in {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE} (256 bytes plus the "
            f"end-of-text token, up to what uint16 shards hold), got {vocab_size}"
        )


def train_bpe_tokenizer(
    documents: Sequence[str], vocab_size: int, eot_token: str = EOT_TOKEN, progress: bool = False
) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2's scheme: byte alphabet, no prefix space) of at most
    ``vocab_size`` tokens trained on ``documents``; ``eot_token`` is its only special token, id 0."""
    _check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eot_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(documents, trainer, length=len(documents))
    return tokenizer


def check_tokenizer(tokenizer: Tokenizer, eot_token: str, source: str) -> tuple[int, int]:
    """``(vocab_size, eot_id)``: the largest token id + 1 and the id of ``eot_token``, after
    checking that the ids fit uint16 shards and that the token exists; errors name ``source``."""
    vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
    if vocab_size > MAX_VOCAB_SIZE:
        raise ValueError(
            f"tokenizer {source} has token ids up to {vocab_size - 1}; llm.c token shards store "
            f"uint16, so at most {MAX_VOCAB_SIZE} tokens (ids 0..{MAX_TOKEN_ID}) fit"
        )
    eot_id = tokenizer.token_to_id(eot_token)
    if eot_id is None:
        raise ValueError(
            f"tokenizer {source} has no {eot_token!r} token; name its end-of-text token with --eot-token"
        )
    return vocab_size, eot_id


def encode_documents(
    tokenizer: Tokenizer, documents: Sequence[str], eot_id: int, progress: bool = False
) -> np.ndarray:
    """One uint16 stream ``eot doc0 eot doc1 ...``; special-token text inside a document stays text."""
    previous = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    pieces = []
    try:
        with tqdm(total=len(documents), unit="doc", desc="encoding", disable=not progress) as bar:
            for start in range(0, len(documents), ENCODE_CHUNK):
                chunk = documents[start : start + ENCODE_CHUNK]
                ids: list[int] = []
                for encoding in tokenizer.encode_batch(list(chunk), add_special_tokens=False):
                    ids.append(eot_id)
                    ids.extend(encoding.ids)
                pieces.append(np.array(ids, dtype=np.uint16))
                bar.update(len(chunk))
    finally:
        tokenizer.encode_special_tokens = previous
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)


def _split_shards(tokens: np.ndarray, shard_size: int) -> list[np.ndarray]:
    return np.array_split(tokens, math.ceil(tokens.size / shard_size)) if tokens.size else []


def shard_pattern(out_dir: str | os.PathLike, name: str, split: str) -> str:
    """Glob pattern of one split's shards, ``{out_dir}/{name}_{split}_NNNNNN.bin``; the digits
    keep it from matching the shards of another name that merely starts with this one."""
    return os.path.join(glob.escape(os.fspath(out_dir)), f"{name}_{split}_{'[0-9]' * 6}.bin")


def _shard_paths(out_dir: Path, name: str, split: str) -> Iterator[Path]:
    return (Path(p) for p in glob.glob(shard_pattern(out_dir, name, split)))


def default_name(input_path: str | os.PathLike) -> str:
    """File-name prefix derived from the input: ``train.en.gz`` -> ``train_en``."""
    stem = Path(input_path).name.removesuffix(".gz").removesuffix(".txt")
    return re.sub(r"[^A-Za-z0-9_-]", "_", stem) or "text"


def prepare_shards(
    input_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    name: str | None = None,
    tokenizer_path: str | os.PathLike | None = None,
    vocab_size: int = 8192,
    eot_token: str = EOT_TOKEN,
    val_fraction: float = 0.05,
    shard_size: int = 100_000_000,
    documents: str = "line",
    max_lines: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> PreparedData:
    """Read ``input_path``, tokenize it and write ``{name}_val_NNNNNN.bin``,
    ``{name}_train_NNNNNN.bin`` and ``{name}_tokenizer.json`` into ``out_dir`` (see the module
    docstring). Refuses to replace earlier outputs of the same name unless ``overwrite``; with
    it, stale shards of an earlier, longer run are removed so the glob patterns see only new ones.
    """
    name = name or default_name(input_path)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name may hold only letters, digits, '_', '-' and '.', got {name!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    out_dir = Path(out_dir)
    tokenizer_out = out_dir / f"{name}_tokenizer.json"
    earlier = sorted([*_shard_paths(out_dir, name, "train"), *_shard_paths(out_dir, name, "val")])
    if tokenizer_out.exists():
        earlier.append(tokenizer_out)
    if earlier and not overwrite:
        listed = ", ".join(str(p) for p in earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        raise FileExistsError(
            f"{out_dir} already holds outputs named {name!r} ({listed}); pass --overwrite or another --name"
        )

    if tokenizer_path is None:
        _check_vocab_size(vocab_size)
    else:  # before reading the corpus, so a bad tokenizer fails fast
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as err:  # tokenizers raises plain Exceptions for unreadable files
            raise ValueError(f"cannot load tokenizer {tokenizer_path}: {err}") from err
        vocab, eot_id = check_tokenizer(tokenizer, eot_token, str(tokenizer_path))

    docs = read_documents(input_path, documents, max_lines)
    n_val = min(max(1, round(val_fraction * len(docs))), len(docs) - 1) if val_fraction > 0 else 0
    if val_fraction > 0 and n_val < 1:
        raise ValueError(f"{input_path}: {len(docs)} document(s) cannot be split into train and val")
    val_docs, train_docs = docs[:n_val], docs[n_val:]
    if tokenizer_path is None:
        tokenizer = train_bpe_tokenizer(train_docs, vocab_size, eot_token, progress)
        vocab, eot_id = check_tokenizer(tokenizer, eot_token, f"trained on {input_path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(tokenizer_out, lambda f: f.write(tokenizer.to_str().encode("utf-8")))

    written: dict[str, tuple[tuple[Path, int], ...]] = {}
    for split, split_docs in (("val", val_docs), ("train", train_docs)):
        shards = _split_shards(encode_documents(tokenizer, split_docs, eot_id, progress), shard_size)
        paths = []
        bar = tqdm(shards, desc=f"writing {split}", unit="shard", disable=not progress)
        for index, shard in enumerate(bar):
            path = write_shard(out_dir / f"{name}_{split}_{index:06d}.bin", shard)
            paths.append((path, int(shard.size)))
        written[split] = tuple(paths)
        for stale in set(_shard_paths(out_dir, name, split)) - {p for p, _ in paths}:
            stale.unlink()

    return PreparedData(
        tokenizer_path=tokenizer_out,
        vocab_size=vocab,
        eot_id=eot_id,
        train_shards=written["train"],
        val_shards=written["val"],
        train_documents=len(train_docs),
        val_documents=len(val_docs),
        train_pattern=shard_pattern(out_dir, name, "train"),
        val_pattern=shard_pattern(out_dir, name, "val"),
    )


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of ``main``."""
    p = OneLineParser(
        description="Write llm.c token shards (train/val) and a tokenizer JSON from a text file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--input", default=str(DEFAULT_INPUT), help="UTF-8 text file, plain or gzip'd")
    p.add_argument("--out-dir", default="runs/gpt2_data", help="directory for the shards and tokenizer")
    p.add_argument("--name", default=None,
                   help="file-name prefix; when not given, derived from --input (train.en.gz -> train_en)")
    p.add_argument("--documents", choices=("line", "paragraph"), default="line",
                   help="one document per non-blank line, or per blank-line separated block")
    p.add_argument("--max-lines", type=POSITIVE_INT, default=None, help="read only the first N lines")
    p.add_argument("--tokenizer", default=None,
                   help="existing tokenizers JSON (e.g. GPT-2's BPE) instead of training a BPE")
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary of the trained BPE")
    p.add_argument("--eot-token", default=EOT_TOKEN, help="end-of-text token that starts every document")
    p.add_argument("--val-fraction", type=FRACTION, default=0.05,
                   help="share of the documents (the first ones) for val")
    p.add_argument("--shard-size", type=POSITIVE_INT, default=100_000_000, help="most tokens per shard")
    p.add_argument("--overwrite", action="store_true", help="replace earlier outputs of the same --name")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> PreparedData:
    """Run the command line; prints every file written with its token count."""
    args = build_parser().parse_args(argv)
    try:
        result = prepare_shards(
            args.input, args.out_dir, name=args.name, tokenizer_path=args.tokenizer,
            vocab_size=args.vocab_size, eot_token=args.eot_token, val_fraction=args.val_fraction,
            shard_size=args.shard_size, documents=args.documents, max_lines=args.max_lines,
            overwrite=args.overwrite, progress=not args.quiet,
        )
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from err
    print(f"tokenizer {result.tokenizer_path} "
          f"(vocab size {result.vocab_size}, {args.eot_token} = {result.eot_id})")
    for split, shards, docs in (("val", result.val_shards, result.val_documents),
                                ("train", result.train_shards, result.train_documents)):
        total = sum(count for _, count in shards)
        print(f"{split}: {docs} documents, {total} tokens in {len(shards)} shard(s)")
        for path, count in shards:
            print(f"  {path} {count} tokens")
    print(f"patterns: train {result.train_pattern}  val {result.val_pattern}")
    return result


if __name__ == "__main__":
    main()
