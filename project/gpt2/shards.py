"""Training batches from llm.c token shards (llmc.py's format), served as llm.c's DataLoader serves them."""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from project.gpt2.llmc import LlmcFormatError, read_shard, shard_num_tokens


def expand_shard_pattern(pattern: str | os.PathLike) -> list[Path]:
    """The files matching a glob pattern (``~`` expanded), sorted by name as llm.c's glob sorts
    them. Raises FileNotFoundError naming the pattern when nothing matches."""
    matches = sorted(p for p in glob.glob(os.path.expanduser(os.fspath(pattern))) if os.path.isfile(p))
    if not matches:
        raise FileNotFoundError(f"no token shards match the pattern {os.fspath(pattern)!r}")
    return [Path(p) for p in matches]


class ShardLoader:
    """Batches ``(inputs, targets)`` of shape ``[B, T]`` (int64) from token shards, the way
    llm.c's DataLoader serves them without shuffling.

    Each shard is cut into samples of ``B*T*num_processes`` tokens; within a sample, process
    ``r`` reads the ``B*T + 1`` tokens starting at ``r*B*T`` (inputs are the first ``B*T``,
    targets the last ``B*T``), so the processes' inputs are disjoint and together tile the
    sample. The tokens after a shard's last whole sample are skipped. After the last shard the
    loader starts over at the first (a new epoch).

    ``shards`` is a glob pattern or a sequence of paths (taken in the given order). Every shard's
    header is checked up front and must hold at least ``B*T*num_processes + 1`` tokens; with a
    ``vocab_size``, the tokens of a shard are checked to lie in ``[0, vocab_size)`` when the loader
    opens it (the first one at once), so a shard of another tokenizer fails with its name and the
    first token out of range. The position is ``shard_index``, ``sample_index``; ``paths``,
    ``shard_tokens``, ``shard_samples`` list the shards.
    """

    def __init__(
        self,
        shards: str | os.PathLike | Sequence[str | os.PathLike],
        batch_size: int,
        seq_len: int,
        process_rank: int = 0,
        num_processes: int = 1,
        vocab_size: int | None = None,
    ) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be positive, got {batch_size} and {seq_len}")
        if num_processes < 1 or not 0 <= process_rank < num_processes:
            raise ValueError(f"need 0 <= process_rank < num_processes, got {process_rank}, {num_processes}")
        if isinstance(shards, (str, os.PathLike)):
            self.paths = expand_shard_pattern(shards)
        else:
            self.paths = [Path(p) for p in shards]
            if not self.paths:
                raise ValueError("ShardLoader needs at least one shard")
        self.batch_size, self.seq_len, self.vocab_size = batch_size, seq_len, vocab_size
        self._in_vocab: set[int] = set()  # shards whose tokens were checked against vocab_size
        self.process_rank, self.num_processes = process_rank, num_processes
        self.sample_tokens = batch_size * seq_len * num_processes
        self.shard_tokens = [shard_num_tokens(p) for p in self.paths]
        for path, count in zip(self.paths, self.shard_tokens):
            if count < self.sample_tokens + 1:
                raise LlmcFormatError(
                    f"{path}: shard holds {count} tokens, fewer than one batch needs: "
                    f"B*T*num_processes + 1 = {batch_size}*{seq_len}*{num_processes} + 1 = "
                    f"{self.sample_tokens + 1}"
                )
        # The +1 target token of a sample may come from the next sample's range, never past the end.
        self.shard_samples = [(count - 1) // self.sample_tokens for count in self.shard_tokens]
        self.reset()

    @property
    def num_tokens(self) -> int:
        """Tokens in all shards together."""
        return sum(self.shard_tokens)

    @property
    def batches_per_epoch(self) -> int:
        """Batches ``next_batch`` serves before it returns to the first shard."""
        return sum(self.shard_samples)

    def reset(self) -> None:
        """Go back to the first batch of the first shard."""
        self._go_to(0, 0)

    def _go_to(self, shard_index: int, sample_index: int) -> None:
        # Only the current shard stays mapped, like llm.c's single open file.
        self.shard_index, self.sample_index = shard_index, sample_index
        self._tokens = read_shard(self.paths[shard_index])
        if self.vocab_size is not None and shard_index not in self._in_vocab:
            self._check_vocab(shard_index)

    def _check_vocab(self, shard_index: int) -> None:
        if int(self._tokens.max()) >= self.vocab_size:
            position = int(np.argmax(self._tokens >= self.vocab_size))
            raise LlmcFormatError(
                f"{self.paths[shard_index]}: token id {int(self._tokens[position])} at position {position} is outside "
                f"[0, {self.vocab_size}) (the model's vocab_size): the shards were made with another tokenizer"
            )
        self._in_vocab.add(shard_index)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next ``(inputs, targets)``, each ``[B, T]`` int64; targets are inputs shifted by one."""
        if self.sample_index >= self.shard_samples[self.shard_index]:
            self._go_to((self.shard_index + 1) % len(self.paths), 0)
        B, T = self.batch_size, self.seq_len
        start = self.sample_index * self.sample_tokens + self.process_rank * B * T
        window = np.asarray(self._tokens[start : start + B * T + 1], dtype=np.int64)
        self.sample_index += 1
        return window[:-1].reshape(B, T), window[1:].reshape(B, T)

    def state(self) -> dict[str, int]:
        """The position (shard and sample index) plus the geometry it is valid for; JSON-ready."""
        return {
            "shard_index": self.shard_index,
            "sample_index": self.sample_index,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "num_processes": self.num_processes,
            "num_shards": len(self.paths),
        }

    def load_state(self, state: Mapping[str, int]) -> None:
        """Resume at a position from ``state()``, so the next batch is the one that would have
        come next. A state saved with another ``batch_size`` or ``num_processes`` (another
        data-parallel split of the step) resumes at the same token of the shard, rounded up to
        this loader's next whole sample. Raises ValueError when the state was saved for another
        sequence length or shard set."""
        current = self.state()
        mismatched = {
            key: (state.get(key), current[key]) for key in ("seq_len", "num_shards") if state.get(key) != current[key]
        }
        if mismatched:
            raise ValueError(f"loader state does not fit this loader, (saved, current): {mismatched}")
        shard_index, sample_index = int(state["shard_index"]), int(state["sample_index"])
        saved_width = int(state["batch_size"]) * int(state.get("num_processes", 1))
        width = self.batch_size * self.num_processes
        if saved_width != width:
            sample_index = -(-sample_index * saved_width // width)
            if 0 <= shard_index < len(self.paths):
                sample_index = min(sample_index, self.shard_samples[shard_index])
        if not 0 <= shard_index < len(self.paths):
            raise ValueError(f"state shard_index {shard_index} is outside 0..{len(self.paths) - 1}")
        if not 0 <= sample_index <= self.shard_samples[shard_index]:
            raise ValueError(
                f"state sample_index {sample_index} is outside 0..{self.shard_samples[shard_index]} "
                f"for shard {self.paths[shard_index]}"
            )
        self._go_to(shard_index, sample_index)
