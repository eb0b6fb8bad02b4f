"""Decoding for translation: the KV cache against full re-computation, beam search against greedy
decoding and against exhaustive search on a hand-built model, and the device top-k."""

import itertools
from typing import List

import numpy as np
import pytest
from minitorch_testing import FAST, assert_close, mt

import minitorch
from minitorch import DecoderLM, KVCache
from minitorch.fused.topk import top_k
from project.translation.beam import beam_search
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID
from project.translation.decode import greedy_decode, greedy_decode_recompute


OPTIONS = [{"use_fused_kernel": True}, {"use_fused_kernel": False}, {"attention": "fused", "activation": "relu"}]


def random_model(seed: int = 1, **options) -> DecoderLM:
    minitorch.manual_seed(seed)
    return DecoderLM(n_vocab=30, n_embd=16, n_head=2, n_positions=20, n_layers=2, backend=FAST, **options)


def random_prompts(n: int, seed: int = 0) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(3, 30, rng.integers(0, 8)), EOS_DE_ID) for _ in range(n)]


@pytest.mark.parametrize("options", OPTIONS)
def test_cached_hidden_states_equal_the_full_forward(options) -> None:
    """Left-padded prompts run through the cache in three pieces (2 slots, then 1, then 3) give the
    full forward pass's hidden states of every real position."""
    model = random_model(**options)
    model.eval()
    rng = np.random.default_rng(5)
    lengths = np.array([6, 3, 5])
    seqs = [rng.integers(0, 30, n) for n in lengths]
    pads = lengths.max() - lengths
    ids = np.zeros((3, lengths.max()), dtype=np.int64)
    for r, seq in enumerate(seqs):
        ids[r, pads[r] :] = seq
    cache = model.new_cache(mt(np.zeros(1), FAST), rows=3, capacity=8, pads=pads)
    with minitorch.no_grad():
        pieces = [model.hidden_states(mt(ids[:, a:b], FAST), cache=cache).to_numpy() for a, b in ((0, 2), (2, 3), (3, 6))]
        cached = np.concatenate(pieces, axis=1)
        for r, seq in enumerate(seqs):
            full = model.hidden_states(mt(seq[None, :], FAST)).to_numpy()
            assert_close(cached[r, pads[r] :], full[0], f"row {r} of {options}", tol=1e-4)
    assert cache.length == 6


@pytest.mark.parametrize("options", OPTIONS)
def test_cached_greedy_decoding_equals_recomputing_token_for_token(options) -> None:
    model = random_model(**options)
    prompts = random_prompts(5)
    cached = greedy_decode(model, prompts, 14, 2, FAST)
    recomputed = greedy_decode_recompute(model, prompts, 14, 2, FAST)
    assert [c.tolist() for c in cached] == [r.tolist() for r in recomputed]
    assert any(len(c) > 4 for c in cached) and model.training


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_with_beam_1_is_greedy(length_penalty: float) -> None:
    model = random_model(seed=2)
    prompts = random_prompts(6, seed=3)
    greedy = greedy_decode(model, prompts, 14, 4, FAST)
    beam = beam_search(model, prompts, 14, 3, FAST, beam_size=1, length_penalty=length_penalty)
    assert [g.tolist() for g in greedy] == [b.tolist() for b in beam]


# ---- a hand-built bigram model ------------------------------------------------------------------
A, B, C = 3, 4, 5  # three word ids; 0, 1, 2 are <eos_de>, <eos_en>, <pad>
NEXT = {  # next-token probabilities after each token
    EOS_DE_ID: {A: 0.5, B: 0.4, C: 0.1},
    A: {EOS_EN_ID: 0.34, B: 0.33, C: 0.33},
    B: {EOS_EN_ID: 0.9, A: 0.05, C: 0.05},
    C: {EOS_EN_ID: 0.6, A: 0.2, B: 0.2},
}
V = 6


def bigram_log_probs() -> np.ndarray:
    table = np.full((V, V), 1e-4)
    for prev, row in NEXT.items():
        for token, p in row.items():
            table[prev, token] = p
    table /= table.sum(1, keepdims=True)
    return np.log(table)


def bigram_model() -> DecoderLM:
    """A DecoderLM whose next-token log-probabilities depend only on the last token: the layer adds
    nothing (zero output projections), positions embed to 0, token i embeds to the i-th unit vector,
    and the LM head maps LayerNorm(e_i) to row i of bigram_log_probs()."""
    n_embd = 8
    model = DecoderLM(n_vocab=V, n_embd=n_embd, n_head=1, n_positions=12, n_layers=1, p_dropout=0.0, backend=FAST)
    params = dict(model.named_parameters())
    zero = ["layers.0.attention.out_projection", "layers.0.ff.linear_out"]
    for name in zero:
        for part in ("weight", "bias"):
            p = params[f"{name}.{part}"]
            p.update(mt(np.zeros(p.value.shape), FAST))
    params["position_embeddings.weight"].update(mt(np.zeros((12, n_embd)), FAST))
    units = np.eye(V, n_embd)
    params["token_embeddings.weight"].update(mt(units, FAST))
    normed = (units - units.mean(1, keepdims=True)) / np.sqrt(units.var(1, keepdims=True) + 1e-5)
    head = np.linalg.lstsq(normed, bigram_log_probs(), rcond=None)[0]
    params["lm_head.weight"].update(mt(head.T, FAST))
    params["lm_head.bias"].update(mt(np.zeros(V), FAST))
    return model


