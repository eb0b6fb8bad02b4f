"""Greedy decoding and BLEU for the translation program.

Decoding is batched across sentences: prompts are sorted by length so a batch holds similar
lengths. `greedy_decode` runs the model with a KV cache (CachedDecoder): the batch's prompts,
left-padded, go through the model once, then each step feeds one token per row, so a step costs
one position instead of the whole prefix. `greedy_decode_recompute` is the decoder without a
cache, kept as the reference the cached one is tested and benchmarked against: each step re-runs
the model on the active rows' growing buffer [A, W] (right-padded) and reads every row's own last
position. Both take the argmax on the backend (one [rows] vector of ids comes back per step); a
row ends at <eos_en> or when its sequence fills max_len.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Sequence, Tuple

import numpy as np
import sacrebleu

import minitorch
from minitorch import DecoderLM, Tensor, TensorBackend, nn
from project.mt_data import EOS_EN_ID, PAD_ID, pad_prompts


def argmax_ids(logits: Tensor, vocab_ids: Tensor) -> Tensor:
    """[rows, 1] id of each row's largest logit (the largest index among exact ties), on the backend.
    vocab_ids: [1, V] holding 0 .. V-1."""
    return (nn.argmax(logits, 1) * vocab_ids).max(1, keepdim=True)


def vocab_range(model: DecoderLM, backend: TensorBackend) -> Tensor:
    """[1, V] holding 0 .. V-1 on the backend (see argmax_ids)."""
    return minitorch.tensor_from_numpy(np.arange(model.n_vocab)[None, :], backend=backend)


def left_pad(prompts: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """(ids [B, P] with each prompt at the right end after <pad>s, pads [B] counts of <pad>)."""
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    ids = np.full((len(prompts), int(lengths.max())), PAD_ID, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, ids.shape[1] - len(prompt) :] = prompt
    return ids, ids.shape[1] - lengths


class CachedDecoder:
    """A DecoderLM stepping through a batch of prompts with a KVCache.

    start() runs the left-padded prompts and returns the logits [rows, V] that follow them; step(t)
    feeds one token per row and returns the next logits. Every row advances together; rows that
    have ended are fed along with the rest and their outputs ignored (their positions stop at the
    model's last one). reorder(sources) makes row r continue row sources[r] (beam search).
    """

    def __init__(self, model: DecoderLM, prompts: Sequence[np.ndarray], max_len: int, backend: TensorBackend):
        if not prompts:
            raise ValueError("CachedDecoder needs at least one prompt")
        self.model = model
        self.backend = backend
        self.ids, pads = left_pad(prompts)
        self.prompt_lengths = self.ids.shape[1] - pads
        if self.prompt_lengths.max() >= max_len:
            raise ValueError(
                f"a prompt of {self.prompt_lengths.max()} tokens leaves no room to generate within max_len {max_len}"
            )
        # The row with the shortest prompt generates max_len - its length tokens and feeds all but the last.
        self.max_new = max_len - int(self.prompt_lengths.min())
        like = minitorch.zeros((1,), backend=backend)
        self.cache = model.new_cache(like, len(prompts), self.ids.shape[1] + self.max_new, pads)

    def _logits(self, ids: np.ndarray | Tensor) -> Tensor:
        tokens = ids if isinstance(ids, Tensor) else minitorch.tensor_from_numpy(ids, backend=self.backend)
        rows, T = tokens.shape
        positions = np.minimum(self.cache.positions(T), self.model.n_positions - 1)
        hidden = self.model.hidden_states(tokens, cache=self.cache, positions=positions)
        return self.model.lm_head(hidden.view(rows, self.model.n_embd))

    def start(self) -> Tensor:
        """Run the prompts; the logits [rows, V] of the first generated token."""
        if self.ids.shape[1] > 1:
            ids = self.ids[:, :-1]
            tokens = minitorch.tensor_from_numpy(ids, backend=self.backend)
            self.model.hidden_states(tokens, cache=self.cache, positions=self.cache.positions(ids.shape[1]))
        return self._logits(self.ids[:, -1:])

    def step(self, tokens: np.ndarray | Tensor) -> Tensor:
        """Feed tokens [rows, 1] (ids, host or backend); the logits [rows, V] of the next token."""
        return self._logits(tokens)

    def reorder(self, sources: np.ndarray) -> None:
        """Row r continues row sources[r]; len(sources) becomes the number of rows."""
        self.cache.reorder(sources)
        self.prompt_lengths = self.prompt_lengths[sources]


def decode_in_batches(
    model: DecoderLM,
    prompts: Sequence[np.ndarray],
    batch_size: int,
    decode_batch: Callable[[List[np.ndarray]], List[np.ndarray]],
) -> List[np.ndarray]:
    """decode_batch over batches of up to batch_size prompts sorted by length, in eval mode without
    gradients (the model's mode is restored); its outputs in the order of prompts."""
    was_training = model.training
    model.eval()
    generated: List[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    try:
        with minitorch.no_grad():
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                for index, tokens in zip(chunk, decode_batch([prompts[i] for i in chunk])):
                    generated[index] = tokens
    finally:
        if was_training:
            model.train()
    return generated


def greedy_decode(
    model: DecoderLM, prompts: Sequence[np.ndarray], max_len: int, batch_size: int, backend: TensorBackend
) -> List[np.ndarray]:
    """The tokens generated after each prompt (up to and including <eos_en>, or until the whole
    sequence reaches max_len), in the order of prompts; KV-cached."""
    vocab_ids = vocab_range(model, backend)

    def decode_batch(batch: List[np.ndarray]) -> List[np.ndarray]:
        decoder = CachedDecoder(model, batch, max_len, backend)
        tokens = np.zeros((len(batch), decoder.max_new), dtype=np.int64)
        n_new = np.zeros(len(batch), dtype=np.int64)
        active = np.ones(len(batch), dtype=bool)
        logits = decoder.start()
        for step in range(decoder.max_new):
            ids = argmax_ids(logits, vocab_ids)
            picked = ids.to_numpy().reshape(-1).astype(np.int64)
            tokens[active, step] = picked[active]
            n_new[active] += 1
            active &= (picked != EOS_EN_ID) & (decoder.prompt_lengths + n_new < max_len)
            if not active.any():
                break
            logits = decoder.step(ids)
        return [tokens[row, : n_new[row]].copy() for row in range(len(batch))]

    return decode_in_batches(model, prompts, batch_size, decode_batch)


def greedy_decode_recompute(
    model: DecoderLM, prompts: Sequence[np.ndarray], max_len: int, batch_size: int, backend: TensorBackend
) -> List[np.ndarray]:
    """greedy_decode without a cache: every step re-runs the model on the whole prefix."""
    vocab_ids = vocab_range(model, backend)

    def decode_batch(batch: List[np.ndarray]) -> List[np.ndarray]:
        prompt_ids, lengths = pad_prompts(batch)
        prompt_lengths = lengths.copy()
        ids = np.full((len(batch), max_len), PAD_ID, dtype=np.int64)
        ids[:, : prompt_ids.shape[1]] = prompt_ids
        active = np.flatnonzero(lengths < max_len)
        while active.size:
            A, W = active.size, int(lengths[active].max())
            hidden = model.hidden_states(minitorch.tensor_from_numpy(ids[active, :W], backend=backend))
            last = np.zeros((A, W, 1), dtype=np.float32)
            last[np.arange(A), lengths[active] - 1] = 1.0
            picked = (hidden * minitorch.tensor_from_numpy(last, backend=backend)).sum(1)
            logits = model.lm_head(picked.view(A, model.n_embd))
            next_ids = argmax_ids(logits, vocab_ids).to_numpy().reshape(A).astype(np.int64)
            ids[active, lengths[active]] = next_ids
            lengths[active] += 1
            active = active[(next_ids != EOS_EN_ID) & (lengths[active] < max_len)]
        return [ids[row, prompt_lengths[row] : lengths[row]].copy() for row in range(len(batch))]

    return decode_in_batches(model, prompts, batch_size, decode_batch)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacrebleu corpus BLEU (default 13a tokenization, cased) of detokenized text."""
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def write_translations(path: Path, sources: Sequence[str], references: Sequence[str], hypotheses: Sequence[str]) -> None:
    """Source, reference and model output of every decoded sentence, one block each."""
    with open(path, "w", encoding="utf-8") as f:
        for i, (src, ref, hyp) in enumerate(zip(sources, references, hypotheses)):
            f.write(f"[{i}]\nsrc: {src}\nref: {ref}\nhyp: {hyp}\n\n")
