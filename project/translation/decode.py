"""Greedy decoding and BLEU for the translation program.

Decoding is batched across sentences: prompts are sorted by length so a batch holds similar
lengths. `GreedyDecoder` (and `greedy_decode`, one call of a fresh one) runs the model with a KV
cache (CachedDecoder): the batch's prompts, left-padded, go through the model once, then each step
feeds one token per row, so a step costs one position instead of the whole prefix. Everything a
step changes stays on the backend (the cache's slot, the argmax, the next input, the generated
tokens, which rows have ended), so on CUDA a step is captured once per attention width in a CUDA
graph and replayed: one launch per step instead of ~100 Python-dispatched kernels. The host reads
the rows' ended flags every CHECK_EVERY steps and the tokens once at the end. A row ends at
<eos_en> or when its sequence fills max_len; the argmax takes the largest index among exact ties.

`greedy_decode_recompute` is the decoder without a cache, kept as the reference the cached one is
tested and benchmarked against: each step re-runs the model on the active rows' growing buffer
[A, W] (right-padded), reads every row's own last position and brings the argmax to the host.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

import numpy as np
import sacrebleu
from tqdm import tqdm

import minitorch
from minitorch import DecoderLM, KVCache, Tensor, TensorBackend
from minitorch.graphs import StepGraphs
from minitorch.fused.device_indexed import write_slot
from minitorch.fused.topk import top_k
from project.translation.tokenizer import EOS_EN_ID, PAD_ID

CHECK_EVERY = 8  # decoding steps between the host's reads of which rows have ended
WIDTH_STEP = 16  # attention widths of cached steps are multiples of this: one CUDA graph each
CAPACITY_STEP = 32  # cache capacities round up to this, so batches of similar prompts share a cache
KEEP_CACHES = 4  # caches (with their graphs and buffers) a CachedDecoder keeps for later batches


def argmax_ids(logits: Tensor) -> Tensor:
    """[rows, 1] id of each row's largest logit (the largest index among exact ties), on the backend
    (fused.topk with k = 1: one pass over the logits on CUDA)."""
    return top_k(logits, 1)[1]


def left_pad(prompts: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """(ids [B, P] with each prompt at the right end after <pad>s, pads [B] counts of <pad>)."""
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    ids = np.full((len(prompts), int(lengths.max())), PAD_ID, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, ids.shape[1] - len(prompt) :] = prompt
    return ids, ids.shape[1] - lengths


def pad_prompts(prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad prompts with ``<pad>`` into ``ids [B, T]`` and return ``lengths [B]``.

    Batched greedy decoding with a causal model: at each step feed the buffer, read row b's
    logits at position ``lengths[b] - 1``, write the chosen token at ``lengths[b]`` (widening
    the buffer as needed) and increment ``lengths[b]``. Everything left of a row's position is
    real, so the padding to its right is never attended to.
    """
    if not prompts:
        raise ValueError("cannot pad zero prompts")
    lengths = np.array([len(prompt) for prompt in prompts], dtype=np.int64)
    ids = np.full((len(prompts), int(lengths.max())), PAD_ID, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    return ids, lengths


def fill_rows(prompts: Sequence[np.ndarray], rows: int) -> List[np.ndarray]:
    """prompts followed by copies of the last one up to `rows` (a copy decodes like its original, so
    the step count does not change; its outputs are dropped)."""
    return list(prompts) + [prompts[-1]] * (rows - len(prompts))


class _CacheSet:
    """A KVCache with the CUDA graphs captured on it and the step buffers they use."""

    def __init__(self, model: DecoderLM, like: Tensor, rows: int, capacity: int, use_graphs: bool):
        self.cache: KVCache = model.new_cache(like, rows, capacity)
        self.graphs = StepGraphs(use_graphs)
        self.kept: Dict[str, Any] = {}


class CachedDecoder:
    """A DecoderLM stepping through batches of prompts with a KV cache in device-slot mode.

    start(prompts) runs the left-padded prompts and returns the logits [rows, V] that follow them;
    feed(ids, width) feeds one token per row (ids [rows, 1] on the backend) at the cache's device slot,
    attending over `width` slots (width(step) for decoding step `step`), and returns the next logits.
    Every row advances together; rows that have ended are fed along with the rest and their outputs
    ignored (their positions stop at the model's last one). run_step(key, step) runs a decoding
    step through the current cache's CUDA graphs (use_graphs, on CUDA) or eagerly; keep(name, make)
    holds a step buffer per cache. Caches are reused by later batches of the same rows and capacity.
    """

    def __init__(self, model: DecoderLM, max_len: int, backend: TensorBackend, use_graphs: bool = True):
        self.model, self.max_len, self.backend = model, max_len, backend
        self.use_graphs = use_graphs and backend.cuda
        self._like = minitorch.zeros((1,), backend=backend)
        self._sets: "OrderedDict[Tuple[int, int], _CacheSet]" = OrderedDict()
        self.counts = {"eager": 0, "replayed": 0}  # decoding steps after the first, by how they ran

    def start(self, prompts: Sequence[np.ndarray]) -> Tensor:
        """Run the prompts; the logits [rows, V] of the first generated token."""
        if not prompts:
            raise ValueError("CachedDecoder needs at least one prompt")
        ids, pads = left_pad(prompts)
        self.prompt_lengths = ids.shape[1] - pads
        if self.prompt_lengths.max() >= self.max_len:
            raise ValueError(
                f"a prompt of {self.prompt_lengths.max()} tokens leaves no room to generate within max_len {self.max_len}"
            )
        # The row with the shortest prompt generates max_len - its length tokens and feeds all but the last.
        self.prompt_width, self.max_new = ids.shape[1], self.max_len - int(self.prompt_lengths.min())
        self.rows = len(prompts)
        capacity = -(-(self.prompt_width + self.max_new) // CAPACITY_STEP) * CAPACITY_STEP
        self.cache_set = self._cache_set(self.rows, capacity)
        self.cache = self.cache_set.cache
        self.cache.reset(pads)
        P = ids.shape[1]
        hidden = self.model.hidden_states(self._ids(ids), cache=self.cache, positions=self._positions(P))
        self.cache.begin_device_steps()
        return self.model.lm_head(hidden[:, P - 1 : P].contiguous().view(self.rows, self.model.n_embd))

    def width(self, step: int) -> int:
        """Attention width of decoding step `step` (step 0 follows the prompts; step s >= 1 feeds slot
        prompt_width + s - 1): the filled slots rounded up to WIDTH_STEP, at most the capacity."""
        return min(self.cache.capacity, -(-(self.prompt_width + step) // WIDTH_STEP) * WIDTH_STEP)

    def feed(self, ids: Tensor, width: int) -> Tensor:
        """Feed ids [rows, 1] at the device slot, attending over `width` slots; the next logits [rows, V]."""
        self.cache.width = width
        positions = self.cache.slot_positions().clamp(max=float(self.model.n_positions - 1))
        hidden = self.model.hidden_states(ids, cache=self.cache, positions=positions)
        return self.model.lm_head(hidden.view(self.rows, self.model.n_embd))

    def run_step(self, key: Hashable, step: Callable[[], None]) -> bool:
        """One decoding step through the current cache's graphs (see StepGraphs); True when replayed."""
        replayed = self.cache_set.graphs.run(key, step)
        self.counts["replayed" if replayed else "eager"] += 1
        return replayed

    def keep(self, name: str, make: Callable[[], Any]) -> Any:
        """The current cache's step buffer `name`, made by make() the first time."""
        if name not in self.cache_set.kept:
            self.cache_set.kept[name] = make()
        return self.cache_set.kept[name]

    def _cache_set(self, rows: int, capacity: int) -> _CacheSet:
        key = (rows, capacity)
        found = self._sets.pop(key, None)
        if found is None:
            while len(self._sets) >= KEEP_CACHES:
                self._sets.popitem(last=False)
            found = _CacheSet(self.model, self._like, rows, capacity, self.use_graphs)
        self._sets[key] = found
        return found

    def _ids(self, ids: np.ndarray) -> Tensor:
        return minitorch.tensor_from_numpy(ids, backend=self.backend)

    def _positions(self, count: int) -> np.ndarray:
        return np.minimum(self.cache.positions(count), self.model.n_positions - 1)


def decode_in_batches(
    model: DecoderLM,
    prompts: Sequence[np.ndarray],
    batch_size: int,
    decode_batch: Callable[[List[np.ndarray]], List[np.ndarray]],
    progress: str = "",
) -> List[np.ndarray]:
    """decode_batch over batches of up to batch_size prompts sorted by length, in eval mode without
    gradients (the model's mode is restored); its outputs in the order of prompts. progress: the
    description of a bar counting the sentences (none when empty)."""
    was_training = model.training
    model.eval()
    generated: List[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    try:
        with minitorch.no_grad(), tqdm(total=len(prompts), desc=progress, unit="sentence", leave=False,
                                       disable=not progress) as bar:  # fmt: skip
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                for index, tokens in zip(chunk, decode_batch([prompts[i] for i in chunk])):
                    generated[index] = tokens
                bar.update(len(chunk))
    finally:
        if was_training:
            model.train()
    return generated


class GreedyDecoder:
    """Greedy decoding with the KV cache (see the module docstring); call it with prompts and a batch
    size.  A decoder keeps its caches and CUDA graphs for later calls: the graphs read the model's
    parameter tensors where they were at capture, which in-place updates (training, load_state_dict)
    keep, but a parameter given a new tensor needs a new decoder.  On CUDA with graphs, batches are
    filled up to batch_size rows so that every batch can replay the same graphs."""

    def __init__(self, model: DecoderLM, max_len: int, backend: TensorBackend, use_graphs: bool = True):
        self.decoder = CachedDecoder(model, max_len, backend, use_graphs)
        self.steps = 0

    def __call__(self, prompts: Sequence[np.ndarray], batch_size: int, progress: str = "") -> List[np.ndarray]:
        """The tokens generated after each prompt (up to and including <eos_en>, or until the whole
        sequence reaches max_len), in the order of prompts; progress: see decode_in_batches."""
        decode = partial(self._decode, batch_size=batch_size)
        return decode_in_batches(self.decoder.model, prompts, batch_size, decode, progress)

    def _decode(self, batch: List[np.ndarray], batch_size: int) -> List[np.ndarray]:
        d = self.decoder
        logits = d.start(fill_rows(batch, batch_size) if d.use_graphs else batch)
        ids = d.keep("ids", lambda: minitorch.zeros((d.rows, 1), backend=d.backend))
        ended = d.keep("ended", lambda: minitorch.zeros((d.rows, 1), backend=d.backend))
        tokens = d.keep("tokens", lambda: minitorch.zeros((d.rows, d.cache.capacity), backend=d.backend))
        ended.copy_(0.0)
        self._pick(logits, ids, ended, tokens)
        room = d.max_len - d.prompt_lengths
        generated = 1
        while generated < d.max_new:
            if generated % CHECK_EVERY == 0 and ((ended.to_numpy()[:, 0] != 0) | (room <= generated)).all():
                break
            width = d.width(generated)
            d.run_step(width, lambda: self._pick(d.feed(ids, width), ids, ended, tokens))
            generated += 1
        self.steps += generated
        out = tokens.to_numpy()[:, d.prompt_width : d.prompt_width + generated].astype(np.int64)
        return [_until_end(out[row], room[row]) for row in range(len(batch))]

    def _pick(self, logits: Tensor, ids: Tensor, ended: Tensor, tokens: Tensor) -> None:
        """The argmax of each row becomes its next input and is written at the cache's slot of tokens."""
        picked = argmax_ids(logits)
        ids.copy_(picked)
        write_slot(tokens.view(*tokens.shape, 1), picked, self.decoder.cache.slot)
        ended.copy_((ended + (picked == float(EOS_EN_ID))) > 0.0)


def _until_end(tokens: np.ndarray, room: int) -> np.ndarray:
    """A row's generated tokens: at most `room`, up to and including the first <eos_en>."""
    tokens = tokens[:room]
    ends = np.flatnonzero(tokens == EOS_EN_ID)
    return tokens[: ends[0] + 1].copy() if ends.size else tokens.copy()


def greedy_decode(
    model: DecoderLM, prompts: Sequence[np.ndarray], max_len: int, batch_size: int, backend: TensorBackend,
    use_graphs: bool = True,
) -> List[np.ndarray]:  # fmt: skip
    """The tokens generated after each prompt (up to and including <eos_en>, or until the whole
    sequence reaches max_len), in the order of prompts; KV-cached (one call of a GreedyDecoder)."""
    return GreedyDecoder(model, max_len, backend, use_graphs)(prompts, batch_size)


def greedy_decode_recompute(
    model: DecoderLM, prompts: Sequence[np.ndarray], max_len: int, batch_size: int, backend: TensorBackend
) -> List[np.ndarray]:
    """greedy_decode without a cache: every step re-runs the model on the whole prefix."""

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
            next_ids = argmax_ids(logits).to_numpy().reshape(A).astype(np.int64)
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
