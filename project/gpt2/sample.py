"""Text generation with a trained GPT2 (project/gpt2/model.py): greedy, or sampling with a
temperature and top-k, from token ids or from a prompt string and a ``tokenizers`` tokenizer.

    from project.gpt2.model import GPT2
    from project.gpt2.sample import generate_text
    from tokenizers import Tokenizer
    model = GPT2.from_checkpoint("runs/gpt2/model.bin")
    tok = Tokenizer.from_file("runs/gpt2_data/train_en_tokenizer.json")
    print(generate_text(model, tok, "A man", max_new_tokens=20, top_k=40, seed=0))

Each new token runs the model over the whole context again (no key/value cache): simple, and fast
enough for samples of a few hundred tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from project.gpt2.data import EOT_TOKEN
from project.gpt2.model import GPT2


def sample_token(
    logits: np.ndarray, temperature: float = 1.0, top_k: Optional[int] = None,
    rng: Optional[np.random.Generator] = None,
) -> int:  # fmt: skip
    """One id from a row of logits: the argmax when temperature is 0 or top_k is 1, otherwise a draw
    from softmax(logits / temperature) restricted to the top_k largest logits (all when None)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be a positive int or None, got {top_k}")
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    if temperature == 0 or top_k == 1:
        return int(np.argmax(logits))
    z = logits / temperature
    if top_k is not None and top_k < z.size:
        kth = np.partition(z, z.size - top_k)[z.size - top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    rng = rng if rng is not None else np.random.default_rng()
    return int(rng.choice(z.size, p=p / p.sum()))


def generate(
    model: GPT2,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    seed: Optional[int] = None,
) -> list[int]:
    """The prompt followed by ``max_new_tokens`` tokens, each drawn by ``sample_token`` from the
    model's next-token logits given the tokens so far (the last max_seq_len of them); ``seed``
    makes the draws repeatable. temperature=0 (or top_k=1) decodes greedily."""
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("generate needs at least one prompt token (e.g. the end-of-text id)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    rng = np.random.default_rng(seed)
    window = model.config.max_seq_len
    for _ in range(max_new_tokens):
        context = model.token_ids(np.array([ids[-window:]], dtype=np.int64))
        ids.append(sample_token(model.next_token_logits(context)[0], temperature, top_k, rng))
    return ids


def generate_text(
    model: GPT2, tokenizer: Any, prompt: str, max_new_tokens: int, temperature: float = 1.0,
    top_k: Optional[int] = None, seed: Optional[int] = None, eot_token: str = EOT_TOKEN,
) -> str:  # fmt: skip
    """The prompt continued by ``max_new_tokens`` tokens, as text. The model sees
    ``<|endoftext|> prompt`` (every training document starts with that token); ``tokenizer`` is
    a ``tokenizers.Tokenizer`` whose ids the model was trained on."""
    eot_id = tokenizer.token_to_id(eot_token)
    if eot_id is None:
        raise ValueError(f"the tokenizer has no {eot_token!r} token")
    prompt_ids = [eot_id] + tokenizer.encode(prompt, add_special_tokens=False).ids
    ids = generate(model, prompt_ids, max_new_tokens, temperature, top_k, seed)
    return prompt + tokenizer.decode(ids[len(prompt_ids) :])
