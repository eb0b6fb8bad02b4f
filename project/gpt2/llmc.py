"""llm.c's binary file formats, byte for byte: the GPT-2 checkpoint (float32 or bfloat16) and the
token shard.

Both start with a header of 256 little-endian int32 (1024 bytes); unused entries are zero.

GPT-2 checkpoint (llm.c's ``gpt2_124M.bin``, float32, and ``gpt2_124M_bf16.bin``, bfloat16)::

    header[0] magic 20240326   header[1] version       header[2] max_seq_len (maxT)
    header[3] vocab_size (V)   header[4] num_layers (L) header[5] num_heads (NH)
    header[6] channels (C)     header[7] padded_vocab_size (Vp)

version 3 (float32) or 5 (bfloat16: every tensor, LayerNorms included, as llm.c's bf16 trainer
writes it), then the sixteen tensors of ``PARAMETER_NAMES`` in that dtype, back to back in C order,
with the shapes ``parameter_shapes`` gives; a bfloat16 value is the top half of its float32
pattern, little-endian, rounded to nearest even when written here. Linear weights are stored ``[out, in]`` (``y = x @ W.T + b``). The
3C outputs of ``qkvw`` are Q, then K, then V, each split into NH heads of C/NH channels. There is
no separate LM head: logits are ``x @ wte.T``; rows V..Vp-1 of ``wte`` only pad the vocabulary
to a multiple of 128 for faster matmuls (llm.c writes zeros there and ignores those logits).

Token shard (llm.c's ``*_train_000000.bin``)::

    header[0] magic 20240520   header[1] version 1     header[2] number of tokens N

then N uint16 tokens. Documents are concatenated, each one starting with the end-of-text token.
``ShardLoader`` (shards.py) serves training batches from shards as llm.c's DataLoader does.

Files are written through minitorch.serialization.atomic_write, so a crash never leaves a
half-written file under the final name.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO

import numpy as np

import minitorch
from minitorch.serialization import atomic_write

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
CHECKPOINT_MAGIC = 20240326
CHECKPOINT_VERSION = 3  # float32; the version write_checkpoint writes by default
CHECKPOINT_VERSIONS = {3: "float32", 5: "bfloat16"}  # version -> dtype of the parameters
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
VOCAB_PAD_MULTIPLE = 128
MAX_TOKEN_ID = np.iinfo(np.uint16).max
_INT32_MAX = np.iinfo(np.int32).max

# Other files that share the header convention, so a wrong file gets named instead of just refused.
_KNOWN_MAGICS = {
    CHECKPOINT_MAGIC: "an llm.c GPT-2 checkpoint (read it with read_checkpoint)",
    SHARD_MAGIC: "an llm.c token shard (read it with read_shard)",
    20240327: "an llm.c debug state file (gpt2_124M_debug_state.bin)",
    20240328: "an llm.c tokenizer file (gpt2_tokenizer.bin)",
    20240527: "an llm.c training state file (state_*.bin)",
}
_CHECKPOINT_VERSIONS = {
    **dict.fromkeys((1, 2), "an export from before llm.c padded the vocabulary"),
}
_ITEM_BYTES = {"float32": 4, "bfloat16": 2}


class LlmcFormatError(ValueError):
    """A file that is not a valid llm.c file of the expected kind; the message names the file
    and the header field or byte count that is wrong."""


def pad_vocab_size(vocab_size: int, multiple: int = VOCAB_PAD_MULTIPLE) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple``, as llm.c pads it (50257 -> 50304)."""
    if vocab_size < 1 or multiple < 1:
        raise ValueError(f"vocab_size and multiple must be positive, got {vocab_size} and {multiple}")
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True)
class GPT2Config:
    """The model hyperparameters a checkpoint header carries (same names as llm.c's GPT2Config).

    Every field is a positive int that fits the int32 header, ``channels`` is divisible by
    ``num_heads`` and ``padded_vocab_size >= vocab_size``; anything else raises a ValueError
    naming the field.
    """

    max_seq_len: int
    vocab_size: int
    padded_vocab_size: int
    num_layers: int
    num_heads: int
    channels: int

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"GPT2Config.{field.name} must be an int, got {value!r}")
            if not 0 < value <= _INT32_MAX:
                raise ValueError(f"GPT2Config.{field.name} must be in 1..{_INT32_MAX}, got {value}")
            object.__setattr__(self, field.name, int(value))
        if self.channels % self.num_heads:
            raise ValueError(
                f"GPT2Config.channels ({self.channels}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(
                f"GPT2Config.padded_vocab_size ({self.padded_vocab_size}) must be >= "
                f"vocab_size ({self.vocab_size})"
            )

    @classmethod
    def with_padded_vocab(
        cls, *, max_seq_len: int, vocab_size: int, num_layers: int, num_heads: int, channels: int
    ) -> GPT2Config:
        """A config whose ``padded_vocab_size`` is ``vocab_size`` padded the way llm.c pads it."""
        return cls(max_seq_len, vocab_size, pad_vocab_size(vocab_size), num_layers, num_heads, channels)


