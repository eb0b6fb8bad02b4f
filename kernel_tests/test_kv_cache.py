"""The KV cache on CUDA (strided slot writes, row gathers, the cached attention step) against the
full forward pass on the same backend, its device-slot steps replayed from CUDA graphs against its
host-mode steps, and cached greedy decoding against re-computation."""

import numpy as np
import pytest

import minitorch
from minitorch import DecoderLM
from minitorch.graphs import StepGraphs
from project.translation.decode import greedy_decode, greedy_decode_recompute

from fused_testing import rel_err

pytest.importorskip("torch")
CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)


def model(options) -> DecoderLM:
    minitorch.manual_seed(4)
    m = DecoderLM(n_vocab=300, n_embd=64, n_head=4, n_positions=48, n_layers=2, backend=CUDA, **options)
    m.eval()
    return m


OPTIONS = [{"use_fused_kernel": True}, {"use_fused_kernel": False}, {"attention": "fused"}]


@pytest.mark.parametrize("options", OPTIONS)
def test_cached_steps_equal_the_full_forward(options) -> None:
    m = model(options)
    rng = np.random.default_rng(1)
    lengths = np.array([9, 4, 7, 1])
    seqs = [rng.integers(0, 300, n) for n in lengths]
    pads = lengths.max() - lengths
    ids = np.zeros((4, lengths.max()), dtype=np.int64)
    for r, seq in enumerate(seqs):
        ids[r, pads[r] :] = seq
    like = minitorch.zeros((1,), backend=CUDA)
    cache = m.new_cache(like, rows=4, capacity=12, pads=pads)
    with minitorch.no_grad():
        first = m.hidden_states(minitorch.tensor_from_numpy(ids[:, :5], backend=CUDA), cache=cache).to_numpy()
        cache.reorder(np.array([0, 1, 2, 3]))  # a gather that keeps every row
        steps = [m.hidden_states(minitorch.tensor_from_numpy(ids[:, t : t + 1], backend=CUDA), cache=cache).to_numpy()
                 for t in range(5, ids.shape[1])]
        cached = np.concatenate([first] + steps, axis=1)
        for r, seq in enumerate(seqs):
            full = m.hidden_states(minitorch.tensor_from_numpy(seq[None, :], backend=CUDA)).to_numpy()[0]
            assert rel_err(cached[r, pads[r] :], full) < 1e-4, f"row {r} {options}"


@pytest.mark.parametrize("options", OPTIONS)
def test_device_slot_steps_replayed_equal_host_steps(options) -> None:
    """Decoding steps in device-slot mode, each ending with reorder_rows as beam search does, run
    through StepGraphs keyed by (width, buffer set) as the decoders do: the first of a key eagerly,
    the later ones as replays; every step's hidden states equal the host-mode cache's."""
    m = model(options)
    rng = np.random.default_rng(3)
    pads = np.array([2, 0, 3, 0])
    prompt = minitorch.tensor_from_numpy(rng.integers(3, 300, (4, 5)), backend=CUDA)
    steps = rng.integers(3, 300, (4, 6))
    order = np.array([0, 3, 2, 3])  # rows 1 and 3 share their padding, as reorder_rows needs
    like = minitorch.zeros((1,), backend=CUDA)
    host, device = (m.new_cache(like, rows=4, capacity=12, pads=pads) for _ in range(2))
    ids, out = minitorch.zeros((4, 1), backend=CUDA), minitorch.zeros((4, 1, 64), backend=CUDA)
    sources = minitorch.tensor_from_numpy(order, backend=CUDA)
    graphs = StepGraphs(True)

    def step(width: int, parity: int) -> None:
        device.set_parity(parity)
        device.width = width
        out.copy_(m.hidden_states(ids, cache=device))
        device.reorder_rows(sources, width)

    with minitorch.no_grad():
        for cache in (host, device):
            m.hidden_states(prompt, cache=cache)
        device.begin_device_steps()
        for t in range(steps.shape[1]):
            ref = m.hidden_states(minitorch.tensor_from_numpy(steps[:, t : t + 1], backend=CUDA), cache=host).to_numpy()
            host.reorder(order)
            ids.copy_(steps[:, t : t + 1].astype(np.float32))
            width, parity = (8 if t < 3 else 12), t % 2
            replayed = graphs.run((width, parity), lambda: step(width, parity))
            assert replayed == (t in (2, 5))
            assert rel_err(out.to_numpy(), ref) < 1e-4, f"step {t} {options}"
        assert device.slot.to_numpy().tolist() == [11.0]


@pytest.mark.parametrize("options", OPTIONS)
def test_cached_greedy_equals_recompute(options) -> None:
    m = model(options)
    rng = np.random.default_rng(2)
    prompts = [np.append(rng.integers(3, 300, rng.integers(1, 20)), 0) for _ in range(20)]
    cached = greedy_decode(m, prompts, 48, 8, CUDA)
    recomputed = greedy_decode_recompute(m, prompts, 48, 8, CUDA)
    same = sum(np.array_equal(a, b) for a, b in zip(cached, recomputed))
    assert same == len(prompts), f"{same}/{len(prompts)} decodings equal"
