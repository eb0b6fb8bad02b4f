"""Sequences and batches of the translation program: each pair becomes one sequence
``de <eos_de> en <eos_en>``; ``Batcher`` (training) and ``eval_batches`` (evaluation) produce padded
numpy batches whose loss weights select the English tokens and the final ``<eos_en>`` as the only
targets. Nothing here depends on minitorch: batches are numpy arrays.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from project.translation.corpus import Pair
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID, PAD_ID



@dataclass(frozen=True)
class EncodedPairs:
    """Token sequences ``de <eos_de> en <eos_en>`` (int64 arrays) and the number of pairs
    dropped because their sequence was longer than ``max_len``."""

    sequences: list[np.ndarray]
    n_dropped: int


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[Pair], max_len: int) -> EncodedPairs:
    """Encode each pair as ``de <eos_de> en <eos_en>``.

    ``max_len`` bounds the whole sequence, so the model sees at most ``max_len - 1`` input
    positions (inputs are the sequence without its last token). A pair that does not fit is
    dropped, not truncated: a cut German side or an English side without its ``<eos_en>``
    would teach wrong translations. The count is reported in ``n_dropped``.
    """
    if max_len < 3:
        raise ValueError(f"max_len must be at least 3, got {max_len}")
    de = tokenizer.encode_batch([pair[0] for pair in pairs], add_special_tokens=False)
    en = tokenizer.encode_batch([pair[1] for pair in pairs], add_special_tokens=False)
    sequences = []
    for de_enc, en_enc in zip(de, en):
        ids = de_enc.ids + [EOS_DE_ID] + en_enc.ids + [EOS_EN_ID]
        if len(ids) <= max_len:
            sequences.append(np.array(ids, dtype=np.int64))
    return EncodedPairs(sequences=sequences, n_dropped=len(pairs) - len(sequences))


@dataclass(frozen=True)
class Batch:
    """One padded batch. ``tokens[b, t]`` is the model input, ``targets[b, t]`` the token to
    predict there (the next one), and ``weights[b, t]`` is 1.0 exactly where that target is an
    English token or the final ``<eos_en>``, else 0.0 (German side, ``<eos_de>``, padding)."""

    tokens: np.ndarray
    targets: np.ndarray
    weights: np.ndarray

    @property
    def n_targets(self) -> int:
        """Number of weighted target tokens (for token-weighted loss averages)."""
        return int(self.weights.sum())


def _source_end(seq: np.ndarray, index: int) -> int:
    """Position of ``<eos_de>`` in a well-formed sequence ``de <eos_de> en <eos_en>``."""
    if seq.ndim != 1 or len(seq) < 2 or seq[-1] != EOS_EN_ID:
        raise ValueError(
            f"sequence {index} must be 1-D, at least 2 tokens long and end with <eos_en> "
            f"(id {EOS_EN_ID}); got {seq.tolist()}"
        )
    eos_de = np.flatnonzero(seq == EOS_DE_ID)
    if len(eos_de) != 1 or np.count_nonzero(seq == EOS_EN_ID) != 1 or PAD_ID in seq:
        raise ValueError(
            f"sequence {index} must hold exactly one <eos_de> (id {EOS_DE_ID}), one final "
            f"<eos_en> (id {EOS_EN_ID}) and no <pad> (id {PAD_ID}); got {seq.tolist()}"
        )
    return int(eos_de[0])


def make_batch(sequences: Sequence[Sequence[int]]) -> Batch:
    """Pad sequences ``de <eos_de> en <eos_en>`` into a Batch of width ``max(len) - 1``.

    For a sequence ``s`` of length L with ``<eos_de>`` at position k, row b holds
    ``tokens[b, :L-1] = s[:-1]``, ``targets[b, :L-1] = s[1:]`` and ``weights[b, k:L-1] = 1``:
    from the ``<eos_de>`` input on, every prediction is an English token or ``<eos_en>``.
    Positions past L-1 are ``<pad>`` in tokens and targets with weight 0; with right padding
    and causal attention, real positions never attend to them, so no padding mask is needed.
    """
    if not sequences:
        raise ValueError("cannot make a batch of zero sequences")
    arrays = [np.asarray(seq, dtype=np.int64) for seq in sequences]
    width = max(len(seq) for seq in arrays) - 1
    tokens = np.full((len(arrays), width), PAD_ID, dtype=np.int64)
    targets = np.full((len(arrays), width), PAD_ID, dtype=np.int64)
    weights = np.zeros((len(arrays), width), dtype=np.float32)
    for row, seq in enumerate(arrays):
        source_end = _source_end(seq, row)
        n = len(seq) - 1
        tokens[row, :n] = seq[:-1]
        targets[row, :n] = seq[1:]
        weights[row, source_end:n] = 1.0
    return Batch(tokens=tokens, targets=targets, weights=weights)


def eval_batches(sequences: Sequence[np.ndarray], batch_size: int) -> Iterator[Batch]:
    """Batches over all sequences in a fixed order (sorted by length, so little padding),
    for validation loss. Average with ``Batch.n_targets`` to get a per-token loss."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = np.argsort([len(seq) for seq in sequences], kind="stable")
    for start in range(0, len(order), batch_size):
        yield make_batch([sequences[i] for i in order[start : start + batch_size]])


