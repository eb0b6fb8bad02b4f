"""Greedy decoding and BLEU for the translation program.

Decoding is batched across sentences and re-runs the model on the growing prefix (no KV cache).
Prompts are sorted by length so a batch holds similar lengths; each step feeds the active rows'
buffer [A, W] (and a one-hot of every row's own last position), applies the LM head at those
positions only and takes the argmax on the backend, so one [A] vector of token ids comes back per
step. Rows that emitted <eos_en> or filled max_len leave the batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

import numpy as np
import sacrebleu

import minitorch
from minitorch import DecoderLM, Tensor, TensorBackend, nn
from project.mt_data import EOS_EN_ID, PAD_ID, pad_prompts


def next_tokens(
    model: DecoderLM, ids: np.ndarray, lengths: np.ndarray, vocab_ids: Tensor, backend: TensorBackend
) -> np.ndarray:
    """Greedy next token of each row of ids [A, W], whose real prefix is ids[a, :lengths[a]].
    vocab_ids: [1, V] holding 0 .. V-1 on the backend."""
    A, W = ids.shape
    hidden = model.hidden_states(minitorch.tensor_from_numpy(ids, backend=backend))
    last = np.zeros((A, W, 1), dtype=np.float32)
    last[np.arange(A), lengths - 1] = 1.0
    picked = (hidden * minitorch.tensor_from_numpy(last, backend=backend)).sum(1)
    logits = model.lm_head(picked.view(A, model.n_embd))
    # The argmax as an id: the largest index among the row's maxima (exact ties are rare).
    token = (nn.argmax(logits, 1) * vocab_ids).max(1)
    return token.to_numpy().reshape(A).astype(np.int64)


def greedy_decode(
    model: DecoderLM,
    prompts: Sequence[np.ndarray],
    max_len: int,
    batch_size: int,
    backend: TensorBackend,
) -> List[np.ndarray]:
    """The tokens generated after each prompt (up to and including <eos_en>, or until the whole
    sequence reaches max_len), in the order of prompts."""
    was_training = model.training
    model.eval()
    generated: List[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    vocab_ids = minitorch.tensor_from_numpy(np.arange(model.n_vocab)[None, :], backend=backend)
    with minitorch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            prompt_ids, lengths = pad_prompts([prompts[i] for i in chunk])
            prompt_lengths = lengths.copy()
            ids = np.full((len(chunk), max_len), PAD_ID, dtype=np.int64)
            ids[:, : prompt_ids.shape[1]] = prompt_ids
            active = np.flatnonzero(lengths < max_len)
            while active.size:
                width = int(lengths[active].max())
                tokens = next_tokens(model, ids[active, :width], lengths[active], vocab_ids, backend)
                ids[active, lengths[active]] = tokens
                lengths[active] += 1
                active = active[(tokens != EOS_EN_ID) & (lengths[active] < max_len)]
            for row, index in enumerate(chunk):
                generated[index] = ids[row, prompt_lengths[row] : lengths[row]].copy()
    if was_training:
        model.train()
    return generated


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacrebleu corpus BLEU (default 13a tokenization, cased) of detokenized text."""
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def write_translations(path: Path, sources: Sequence[str], references: Sequence[str], hypotheses: Sequence[str]) -> None:
    """Source, reference and model output of every decoded sentence, one block each."""
    with open(path, "w", encoding="utf-8") as f:
        for i, (src, ref, hyp) in enumerate(zip(sources, references, hypotheses)):
            f.write(f"[{i}]\nsrc: {src}\nref: {ref}\nhyp: {hyp}\n\n")
