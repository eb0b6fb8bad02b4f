"""Decoding steps replayed from CUDA graphs: the kernels they need (slot write, row gather, top-k,
beam search bookkeeping) against NumPy and their references, and graph-replayed greedy decoding and
beam search against the recompute decoder and the same decoders run eagerly, token for token."""

import sys
from pathlib import Path
from typing import List, Sequence

import numpy as np
import pytest
from fused_testing import CPU, CUDA, cpu, gpu, rng_for

import minitorch
from minitorch import DecoderLM
from minitorch.beam_search import DEAD, BeamState
from minitorch.fused.device_indexed import gather_rows, write_slot
from minitorch.fused.slot_attention import slot_attention
from minitorch.fused.topk import top_k
from project.translation.beam import BeamDecoder, beam_search
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID
from project.translation.decode import GreedyDecoder, greedy_decode, greedy_decode_recompute

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from minitorch_testing import slot_attention_reference  # noqa: E402

pytest.importorskip("torch")


@pytest.mark.parametrize("slot", [0.0, 3.0, 6.0, 7.0, 2.5, -1.0])
def test_slot_write_kernel(slot: float) -> None:
    rng = rng_for("slot", slot)
    buffer = rng.standard_normal((5, 7 * 8)).astype(np.float32)
    values = rng.standard_normal((5, 8)).astype(np.float32)
    expected = buffer.reshape(5, 7, 8).copy()
    if slot in (0.0, 3.0, 6.0):
        expected[:, int(slot)] = values
    out = gpu(buffer)
    write_slot(out.view(5, 7, 8), gpu(values), gpu(np.array([slot])))
    assert np.array_equal(out.to_numpy(), expected.reshape(5, 56))
    packed = rng.standard_normal((5, 3 * 8)).astype(np.float32)  # values as a third of packed rows
    out = gpu(buffer)
    write_slot(out.view(5, 7, 8), gpu(packed)[:, 8:16], gpu(np.array([slot])))
    if slot in (0.0, 3.0, 6.0):
        expected[:, int(slot)] = packed[:, 8:16]
    assert np.array_equal(out.to_numpy(), expected.reshape(5, 56))
    tokens = gpu(np.zeros((3, 9)))
    write_slot(tokens.view(3, 9, 1), gpu(np.array([[4.0], [5.0], [6.0]])), gpu(np.array([min(max(slot, 0), 8)])))
    assert tokens.to_numpy()[:, int(min(max(slot, 0), 8))].tolist() == ([4.0, 5.0, 6.0] if slot != 2.5 else [0.0] * 3)


@pytest.mark.parametrize(
    "rows, heads, D, width",
    [(6, 8, 32, 160), (5, 12, 64, 1024), (3, 4, 24, 50), (4, 3, 5, 9), (2, 1, 1, 3), (3, 16, 128, 40), (2, 16, 64, 5000)],
)  # MT default; GPT-2 at 1024 slots (shared memory over 48 KB); D sharing lanes; tiny D; C = 2048; too wide: composed
@pytest.mark.parametrize("slot", [7.0, 1e9, 2.0, -1.0])  # inside, past the width, before some rows' padding, none
def test_slot_attention_kernel_matches_numpy(rows: int, heads: int, D: int, width: int, slot: float) -> None:
    rng = rng_for("slot_attention", rows, heads, D, width, slot)
    C, slots = heads * D, width + 3
    packed = rng.standard_normal((rows, 3 * C)).astype(np.float32)
    keys, values = (rng.standard_normal((rows, slots, C)).astype(np.float32) for _ in range(2))
    pads = rng.integers(0, 4, rows)
    queries = gpu(packed)[:, :C]  # a strided view, as the packed q/k/v projection gives
    out = slot_attention(queries, gpu(keys), gpu(values), gpu(np.array([slot])), gpu(pads[:, None]), width, heads)
    expected = slot_attention_reference(packed[:, :C], keys, values, slot, pads, width, heads)
    assert np.abs(out.to_numpy() - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max())


@pytest.mark.parametrize("n", [36, 9])  # float4 and scalar paths
def test_gather_rows_kernel(n: int) -> None:
    rng = rng_for("gather", n)
    source = rng.standard_normal((6, 40)).astype(np.float32)
    ids = np.array([5.0, 0.0, 5.0, 2.0])
    out = gpu(np.full((4, 44), 7.0))
    view = out._new(minitorch.TensorData(out._tensor._storage, (4, n), (44, 1)))
    src = gpu(source)
    gather_rows(view, src._new(minitorch.TensorData(src._tensor._storage, (6, n), (40, 1))), gpu(ids))
    expected = np.full((4, 44), 7.0, dtype=np.float32)
    expected[:, :n] = source[ids.astype(int), :n]
    assert np.array_equal(out.to_numpy(), expected)
    out = gpu(np.full((2, 40), 7.0))
    gather_rows(out, src, gpu(np.array([6.0, 1.0])))  # an id out of range: zeros, no fault
    assert np.array_equal(out.to_numpy(), np.stack([np.zeros(40, dtype=np.float32), source[1]]))


