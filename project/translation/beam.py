"""Batched beam search for the translation program, on the KV-cached decoder (decode.CachedDecoder).

A batch of B sentences keeps `beam_size` hypotheses each, as B * beam rows of one KVCache (every
row starts from its sentence's prompt; only the first is live at the first step).  Per step, on the
backend: log-softmax of the rows' logits plus each row's running score, viewed as [B, beam * V];
the best 2 * beam candidates of every sentence (minitorch.fused.topk); the bookkeeping of
minitorch.beam_search.BeamState (finished hypotheses, the next beams, which sentences are done);
and the cache rows gathered in the order of the next beams' parents.  A sentence is done when it
holds `beam` finished hypotheses and its best live beam, length-normalized now, scores no better
than the worst of them (or when its sequence fills max_len); the host reads whether every sentence
is done every CHECK_EVERY steps, and the hypotheses once at the end.  Nothing else crosses to the
host, so on CUDA a step is captured once per attention width (and cache buffer set) in a CUDA
graph and replayed.

Finished hypotheses are ranked by score / length ** length_penalty, where the score is the sum of
the token log-probabilities and the length counts the generated tokens (<eos_en> included); 0
ranks by raw score (favoring short outputs), 1 by the mean log-probability per token.
"""

from __future__ import annotations

from functools import partial
from typing import List, Sequence

import numpy as np

from minitorch import DecoderLM, Tensor, TensorBackend, nn
from minitorch.beam_search import BeamState
from minitorch.fused.topk import top_k
from project.translation.tokenizer import EOS_EN_ID
from project.translation.decode import CHECK_EVERY, CachedDecoder, decode_in_batches, fill_rows


class BeamDecoder:
    """Beam search (see the module docstring); call it with prompts and a batch size counting
    sentences (each takes beam_size cache rows).  beam_size 1 is greedy decoding.  Like
    GreedyDecoder it keeps its caches and CUDA graphs for later calls (valid while the model's
    parameters are updated in place) and, with graphs, fills batches up to batch_size sentences."""

    def __init__(
        self, model: DecoderLM, max_len: int, backend: TensorBackend, beam_size: int = 4,
        length_penalty: float = 1.0, use_graphs: bool = True,
    ):  # fmt: skip
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
        self.decoder = CachedDecoder(model, max_len, backend, use_graphs)
        self.beam_size, self.length_penalty = beam_size, length_penalty
        self.steps = 0

    def __call__(self, prompts: Sequence[np.ndarray], batch_size: int, progress: str = "") -> List[np.ndarray]:
        """The best hypothesis generated after each prompt (up to and including <eos_en>, or until the
        whole sequence reaches max_len), in the order of prompts; progress: see decode_in_batches."""
        search = partial(self._search, batch_size=batch_size)
        return decode_in_batches(self.decoder.model, prompts, batch_size, search, progress)

    def _search(self, batch: List[np.ndarray], batch_size: int) -> List[np.ndarray]:
        d, K = self.decoder, self.beam_size
        sentences = fill_rows(batch, batch_size) if d.use_graphs else batch
        logits = d.start([prompt for prompt in sentences for _ in range(K)])
        state = d.keep("beam", lambda: BeamState(
            logits, len(sentences), K, d.model.n_vocab, d.cache.capacity, EOS_EN_ID, self.length_penalty))  # fmt: skip
        state.reset(d.max_len - d.prompt_lengths[::K])
        self._select(state, logits, d.width(0))
        steps = 1
        while steps < d.max_new:
            if steps % CHECK_EVERY == 0 and state.all_done():
                break
            width, parity = d.width(steps), steps % 2
            d.run_step((width, parity), lambda: self._step(state, width, parity))
            steps += 1
        self.steps += steps
        return state.best_tokens()[: len(batch)]

    def _step(self, state: BeamState, width: int, parity: int) -> None:
        """Feed the beams' tokens (the cache's rows are in buffer set `parity`), then select."""
        self.decoder.cache.set_parity(parity)
        logits = self.decoder.feed(state.tokens.view(state.rows, 1), width)
        self._select(state, logits, width)

    def _select(self, state: BeamState, logits: Tensor, width: int) -> None:
        """Candidates, bookkeeping, and the cache rows reordered to the next beams' parents."""
        scores = nn.logsoftmax(logits, 1) + state.scores.view(state.rows, 1)
        values, indices = top_k(scores.view(state.sentences, state.beam * state.vocab), state.candidates)
        state.step(values, indices)
        self.decoder.cache.reorder_rows(state.sources, width)


def beam_search(
    model: DecoderLM,
    prompts: Sequence[np.ndarray],
    max_len: int,
    batch_size: int,
    backend: TensorBackend,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    use_graphs: bool = True,
) -> List[np.ndarray]:
    """The best hypothesis generated after each prompt, in the order of prompts (one call of a
    BeamDecoder); batch_size counts sentences."""
    return BeamDecoder(model, max_len, backend, beam_size, length_penalty, use_graphs)(prompts, batch_size)