class Batcher:
    """Shuffled training batches with a seeded, saveable RNG for exact resume.

    Each epoch draws a random permutation of the sequences and keeps its first
    ``samples_per_epoch`` (all by default, so a capped epoch sees a fresh random subset).
    Length bucketing: the permutation is cut into windows of ``bucket_batches * batch_size``
    sequences (times the group size of ``epoch_groups``: a window holds ``bucket_batches``
    steps), each window is sorted by length (ties stay in random order) and cut into
    batches, and the batches of the epoch are shuffled. Batches therefore hold sequences of
    similar length (little padding) yet remain random; ``bucket_batches=1`` disables it. The
    last batch of an epoch may be smaller than ``batch_size``.

    ``state_dict()`` may be taken at any time; a batch that ``epoch()`` has handed out counts
    as done. ``load_state_dict()`` on a Batcher built with the same sequences and settings makes
    its next ``epoch()`` continue exactly where the saved one stood.
    """

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        batch_size: int,
        *,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        bucket_batches: int = 50,
    ):
        if not sequences:
            raise ValueError("Batcher needs at least one sequence")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if bucket_batches < 1:
            raise ValueError(f"bucket_batches must be positive, got {bucket_batches}")
        if samples_per_epoch is None:
            samples_per_epoch = len(sequences)
        if not 1 <= samples_per_epoch <= len(sequences):
            raise ValueError(
                f"samples_per_epoch must be between 1 and the {len(sequences)} available "
                f"sequences, got {samples_per_epoch}"
            )
        self.sequences = list(sequences)
        self.batch_size = batch_size
        self.samples_per_epoch = samples_per_epoch
        self.bucket_batches = bucket_batches
        self._lengths = np.array([len(seq) for seq in self.sequences])
        self._rng = np.random.default_rng(seed)
        self._epoch_start_state: dict | None = None
        self._batches_done = 0
        self._resume_skip = 0
        self._epoch_group_size = 1
        self._resume_group_size: int | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self.samples_per_epoch // self.batch_size)

    def _draw_epoch(self, group_size: int) -> list[list[np.ndarray]]:
        # Each window of bucket_batches steps (group_size batches each) is sorted by length and cut
        # into batches; runs of group_size neighbouring batches, of similar lengths, stay together
        # as one data-parallel step, and the epoch shuffles these groups (with group_size 1: the
        # batches).  A window counts steps, not batches, so the lengths of a step's neighbouring
        # batches differ as little with N processes as a batch's own lengths on one.  A step lasts
        # as long as its longest batch: in the default translation run (2 processes, padded tokens
        # of an epoch) the longest batch of a step is 3.9% above the step's mean with a window of
        # bucket_batches batches, 1.8% with this one.
        chosen = self._rng.permutation(len(self.sequences))[: self.samples_per_epoch]
        window = self.batch_size * group_size * self.bucket_batches
        groups = []
        for start in range(0, len(chosen), window):
            bucket = chosen[start : start + window]
            bucket = bucket[np.argsort(self._lengths[bucket], kind="stable")]
            batches = [bucket[i : i + self.batch_size] for i in range(0, len(bucket), self.batch_size)]
            groups.extend(batches[i : i + group_size] for i in range(0, len(batches), group_size))
        return [groups[g] for g in self._rng.permutation(len(groups))]

    def epoch(self) -> Iterator[Batch]:
        """The batches of the next epoch (drawn now, built lazily as they are consumed)."""
        return (make_batch([self.sequences[i] for i in indices]) for (indices,) in self.epoch_groups(1))

    def epoch_groups(self, size: int) -> Iterator[list[np.ndarray]]:
        """The next epoch's batches (drawn now) as arrays of sequence indices, in groups of ``size``
        (a group may be smaller at the end of the epoch's last length window): one batch for each
        of the ``size`` processes of a data-parallel step, neighbours in length so that no process
        waits long for another.  A group counts as handed out as a whole, so the state is the same
        in every process; a run resumed with another group size finishes the epoch in the order it
        was drawn in (cut into groups of the new size) and draws the next ones for it."""
        if size < 1:
            raise ValueError(f"group size must be positive, got {size}")
        self._epoch_start_state = copy.deepcopy(self._rng.bit_generator.state)
        drawn_size, self._resume_group_size = self._resume_group_size or size, None
        self._epoch_group_size = drawn_size
        groups, skip = [], self._resume_skip
        for group in self._draw_epoch(drawn_size):
            if skip < len(group):
                groups.append(group[skip:])
            skip = max(0, skip - len(group))
        if drawn_size != size:
            flat = [batch for group in groups for batch in group]
            groups = [flat[i : i + size] for i in range(0, len(flat), size)]
        self._batches_done, self._resume_skip = self._resume_skip, 0
        return self._iterate(groups)

    def _iterate(self, groups: list[list[np.ndarray]]) -> Iterator[list[np.ndarray]]:
        for group in groups:
            self._batches_done += len(group)
            yield group
        self._epoch_start_state = None
        self._batches_done = 0

    def _config(self) -> dict:
        return {
            "n_sequences": len(self.sequences),
            "batch_size": self.batch_size,
            "samples_per_epoch": self.samples_per_epoch,
            "bucket_batches": self.bucket_batches,
        }

    def state_dict(self) -> dict:
        """A JSON- and pickle-friendly snapshot: the RNG state at the start of the current
        epoch (or now, between epochs), the batches already handed out, and the settings. A
        Batcher restored from a snapshot gives that snapshot back until its next epoch() starts."""
        in_epoch = self._epoch_start_state is not None
        rng_state = self._epoch_start_state if in_epoch else self._rng.bit_generator.state
        return {
            "rng_state": copy.deepcopy(rng_state),
            "batches_done": self._batches_done if in_epoch else self._resume_skip,
            "group_size": self._epoch_group_size if in_epoch else self._resume_group_size or 1,
            **self._config(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a snapshot from ``state_dict()``; the settings must match this Batcher."""
        saved = {key: state[key] for key in self._config()}
        if saved != self._config():
            raise ValueError(
                f"Batcher state was saved with {saved} but this Batcher has {self._config()}"
            )
        self._rng.bit_generator.state = copy.deepcopy(state["rng_state"])
        self._resume_skip = int(state["batches_done"])
        self._resume_group_size = int(state.get("group_size", 1)) if self._resume_skip else None
        self._epoch_start_state = None
        self._batches_done = 0