def reference_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best per row: larger value first, then larger index."""
    width = scores.shape[1]
    return np.stack([np.lexsort((-np.arange(width), -row))[:k] for row in scores])


@pytest.mark.parametrize(
    "width,k", [(1, 1), (7, 3), (255, 8), (256, 8), (300, 12), (1000, 17), (32000, 8), (5000, 32), (40, 33)]
)
def test_top_k_kernel_matches_numpy(width: int, k: int) -> None:
    rng = rng_for("topk", width, k)
    scores = rng.standard_normal((6, width)).astype(np.float32)
    scores[1] = np.round(scores[1])  # many ties
    scores[2] = 0.5  # all tied: the largest indices first
    scores[3, : width // 2] = -np.inf
    scores[4] = -1e20  # beam search's dead rows
    scores[5, 3::256] += 10.0  # the best entries all in one thread's columns
    values, indices = top_k(gpu(scores), min(k, width))
    expected = reference_top_k(scores, min(k, width))
    assert np.array_equal(indices.to_numpy().astype(np.int64), expected)
    assert np.array_equal(values.to_numpy(), np.take_along_axis(scores, expected, 1))
    composed = minitorch.fused.topk._composed_top_k(gpu(scores), min(k, width))
    assert np.array_equal(composed[1].to_numpy(), indices.to_numpy())


@pytest.mark.parametrize("length_penalty,integral", [(1.0, True), (0.0, True), (0.6, False)])
def test_beam_search_step_kernel_matches_numpy(length_penalty: float, integral: bool) -> None:
    """BeamState's step on CUDA (the kernel) and on the CPU (the NumPy reference) from the same
    candidates: the same state after every step, with sentences ending by <eos>, by running out of
    candidates and by filling their sequences, ties among scores (integral values) and a step past
    max_steps (no change)."""
    sentences, beam, vocab, max_steps, eos = 6, 3, 5, 9, 1
    rng = rng_for("beam step", length_penalty)
    states = [BeamState(like, sentences, beam, vocab, max_steps, eos, length_penalty) for like in (gpu([0]), cpu([0]))]
    room = rng.integers(1, max_steps + 1, sentences)
    for state in states:
        state.reset(room)
    width = states[0].candidates
    for step in range(max_steps + 1):
        indices = np.stack([rng.permutation(beam * vocab)[:width] for _ in range(sentences)]).astype(np.float64)
        values = rng.standard_normal((sentences, width)) * 2 - step
        values = np.round(values) if integral else values
        values[rng.random(values.shape) < 0.15] = DEAD
        order = np.stack([np.lexsort((-i, -v)) for i, v in zip(indices, values)])  # best first, as top_k gives
        values, indices = (np.take_along_axis(a, order, 1) for a in (values, indices))
        for state, make in zip(states, (gpu, cpu)):
            state.step(make(values), make(indices))
        for name in ("scores", "tokens", "sources", "done", "history", "finished", "finished_count", "step_counter"):
            on_cuda, on_cpu = (getattr(state, name).to_numpy() for state in states)
            assert np.array_equal(on_cuda, on_cpu), f"{name} after step {step}"
    assert states[0].done.to_numpy().all()
    assert [t.tolist() for t in states[0].best_tokens()] == [t.tolist() for t in states[1].best_tokens()]


def model(options: dict, vocab: int = 300, eos_share: float = 0.1) -> DecoderLM:
    """A small random model whose <eos_en> logit is raised so that it wins about `eos_share` of the
    positions of random inputs: decodings end at varied lengths, some at max_len."""
    minitorch.manual_seed(4)
    m = DecoderLM(n_vocab=vocab, n_embd=64, n_head=4, n_positions=48, n_layers=2, backend=CUDA, **options)
    m.eval()
    ids = np.random.default_rng(0).integers(3, vocab, (8, 24))
    with minitorch.no_grad():
        logits = m(gpu(ids)).to_numpy().reshape(-1, vocab)
    gap = np.quantile(logits.max(1) - logits[:, EOS_EN_ID], eos_share)
    bias = m.lm_head.bias.value.to_numpy()
    bias[EOS_EN_ID] += gap
    m.lm_head.bias.update(gpu(bias))
    return m


def prompts_of(n: int, vocab: int, seed: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(3, vocab, rng.integers(0, 20)), EOS_DE_ID) for _ in range(n)]


def as_lists(outputs: Sequence[np.ndarray]) -> List[list]:
    return [o.tolist() for o in outputs]


OPTIONS = [{"use_fused_kernel": True}, {"use_fused_kernel": False}, {"attention": "fused"}]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("vocab", [300, 12])
def test_graph_greedy_equals_recompute(options: dict, vocab: int) -> None:
    """Variable-length prompts in batches of 16 (the last filled up to 16 rows), twice through one
    decoder (the second call replays the first call's graphs), against the recompute decoder and the
    eager cached one."""
    m = model(options, vocab, eos_share=0.03 if vocab == 300 else 0.1)  # some rows run to max_len
    prompts = prompts_of(37, vocab, seed=vocab)
    decoder = GreedyDecoder(m, 48, CUDA)
    first = as_lists(decoder(prompts, 16))
    eager_steps = decoder.decoder.counts["eager"]
    second = as_lists(decoder(prompts, 16))
    assert decoder.decoder.counts["eager"] == eager_steps, "the second call captured new graphs"
    assert decoder.decoder.counts["replayed"] > eager_steps
    reference = as_lists(greedy_decode_recompute(m, prompts, 48, 16, CUDA))
    eager = as_lists(greedy_decode(m, prompts, 48, 16, CUDA, use_graphs=False))
    same = sum(a == b for a, b in zip(first, reference))
    assert same == len(prompts), f"{same}/{len(prompts)} graph decodings equal the recompute decoder's"
    assert second == first and eager == first
    lengths = [len(r) for r in reference]
    print(f"vocab {vocab} {options}: lengths {min(lengths)}..{max(lengths)}, "
          f"{sum(r[-1] == EOS_EN_ID for r in reference)} end in <eos_en>, {decoder.decoder.counts}")  # fmt: skip


@pytest.mark.parametrize("beam,length_penalty", [(1, 1.0), (3, 1.0), (4, 0.0), (2, 0.6)])
def test_graph_beam_equals_eager(beam: int, length_penalty: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph-replayed beam search (twice through one decoder) equals the eager one, which equals the
    bookkeeping's NumPy reference on the same tensors; beam 1 equals greedy decoding."""
    m = model({"use_fused_kernel": True}, 60, eos_share=0.05)
    prompts = prompts_of(21, 60, seed=beam)
    decoder = BeamDecoder(m, 40, CUDA, beam, length_penalty)
    first = as_lists(decoder(prompts, 8))
    second = as_lists(decoder(prompts, 8))
    eager = as_lists(beam_search(m, prompts, 40, 8, CUDA, beam, length_penalty, use_graphs=False))
    assert first == eager and second == first
    assert decoder.decoder.counts["replayed"] > 0
    if beam == 1:
        assert first == as_lists(greedy_decode_recompute(m, prompts, 40, 8, CUDA))
    monkeypatch.setattr(minitorch.CudaKernelOps, "beam_search_step", None)  # BeamState falls back to NumPy
    reference = as_lists(beam_search(m, prompts, 40, 8, CUDA, beam, length_penalty, use_graphs=False))
    assert reference == eager
    print(f"beam {beam}, lp {length_penalty}: lengths {sorted(len(r) for r in first)}, {decoder.decoder.counts}")


def test_beam_search_cpu_and_cuda_agree() -> None:
    """The same parameters on both backends: beam search (top-k kernel, bookkeeping kernel, graphs)
    gives the CPU backend's hypotheses."""
    m = model({"use_fused_kernel": True}, 60, eos_share=0.05)
    m_cpu = DecoderLM(n_vocab=60, n_embd=64, n_head=4, n_positions=48, n_layers=2, backend=CPU, use_fused_kernel=True)
    m_cpu.load_state_dict(m.state_dict())
    m_cpu.eval()
    prompts = prompts_of(9, 60, seed=5)
    on_cuda = as_lists(beam_search(m, prompts, 40, 4, CUDA, 3, 1.0))
    on_cpu = as_lists(beam_search(m_cpu, prompts, 40, 4, CPU, 3, 1.0))
    same = sum(a == b for a, b in zip(on_cuda, on_cpu))
    assert same >= len(prompts) - 1, f"{same}/{len(prompts)} equal across backends"
