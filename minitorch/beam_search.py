"""BeamState: batched beam search's bookkeeping, held in tensors on the decoding backend.

B sentences keep `beam` hypotheses each, rows b * beam .. b * beam + beam - 1 of the decoder.  A step
gives the best `candidates` continuations of every sentence (values and indices of its [beam * V]
scores, best first, index = parent beam * V + token: minitorch.fused.topk); `step` then, for each
sentence, walks them in order:

- a score <= dead / 2 ends the list; an <eos> among the first `beam` ranks becomes a finished
  hypothesis, later <eos>s are skipped; the others continue, until `beam` of them do;
- slots that no candidate fills keep the sentence's first row, token <eos> and score `dead`;
- the sentence is done when its sequence is full (`room` tokens: its live beams then finish too),
  when nothing continues, or when it holds `beam` finished hypotheses and its best live beam,
  normalized at this length, ranks no better than the worst of them; a done sentence's rows get
  score `dead` and it changes no more;
- finished hypotheses are ranked by score / length ** length_penalty (score: the sum of the token
  log-probabilities; length: the tokens generated, <eos> included), a new one after those it ties,
  the best `beam` kept.

Everything stays on the backend: the scores, the next tokens (`tokens`, the next step's input) and
the rows they continue (`sources`, for reordering the KV cache), a step counter, and per step the
sources and tokens (`history`), from which `best_tokens` rebuilds the hypotheses at the end.  So
on CUDA a step is kernels only (hook `beam_search_step`, src/beam_search_kernel.cu) and a decoding
step that includes it can be replayed from a CUDA graph; `all_done()` is the one read a caller
needs, every few steps.  Other backends run `_reference_step`, the same walk in NumPy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Sequence

import numpy as np

from .tensor_ops import hook

if TYPE_CHECKING:
    from .tensor import Tensor

DEAD = -1e20  # score of an unused row: far below any real log-probability, far above NEG_BIG
ITEM = 4  # a finished hypothesis: score, step, row (the row it extends, at that step), token


class BeamState:
    """The state of beam search over `sentences` x `beam` rows with `vocab` tokens, for up to
    `max_steps` steps; tensors on like's backend, made once and reused by reset() (a CUDA graph
    keeps their addresses).

    scores, tokens, sources [rows]; done, room, finished_count [sentences]; step [1];
    history [max_steps, 2, rows] (the sources, then the tokens, of each step);
    finished [sentences, beam, 4] (score, step, row, token of each hypothesis, best first).
    """

    def __init__(
        self, like: "Tensor", sentences: int, beam: int, vocab: int, max_steps: int, eos: int,
        length_penalty: float = 1.0,
    ):  # fmt: skip
        if sentences < 1 or beam < 1 or max_steps < 1 or not 0 <= eos < vocab:
            raise ValueError(
                f"BeamState needs sentences, beam, max_steps >= 1 and eos in [0, vocab), got {sentences}, {beam}, "
                f"{max_steps}, eos {eos} of vocab {vocab}"
            )
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
        self.sentences, self.beam, self.vocab, self.max_steps = sentences, beam, vocab, max_steps
        self.eos, self.length_penalty, self.dead = eos, float(length_penalty), DEAD
        self.rows = sentences * beam
        self.candidates = min(2 * beam, beam * vocab)
        self.scores = like.zeros((self.rows,))
        self.tokens = like.zeros((self.rows,))
        self.sources = like.zeros((self.rows,))
        self.done = like.zeros((sentences,))
        self.room = like.zeros((sentences,))
        self.step_counter = like.zeros((1,))
        self.history = like.zeros((max_steps, 2, self.rows))
        self.finished = like.zeros((sentences, beam, ITEM))
        self.finished_count = like.zeros((sentences,))

    def reset(self, room: Sequence[int]) -> None:
        """Start a search: room[b] tokens may follow sentence b's prompt; every row of a sentence
        holds the same prompt, and only its first row is live (the others score `dead`), so the
        first step's candidates are one row's."""
        room = np.asarray(room, dtype=np.float32)
        if room.shape != (self.sentences,) or (room < 1).any():
            raise ValueError(f"BeamState.reset needs room [{self.sentences}] of counts >= 1, got {room}")
        first = np.full((self.sentences, self.beam), DEAD, dtype=np.float32)
        first[:, 0] = 0.0
        self.scores.copy_(first.reshape(-1))
        self.room.copy_(room)
        for buffer in (self.done, self.finished_count, self.step_counter):
            buffer.copy_(0.0)

    def step(self, values: "Tensor", indices: "Tensor") -> None:
        """One step from the candidates values, indices [sentences, candidates]: updates scores, tokens,
        sources, done, the finished hypotheses and the history, and advances the step counter."""
        if values.shape != (self.sentences, self.candidates) or indices.shape != values.shape:
            raise ValueError(
                f"BeamState.step expects values and indices [{self.sentences}, {self.candidates}], got {values.shape} "
                f"and {indices.shape}"
            )
        kernel = hook(self.scores.backend.ops, "beam_search_step")
        if kernel is None:
            _reference_step(self, values.to_numpy(), indices.to_numpy())
        else:
            kernel(
                values._tensor, indices._tensor, self.step_counter._tensor, self.room._tensor, self.scores._tensor,
                self.tokens._tensor, self.sources._tensor, self.done._tensor, self.history._tensor,
                self.finished._tensor, self.finished_count._tensor, self.beam, self.vocab, self.eos, self.dead,
                self.length_penalty,
            )  # fmt: skip
        self.step_counter.copy_(self.step_counter + 1.0)

    def all_done(self) -> bool:
        """Whether every sentence is done (a read from the backend)."""
        return bool((self.done.to_numpy() != 0).all())

    def best_tokens(self) -> List[np.ndarray]:
        """Each sentence's best finished hypothesis (tokens after the prompt, <eos> included when it
        ended so), rebuilt from the history; empty for a sentence without one."""
        finished = self.finished.to_numpy().reshape(self.sentences, self.beam, ITEM)[:, 0].astype(np.int64)
        count = self.finished_count.to_numpy()
        history = self.history.to_numpy().astype(np.int64)
        steps, rows = finished[:, 1], finished[:, 2].copy()
        tokens = np.zeros((self.sentences, int(steps.max()) + 1), dtype=np.int64)
        tokens[np.arange(self.sentences), steps] = finished[:, 3]
        for s in range(int(steps.max()) - 1, -1, -1):
            going = np.flatnonzero(steps > s)
            tokens[going, s] = history[s, 1, rows[going]]
            rows[going] = history[s, 0, rows[going]]
        return [tokens[b, : steps[b] + 1].copy() if count[b] > 0 else np.zeros(0, dtype=np.int64)
                for b in range(self.sentences)]  # fmt: skip


def _normalized(score: float, length: int, length_penalty: float) -> float:
    return score / float(length) ** length_penalty


def _reference_step(state: BeamState, values: np.ndarray, indices: np.ndarray) -> None:
    """BeamState.step in NumPy (backends without the kernel), with the kernel's decisions."""
    s = state
    step = int(s.step_counter.to_numpy()[0])
    if not 0 <= step < s.max_steps:
        return
    length, K = step + 1, s.beam
    scores, tokens, sources = (t.to_numpy().astype(np.float64) for t in (s.scores, s.tokens, s.sources))
    done, room, count = s.done.to_numpy() != 0, s.room.to_numpy(), s.finished_count.to_numpy().astype(np.int64)
    finished = s.finished.to_numpy().reshape(s.sentences, K, ITEM).astype(np.float64)
    history = s.history.to_numpy().reshape(s.max_steps, 2, s.rows).copy()

    def add(b: int, score: float, row: int, token: int) -> None:
        value = _normalized(score, length, s.length_penalty)
        n = int(count[b])
        pos = 0
        while pos < n and _normalized(finished[b, pos, 0], int(finished[b, pos, 1]) + 1, s.length_penalty) >= value:
            pos += 1
        if pos < K:
            finished[b, pos + 1 : min(n + 1, K)] = finished[b, pos : min(n, K - 1)]
            finished[b, pos] = (score, step, row, token)
            count[b] = min(n + 1, K)

    for b in range(s.sentences):
        base, kept = b * K, 0
        if not done[b]:
            for rank in range(values.shape[1]):
                score = float(values[b, rank])
                if score <= DEAD / 2:
                    break
                parent, token = divmod(int(indices[b, rank]), s.vocab)
                if token == s.eos:
                    if rank < K:
                        add(b, score, base + parent, token)
                    continue
                sources[base + kept], tokens[base + kept], scores[base + kept] = base + parent, token, score
                kept += 1
                if kept == K:
                    break
        sources[base + kept : base + K], tokens[base + kept : base + K], scores[base + kept : base + K] = base, s.eos, DEAD
        if not done[b]:
            if length >= room[b]:  # the sequence is full: the live beams end here
                for slot in range(base, base + kept):
                    add(b, scores[slot], int(sources[slot]), int(tokens[slot]))
                done[b] = True
            elif kept == 0:
                done[b] = True
            elif count[b] >= K:
                worst = _normalized(finished[b, K - 1, 0], int(finished[b, K - 1, 1]) + 1, s.length_penalty)
                done[b] = _normalized(scores[base], length, s.length_penalty) <= worst
        if done[b]:
            scores[base : base + K] = DEAD
    history[step, 0], history[step, 1] = sources, tokens
    for tensor, array in ((s.scores, scores), (s.tokens, tokens), (s.sources, sources), (s.done, done),
                          (s.finished_count, count), (s.finished, finished), (s.history, history)):  # fmt: skip
        tensor.copy_(np.asarray(array, dtype=np.float32).reshape(tensor.shape))
