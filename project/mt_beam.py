"""Batched beam search for the translation program, on the KV-cached decoder (mt_decode.CachedDecoder).

A batch of B sentences keeps `beam_size` hypotheses each, as B * beam rows of one KVCache. Per step,
on the backend: log-softmax of the rows' logits, plus each row's running score, viewed as
[B, beam * V]; then the best 2 * beam candidates of every sentence by `top_k` (k rounds of a row max,
each removing the element it picked), so only [B, 2 * beam] values and indices come back to the host.
On the host (NumPy): a candidate ending in <eos_en> among a sentence's best `beam` becomes a
finished hypothesis, the others fill the next beams; the cache rows are then gathered in the order
of the surviving beams' parents. A sentence is done when it holds `beam` finished hypotheses and
its best live beam, length-normalized now, scores no better than the worst of them (or when its
sequence fills max_len); decoding stops early once every sentence is done.

Finished hypotheses are ranked by score / length ** length_penalty, where the score is the sum of
the token log-probabilities and the length counts the generated tokens (<eos_en> included); 0
ranks by raw score (favoring short outputs), 1 by the mean log-probability per token.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

import minitorch
from minitorch import DecoderLM, Tensor, TensorBackend, nn
from minitorch.fused.masks import NEG_BIG
from project.mt_data import EOS_EN_ID
from project.mt_decode import CachedDecoder, decode_in_batches

DEAD = -1e20  # score of an unused beam row: far below any real log-probability, far above NEG_BIG


def top_k(scores: Tensor, k: int, positions: Tensor) -> Tuple[np.ndarray, np.ndarray]:
    """(values, indices), each [B, k] on the host, of the k largest entries of every row of scores
    [B, M], best first; among equal values the largest index comes first.  positions: [1, M]
    holding 0 .. M-1 on the backend.  k rounds of: row max, the largest index holding it, and
    pushing that one entry to NEG_BIG."""
    B, M = scores.shape
    if not 1 <= k <= M:
        raise ValueError(f"top_k: k must be in [1, {M}] for scores of shape {scores.shape}, got {k}")
    values, indices = [], []
    x = scores
    for _ in range(k):
        best = x.max(1, keepdim=True)
        at = ((x == best) * positions).max(1, keepdim=True)
        values.append(best)
        indices.append(at)
        x = x + (positions == at) * NEG_BIG
    host_values = np.concatenate([v.to_numpy() for v in values], axis=1)
    host_indices = np.concatenate([i.to_numpy() for i in indices], axis=1).astype(np.int64)
    return host_values, host_indices


class Hypotheses:
    """The finished hypotheses of one sentence: the best `beam` by normalized score."""

    def __init__(self, beam: int, length_penalty: float):
        self.beam = beam
        self.length_penalty = length_penalty
        self.items: List[Tuple[float, np.ndarray]] = []

    def normalized(self, score: float, length: int) -> float:
        return score / float(length) ** self.length_penalty

    def add(self, tokens: np.ndarray, score: float) -> None:
        self.items.append((self.normalized(score, len(tokens)), tokens))
        self.items.sort(key=lambda item: -item[0])
        del self.items[self.beam :]

    def settled(self, best_live_score: float, length: int) -> bool:
        """Full, and the best live beam (its score now, at this length) cannot rank above the worst."""
        return len(self.items) >= self.beam and self.normalized(best_live_score, length) <= self.items[-1][0]

    def best(self) -> np.ndarray:
        return self.items[0][1]


def beam_search(
    model: DecoderLM,
    prompts: Sequence[np.ndarray],
    max_len: int,
    batch_size: int,
    backend: TensorBackend,
    beam_size: int = 4,
    length_penalty: float = 1.0,
) -> List[np.ndarray]:
    """The best hypothesis generated after each prompt (up to and including <eos_en>, or until the
    whole sequence reaches max_len), in the order of prompts.  batch_size counts sentences (each
    takes beam_size cache rows).  beam_size 1 is greedy decoding."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
    return decode_in_batches(
        model, prompts, batch_size,
        lambda batch: _search_batch(model, batch, max_len, backend, beam_size, length_penalty),
    )  # fmt: skip


def _search_batch(
    model: DecoderLM, prompts: Sequence[np.ndarray], max_len: int, backend: TensorBackend, beam: int,
    length_penalty: float,
) -> List[np.ndarray]:  # fmt: skip
    B, V = len(prompts), model.n_vocab
    decoder = CachedDecoder(model, prompts, max_len, backend)
    room = max_len - decoder.prompt_lengths  # tokens each sentence may generate (>= 1)
    finished = [Hypotheses(beam, length_penalty) for _ in range(B)]
    done = np.zeros(B, dtype=bool)
    # Step 0 has one row per sentence (every beam would be the same); later steps `beam` rows.
    live, tokens = 1, np.zeros((B, 0), dtype=np.int64)
    scores = np.zeros(B)
    column_ids = {}
    logits = decoder.start()
    for step in range(decoder.max_new):
        width = live * V
        if width not in column_ids:
            column_ids[width] = minitorch.tensor_from_numpy(np.arange(width)[None, :], backend=backend)
        row_scores = minitorch.tensor_from_numpy(scores.reshape(B * live, 1), backend=backend)
        candidates = (nn.logsoftmax(logits, 1) + row_scores).view(B, width)
        k = min(2 * beam, width)
        values, indices = top_k(candidates, k, column_ids[width])
        # Slots no candidate fills (and rows of done sentences) keep a row of their own sentence.
        sources = np.repeat(np.arange(B) * live, beam)
        next_tokens = np.full(B * beam, EOS_EN_ID, dtype=np.int64)
        next_scores = np.full(B * beam, DEAD)
        length = step + 1
        for b in np.flatnonzero(~done):
            kept = 0
            for rank in range(k):
                score = float(values[b, rank])
                if score <= DEAD / 2:
                    break
                parent, token = divmod(int(indices[b, rank]), V)
                row = b * live + parent
                if token == EOS_EN_ID:
                    if rank < beam:
                        finished[b].add(np.append(tokens[row], token), score)
                    continue
                slot = b * beam + kept
                sources[slot], next_tokens[slot], next_scores[slot] = row, token, score
                kept += 1
                if kept == beam:
                    break
            if length >= room[b]:  # the sequence is full: the live beams end here
                for slot in range(b * beam, b * beam + kept):
                    finished[b].add(np.append(tokens[sources[slot]], next_tokens[slot]), next_scores[slot])
                done[b] = True
            elif kept == 0 or finished[b].settled(next_scores[b * beam], length):
                done[b] = True
        if done.all():
            break
        decoder.reorder(sources)
        tokens = np.concatenate([tokens[sources], next_tokens[:, None]], axis=1)
        scores = np.where(np.repeat(done, beam), DEAD, next_scores)
        live = beam
        logits = decoder.step(next_tokens[:, None])
    return [hyps.best() for hyps in finished]
