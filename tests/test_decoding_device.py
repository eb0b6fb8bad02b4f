"""Decoding with its step state on the backend (the path that CUDA graphs replay), on the CPU: the
device-indexed writes against NumPy, the KV cache's device-slot mode against its host mode, and the
batched beam search (BeamState's bookkeeping) against a plain one-sentence beam search written here
that re-runs the model on every hypothesis."""

from typing import List, Optional, Tuple

import numpy as np
import pytest
from minitorch_testing import FAST, assert_close, mt, slot_attention_reference

import minitorch
from minitorch import DecoderLM
from minitorch.beam_search import BeamState
from minitorch.fused.device_indexed import gather_rows, write_slot
from minitorch.fused.slot_attention import slot_attention
from project.translation.beam import beam_search
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID


def test_write_slot_and_gather_rows_match_numpy(backend) -> None:
    rng = np.random.default_rng(0)
    buffer = rng.standard_normal((3, 5 * 4)).astype(np.float32)
    values = rng.standard_normal((3, 4)).astype(np.float32)
    t = mt(buffer, backend)
    write_slot(t.view(3, 5, 4), mt(values, backend), mt(np.array([2.0]), backend))
    expected = buffer.reshape(3, 5, 4).copy()
    expected[:, 2] = values
    assert np.array_equal(t.to_numpy(), expected.reshape(3, 20))
    write_slot(t.view(3, 5, 4), mt(values + 1, backend), mt(np.array([5.0]), backend))  # outside: no write
    assert np.array_equal(t.to_numpy(), expected.reshape(3, 20))

    source = rng.standard_normal((4, 6)).astype(np.float32)
    out = mt(np.zeros((3, 6)), backend)
    first_four = out._new(minitorch.TensorData(out._tensor._storage, (3, 4), (6, 1)))  # 4 of each row's 6 floats
    gather_rows(first_four, mt(source, backend)[:, :4], mt(np.array([3.0, 0.0, 3.0]), backend))
    assert np.array_equal(out.to_numpy()[:, :4], source[[3, 0, 3], :4])
    assert np.array_equal(out.to_numpy()[:, 4:], np.zeros((3, 2)))
    with pytest.raises(minitorch.IndexingError, match="write_slot needs"):
        write_slot(t, mt(values, backend), mt(np.array([0.0]), backend))


@pytest.mark.parametrize("heads, D", [(2, 8), (3, 5), (1, 1)])
@pytest.mark.parametrize("slot, width", [(6.0, 9), (8.0, 9), (11.0, 9), (0.0, 4)])
def test_slot_attention_matches_numpy(backend, heads: int, D: int, slot: float, width: int) -> None:
    """Each row attends over its slots [pads[r], min(slot, width - 1)] only; a row whose padding
    reaches past the slot gets zeros; the queries may be a strided view (columns of packed q/k/v)."""
    rng = np.random.default_rng(heads * 100 + int(slot))
    rows, slots, C = 4, 12, heads * D
    packed = rng.standard_normal((rows, 3 * C)).astype(np.float32)
    keys, values = (rng.standard_normal((rows, slots, C)).astype(np.float32) for _ in range(2))
    pads = np.array([0, 3, 1, 5])
    q = mt(packed, backend)[:, :C]
    out = slot_attention(q, mt(keys, backend), mt(values, backend), mt(np.array([slot]), backend),
                         mt(pads[:, None], backend), width, heads)  # fmt: skip
    assert_close(out, slot_attention_reference(packed[:, :C], keys, values, slot, pads, width, heads), "slot_attention")


def test_slot_attention_rejects_bad_shapes(backend) -> None:
    q, cache, one = mt(np.zeros((2, 6)), backend), mt(np.zeros((2, 5, 6)), backend), mt(np.zeros(1), backend)
    pads = mt(np.zeros((2, 1)), backend)
    with pytest.raises(minitorch.IndexingError, match="multiple of heads 4"):
        slot_attention(q, cache, cache, one, pads, 5, heads=4)
    with pytest.raises(minitorch.IndexingError, match=r"keys and values \[2, slots, 6\]"):
        slot_attention(q, cache, mt(np.zeros((2, 5, 3)), backend), one, pads, 5, heads=2)
    with pytest.raises(minitorch.IndexingError, match="1 <= width <= 5"):
        slot_attention(q, cache, cache, one, pads, 6, heads=2)