def exhaustive_best(prompt_last: int, room: int, length_penalty: float) -> List[int]:
    """The best sequence by score / length ** length_penalty among all that end in <eos_en> within
    `room` tokens or fill `room` tokens."""
    logp = bigram_log_probs()
    best, best_value = None, -np.inf
    for n in range(1, room + 1):
        for seq in itertools.product(range(V), repeat=n):
            if EOS_EN_ID in seq[:-1] or (n < room and seq[-1] != EOS_EN_ID):
                continue
            score = sum(logp[prev, tok] for prev, tok in zip((prompt_last,) + seq[:-1], seq))
            value = score / n**length_penalty
            if value > best_value:
                best, best_value = list(seq), value
    return best


def test_hand_built_model_has_the_intended_log_probs() -> None:
    model = bigram_model()
    model.eval()
    logits = model(mt(np.array([[EOS_DE_ID, A, B, C]]), FAST)).to_numpy()[0]
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert np.abs(log_probs - bigram_log_probs()[[EOS_DE_ID, A, B, C]]).max() < 1e-4


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_finds_the_known_best_sequence(length_penalty: float) -> None:
    """Greedy takes A (0.5) and ends with A <eos_en> (0.17); the best sequence is B <eos_en> (0.36)."""
    model = bigram_model()
    prompts = [np.array([C, EOS_DE_ID])]
    best = exhaustive_best(EOS_DE_ID, room=4, length_penalty=length_penalty)
    assert best == [B, EOS_EN_ID]
    assert greedy_decode(model, prompts, 6, 1, FAST)[0].tolist() == [A, EOS_EN_ID]
    for beam in (2, 3, V):
        found = beam_search(model, prompts * 3, 6, 2, FAST, beam_size=beam, length_penalty=length_penalty)
        assert [f.tolist() for f in found] == [best] * 3, f"beam {beam}"


# ---- pieces ---------------------------------------------------------------------------------------
def test_top_k_matches_numpy_and_puts_the_larger_index_first_on_ties() -> None:
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 50)).astype(np.float32)
    scores[2, 7] = scores[2, 30] = 9.0  # a tie for the top
    values, indices = (t.to_numpy() for t in top_k(mt(scores, FAST), 5))
    for r in range(4):
        ref = sorted(range(50), key=lambda j: (-scores[r, j], -j))[:5]
        assert indices[r].tolist() == ref
        assert np.array_equal(values[r], scores[r, ref])
    with pytest.raises(ValueError, match="k must be in"):
        top_k(mt(scores, FAST), 51)


def test_kv_cache_rejects_overflow_and_bad_rows() -> None:
    model = random_model()
    cache = model.new_cache(mt(np.zeros(1), FAST), rows=2, capacity=3)
    with minitorch.no_grad():
        model.hidden_states(mt(np.ones((2, 3)), FAST), cache=cache)
        with pytest.raises(minitorch.IndexingError, match="holds 3 positions: 3 filled"):
            model.hidden_states(mt(np.ones((2, 1)), FAST), cache=cache)
        with pytest.raises(minitorch.IndexingError, match="for a KVCache of 2 rows"):
            model.hidden_states(mt(np.ones((3, 1)), FAST), cache=cache)
    with pytest.raises(minitorch.IndexingError, match="row ids in \\[0, 2\\)"):
        cache.reorder(np.array([0, 2]))
    with pytest.raises(ValueError, match="pads must be 2 counts"):
        KVCache(mt(np.zeros(1), FAST), 1, 2, 4, 16, pads=[0, 5])


def test_reorder_copies_rows_and_their_padding() -> None:
    model = random_model()
    model.eval()
    ids = np.array([[0, 7, 8], [5, 6, 9]])
    cache = model.new_cache(mt(np.zeros(1), FAST), rows=2, capacity=5, pads=[1, 0])
    with minitorch.no_grad():
        model.hidden_states(mt(ids, FAST), cache=cache)
        cache.reorder(np.array([1, 1, 0]))
        step = model.hidden_states(mt(np.array([[4], [4], [4]]), FAST), cache=cache).to_numpy()
        full = [model.hidden_states(mt(np.array([seq]), FAST)).to_numpy()[0, -1] for seq in ([5, 6, 9, 4], [7, 8, 4])]
    assert cache.pads.tolist() == [0, 0, 1]
    for row, ref in zip(step[:, 0], (full[0], full[0], full[1])):
        assert_close(row, ref, "reordered row", tol=1e-4)