GPT2_124M = GPT2Config(1024, 50257, 50304, 12, 12, 768)

PARAMETER_NAMES = (
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
)


def parameter_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Shape of each parameter tensor, keyed by name in file order (llm.c's ParameterTensors)."""
    Vp, maxT, L, C = config.padded_vocab_size, config.max_seq_len, config.num_layers, config.channels
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


def num_parameters(config: GPT2Config) -> int:
    """Number of float32 values a checkpoint of ``config`` holds (124475904 for GPT2_124M)."""
    return sum(int(np.prod(shape)) for shape in parameter_shapes(config).values())


# ----------------------------------------------------------------------------------------------
# Shared header handling


def _header_bytes(*values: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[: len(values)] = values
    return header.tobytes()


def _read_header(path: Path, f: BinaryIO, kind: str, magic: int) -> tuple[np.ndarray, int]:
    """The int64 header of an open file and the file's size, after checking the size and magic."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise LlmcFormatError(f"{path}: empty file (0 bytes); an {kind} has a {HEADER_BYTES}-byte header")
    if size < HEADER_BYTES:
        raise LlmcFormatError(
            f"{path}: file is {size} bytes, shorter than the {HEADER_BYTES}-byte header of an {kind}"
        )
    raw = f.read(HEADER_BYTES)
    header = np.frombuffer(raw, dtype="<i4").astype(np.int64)
    if header[0] != magic:
        found = int(header[0])
        what = _KNOWN_MAGICS.get(found)
        if raw.startswith(b"PK"):
            what = "a zip archive (a PyTorch .pt/.bin checkpoint?)"
        raise LlmcFormatError(
            f"{path}: header[0] (magic) is {found}, expected {magic} for an {kind}"
            + (f"; the file looks like {what}" if what else "")
        )
    return header, size


def _check_size(path: Path, kind: str, size: int, count: int, item: str, item_bytes: int) -> None:
    expected = HEADER_BYTES + count * item_bytes
    if size != expected:
        problem = f"truncated {kind}" if size < expected else f"{size - expected} bytes too many in {kind}"
        raise LlmcFormatError(
            f"{path}: {problem}: header says {count} {item}s ({expected} bytes with the header) "
            f"but the file holds {size} bytes (room for {(size - HEADER_BYTES) // item_bytes} {item}s)"
        )


def _open_for_reading(path: str | os.PathLike, kind: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"{kind} not found", os.fspath(path)) from None


# ----------------------------------------------------------------------------------------------
# GPT-2 checkpoints

_CHECKPOINT = "llm.c GPT-2 checkpoint"


def _checkpoint_header(path: Path, f: BinaryIO) -> tuple[GPT2Config, str]:
    """(the config, the parameters' dtype) in an open checkpoint's header, after checking the magic,
    version (3: float32, 5: bfloat16) and size."""
    header, size = _read_header(path, f, _CHECKPOINT, CHECKPOINT_MAGIC)
    version = int(header[1])
    dtype = CHECKPOINT_VERSIONS.get(version)
    if dtype is None:
        what = _CHECKPOINT_VERSIONS.get(version, "an unknown version")
        raise LlmcFormatError(
            f"{path}: header[1] (version) is {version}, {what}; only versions 3 (float32) and 5 (bfloat16), "
            f"with a padded vocabulary, are supported"
        )
    maxT, V, L, NH, C, Vp = (int(v) for v in header[2:8])
    try:
        config = GPT2Config(maxT, V, Vp, L, NH, C)
    except ValueError as err:
        raise LlmcFormatError(f"{path}: bad header (entries 2..7): {err}") from err
    _check_size(path, _CHECKPOINT, size, num_parameters(config), f"{dtype} parameter", _ITEM_BYTES[dtype])
    return config, dtype


def checkpoint_config(path: str | os.PathLike) -> GPT2Config:
    """The config of an llm.c checkpoint (version 3 or 5), from its header alone (its size checked
    against it); FileNotFoundError or LlmcFormatError as read_checkpoint."""
    path = Path(path)
    with _open_for_reading(path, _CHECKPOINT) as f:
        return _checkpoint_header(path, f)[0]


def read_checkpoint(path: str | os.PathLike) -> tuple[GPT2Config, dict[str, np.ndarray]]:
    """The config and the parameters as float32 (keyed by ``PARAMETER_NAMES``, shaped as
    ``parameter_shapes``) of an llm.c checkpoint of version 3 (float32) or 5 (bfloat16, widened
    exactly). The arrays are views of one buffer.

    Raises FileNotFoundError for a missing file and LlmcFormatError for anything else wrong.
    """
    path = Path(path)
    with _open_for_reading(path, _CHECKPOINT) as f:
        config, dtype = _checkpoint_header(path, f)
        count = num_parameters(config)
        if dtype == "float32":
            flat = np.fromfile(f, dtype="<f4", count=count).astype(np.float32, copy=False)
        else:
            flat = minitorch.bfloat16.decode(np.fromfile(f, dtype="<u2", count=count))
    params, offset = {}, 0
    for name, shape in parameter_shapes(config).items():
        n = int(np.prod(shape))
        params[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    return config, params


def write_checkpoint(
    path: str | os.PathLike, config: GPT2Config, params: Mapping[str, np.ndarray], dtype: str = "float32"
) -> Path:
    """Write ``params`` (exactly the ``PARAMETER_NAMES``, float32, shaped as ``parameter_shapes``)
    as an llm.c checkpoint of ``dtype``, atomically: "float32" (version 3) or "bfloat16" (version 5,
    the values rounded to nearest even). Returns the path written."""
    versions = {name: version for version, name in CHECKPOINT_VERSIONS.items()}
    if dtype not in versions:
        raise ValueError(f"an llm.c checkpoint's dtype is one of {sorted(versions)}, got {dtype!r}")
    shapes = parameter_shapes(config)
    missing = [name for name in PARAMETER_NAMES if name not in params]
    extra = sorted(set(params) - set(PARAMETER_NAMES))
    if missing or extra:
        raise ValueError(f"params must hold exactly PARAMETER_NAMES; missing {missing}, unexpected {extra}")
    for name, shape in shapes.items():
        value = params[name]
        if not isinstance(value, np.ndarray) or value.dtype != np.float32:
            kind = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
            raise ValueError(f"params[{name!r}] must be a float32 numpy array, got {kind}")
        if value.shape != shape:
            raise ValueError(f"params[{name!r}] has shape {value.shape}, expected {shape} for {config}")

    def encoded(value: np.ndarray) -> np.ndarray:
        if dtype == "float32":
            return np.ascontiguousarray(value, dtype="<f4")
        return np.ascontiguousarray(minitorch.bfloat16.encode(value), dtype="<u2")

    def write_body(f: BinaryIO) -> None:
        c = config
        f.write(_header_bytes(CHECKPOINT_MAGIC, versions[dtype], c.max_seq_len, c.vocab_size,
                              c.num_layers, c.num_heads, c.channels, c.padded_vocab_size))
        for name in PARAMETER_NAMES:
            f.write(memoryview(encoded(params[name])).cast("B"))

    return atomic_write(path, write_body)


# ----------------------------------------------------------------------------------------------
# Token shards

_SHARD = "llm.c token shard"


def shard_num_tokens(path: str | os.PathLike) -> int:
    """Number of tokens in a token shard, after checking its header against its size."""
    path = Path(path)
    with _open_for_reading(path, _SHARD) as f:
        header, size = _read_header(path, f, _SHARD, SHARD_MAGIC)
    if header[1] != SHARD_VERSION:
        raise LlmcFormatError(f"{path}: header[1] (version) is {header[1]}, expected {SHARD_VERSION}")
    count = int(header[2])
    if count <= 0:
        raise LlmcFormatError(f"{path}: header[2] (token count) is {count}; a shard needs at least 1 token")
    _check_size(path, _SHARD, size, count, "token", 2)
    return count


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """The tokens of a shard as a read-only uint16 array (memory-mapped, not loaded)."""
    count = shard_num_tokens(path)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


def write_shard(path: str | os.PathLike, tokens: Sequence[int] | np.ndarray) -> Path:
    """Write a 1-D sequence of integer token ids in 0..65535 as a token shard, atomically.
    Returns the path written."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {tokens.dtype}")
    if tokens.size > _INT32_MAX:
        raise ValueError(f"{tokens.size} tokens do not fit one shard (the header allows {_INT32_MAX})")
    bad = np.flatnonzero((tokens < 0) | (tokens > MAX_TOKEN_ID))
    if bad.size:
        raise ValueError(
            f"token {tokens[bad[0]]} at index {bad[0]} is outside 0..{MAX_TOKEN_ID} (uint16); "
            f"{bad.size} tokens out of range in all"
        )

    def write_body(f: BinaryIO) -> None:
        f.write(_header_bytes(SHARD_MAGIC, SHARD_VERSION, tokens.size))
        f.write(memoryview(np.ascontiguousarray(tokens, dtype="<u2")).cast("B"))

    return atomic_write(path, write_body)