@pytest.mark.parametrize("options", [{"use_fused_kernel": True}, {"use_fused_kernel": False}, {"attention": "fused"}])
def test_device_slot_steps_equal_host_steps(options) -> None:
    """After left-padded prompts, steps at a device slot attending over a fixed width (the slots past
    the current one masked) give the host-mode steps' hidden states; reorder_rows (into the second
    buffer set) gives the host reorder's."""
    minitorch.manual_seed(3)
    model = DecoderLM(n_vocab=30, n_embd=16, n_head=2, n_positions=20, n_layers=2, backend=FAST, **options)
    model.eval()
    rng = np.random.default_rng(1)
    pads = np.array([2, 0, 3, 0])
    prompt = rng.integers(3, 30, (4, 5))
    steps = rng.integers(3, 30, (4, 4))
    host, device = (model.new_cache(mt(np.zeros(1), FAST), rows=4, capacity=12, pads=pads) for _ in range(2))
    order = np.array([0, 3, 2, 3])  # rows 1 and 3 share their padding, as reorder_rows needs
    with minitorch.no_grad():
        for cache in (host, device):
            model.hidden_states(mt(prompt, FAST), cache=cache)
        device.begin_device_steps()
        assert device.length == 5
        for t in range(steps.shape[1]):
            if t == 2:
                host.reorder(order)
                device.reorder_rows(mt(order.astype(np.float64), FAST), width=8)
                assert device.parity == 1
            ids = mt(steps[:, t : t + 1], FAST)
            ref = model.hidden_states(ids, cache=host).to_numpy()
            device.width = 8 if t < 3 else 12
            out = model.hidden_states(ids, cache=device).to_numpy()
            assert_close(out, ref, f"step {t} of {options}", tol=1e-5)
        assert device.slot.to_numpy().tolist() == [9.0] and device.length == 5
    device.reset(pads)
    assert device.slot is None and device.parity == 0


def plain_beam_search(model: DecoderLM, prompt: np.ndarray, max_len: int, beam: int, length_penalty: float) -> List[int]:
    """One sentence's beam search as BeamState documents it, with the model re-run on each hypothesis."""
    V, room = model.n_vocab, max_len - len(prompt)
    rows: List[Tuple[List[int], Optional[np.float32]]] = [([], np.float32(0.0))]
    finished: List[Tuple[float, List[int]]] = []

    def add(tokens: List[int], score: np.float32) -> None:
        value = float(score) / float(len(tokens)) ** length_penalty
        finished.insert(sum(v >= value for v, _ in finished), (value, tokens))
        del finished[beam:]

    for step in range(room):
        candidates = []
        for parent, (tokens, score) in enumerate(rows):
            if score is None:
                continue
            logits = model(mt(np.array([list(prompt) + tokens]), FAST)).to_numpy()[0, -1]
            top = logits.max()
            log_probs = logits - (top + np.log(np.exp(logits - top).sum(dtype=np.float32)))
            candidates += [(np.float32(log_probs[t] + score), parent * V + t) for t in range(V)]
        candidates = sorted(candidates, key=lambda c: (-c[0], -c[1]))[: 2 * beam]
        live = []
        for rank, (value, index) in enumerate(candidates):
            parent, token = divmod(index, V)
            if token == EOS_EN_ID:
                if rank < beam:
                    add(rows[parent][0] + [token], value)
                continue
            live.append((rows[parent][0] + [token], value))
            if len(live) == beam:
                break
        length = step + 1
        if length >= room:
            for tokens, score in live:
                add(tokens, score)
            break
        if not live or (len(finished) >= beam and float(live[0][1]) / length**length_penalty <= finished[-1][0]):
            break
        rows = live + [([], None)] * (beam - len(live))
    return finished[0][1]


@pytest.mark.parametrize("beam,length_penalty", [(2, 1.0), (3, 0.0), (4, 0.6)])
def test_batched_beam_search_equals_a_plain_one(beam: int, length_penalty: float) -> None:
    minitorch.manual_seed(7)
    model = DecoderLM(n_vocab=30, n_embd=16, n_head=2, n_positions=20, n_layers=2, backend=FAST)
    model.eval()
    rng = np.random.default_rng(beam)
    prompts = [np.append(rng.integers(3, 30, rng.integers(0, 7)), EOS_DE_ID) for _ in range(5)]
    found = beam_search(model, prompts, 14, 2, FAST, beam_size=beam, length_penalty=length_penalty)
    with minitorch.no_grad():
        expected = [plain_beam_search(model, p, 14, beam, length_penalty) for p in prompts]
    assert [f.tolist() for f in found] == expected


def test_beam_state_checks_its_inputs() -> None:
    like = mt(np.zeros(1), FAST)
    with pytest.raises(ValueError, match="eos in \\[0, vocab\\)"):
        BeamState(like, 2, 2, 5, 4, eos=5)
    state = BeamState(like, 2, 2, 5, 4, eos=1)
    assert state.candidates == 4
    with pytest.raises(ValueError, match="room \\[2\\] of counts >= 1"):
        state.reset([3, 0])
    with pytest.raises(ValueError, match="values and indices \\[2, 4\\]"):
        state.step(mt(np.zeros((2, 3)), FAST), mt(np.zeros((2, 3)), FAST))
