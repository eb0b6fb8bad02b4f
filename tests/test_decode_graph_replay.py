"""The decoders' steps run as CUDA graphs run them, emulated on the CPU (tests/graph_replay.py): the
first step of each key eagerly, then a capture that executes no write and allows no host transfer,
then replays of the recorded ops.  Greedy decoding and beam search through one decoder, twice (the
second call replays only), give the tokens of the same decoders run eagerly."""

from typing import List

import numpy as np
import pytest
from graph_replay import EMULATED, FAST, CaptureError, EmulatedGraphs

import minitorch
from minitorch import DecoderLM
from project.translation import decode as mt_decode
from project.translation.beam import BeamDecoder, beam_search
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID
from project.translation.decode import GreedyDecoder, greedy_decode_recompute


@pytest.fixture(autouse=True)
def emulated_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mt_decode, "StepGraphs", EmulatedGraphs)


def models() -> List[DecoderLM]:
    """The same small model on EMULATED and on FAST; <eos_en> raised so that decodings end at varied
    lengths, some at max_len."""
    minitorch.manual_seed(4)
    made = [DecoderLM(n_vocab=40, n_embd=16, n_head=2, n_positions=40, n_layers=2, backend=b) for b in (EMULATED, FAST)]
    bias = made[0].lm_head.bias.value.to_numpy().copy()
    bias[EOS_EN_ID] += 0.7
    made[0].lm_head.bias.value.copy_(bias)
    made[1].load_state_dict(made[0].state_dict())
    for m in made:
        m.eval()
    return made


def prompts_of(n: int) -> List[np.ndarray]:
    rng = np.random.default_rng(1)
    return [np.append(rng.integers(3, 40, rng.integers(0, 12)), EOS_DE_ID) for _ in range(n)]


def as_lists(outputs: List[np.ndarray]) -> List[list]:
    return [o.tolist() for o in outputs]


def test_replayed_greedy_decoding_equals_eager() -> None:
    m, m_fast = models()
    prompts = prompts_of(9)
    decoder = GreedyDecoder(m, 26, EMULATED)
    decoder.decoder.use_graphs = True  # graphs are for CUDA backends; EMULATED stands in for one
    first = as_lists(decoder(prompts, 4))
    eager_steps = decoder.decoder.counts["eager"]
    second = as_lists(decoder(prompts, 4))
    assert decoder.decoder.counts["eager"] == eager_steps and decoder.decoder.counts["replayed"] > eager_steps
    assert first == second == as_lists(greedy_decode_recompute(m_fast, prompts, 26, 4, FAST))
    assert len({len(tokens) for tokens in first}) > 3


@pytest.mark.parametrize("beam,length_penalty", [(3, 1.0), (2, 0.6)])
def test_replayed_beam_search_equals_eager(beam: int, length_penalty: float) -> None:
    m, m_fast = models()
    prompts = prompts_of(7)
    decoder = BeamDecoder(m, 26, EMULATED, beam, length_penalty)
    decoder.decoder.use_graphs = True
    first = as_lists(decoder(prompts, 3))
    eager_steps = decoder.decoder.counts["eager"]
    second = as_lists(decoder(prompts, 3))
    assert decoder.decoder.counts["eager"] == eager_steps and decoder.decoder.counts["replayed"] > eager_steps
    assert first == second == as_lists(beam_search(m_fast, prompts, 26, 3, FAST, beam, length_penalty))


def test_a_host_read_inside_a_capture_raises() -> None:
    x = minitorch.zeros((3,), backend=EMULATED)
    graphs = EmulatedGraphs(True)
    graphs.run("add", lambda: x.copy_(x + 1.0))
    assert graphs.run("add", lambda: x.copy_(x + 1.0)) and x.to_numpy().tolist() == [2.0] * 3
    with pytest.raises(CaptureError, match="storage_to_numpy"):
        graphs.run("read", lambda: x.to_numpy())
