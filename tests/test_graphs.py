"""minitorch.graphs on the CPU: StepInputs (views of one buffer, one upload per step, the checks),
StepSeed (no-ops on the CPU that leave the random numbers as they are without it), StepGraphs'
capture/replay bookkeeping against a stand-in for torch.cuda, and a step replayed from an emulated
capture (tests/graph_replay.py) that reads each step's uploaded inputs."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, List

import numpy as np
import pytest
from graph_replay import EMULATED, EmulatedGraphs
from minitorch_testing import FAST

import minitorch
from minitorch import StepGraphs, StepInputs, StepSeed, graphs


def test_parts_are_views_of_one_buffer_filled_by_one_upload(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = StepInputs({"tokens": (2, 3), "weights": (6,), "share": (1,)}, FAST)
    assert inputs.shapes == {"tokens": (2, 3), "weights": (6,), "share": (1,)}
    tokens = inputs["tokens"]
    assert tokens is inputs["tokens"] and tokens.shape == (2, 3) and inputs["share"].shape == (1,)
    uploads: List[int] = []
    upload = minitorch.FastOps.storage_upload
    monkeypatch.setattr(minitorch.FastOps, "storage_upload", staticmethod(lambda s, a: (uploads.append(a.size), upload(s, a))))
    inputs.upload(tokens=np.arange(6).reshape(2, 3), weights=np.full(6, 0.5), share=0.25)
    assert uploads == [13]
    np.testing.assert_array_equal(tokens.to_numpy(), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(inputs["weights"].to_numpy(), np.full(6, 0.5))
    np.testing.assert_array_equal(inputs["share"].to_numpy(), [0.25])
    # parts not named keep their values; a 0-d array serves a (1,) part like a number
    inputs.upload(share=np.float64(2.0))
    np.testing.assert_array_equal(tokens.to_numpy(), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(inputs["share"].to_numpy(), [2.0])
    assert uploads == [13, 13]


def test_step_inputs_errors() -> None:
    inputs = StepInputs({"tokens": (2, 2), "lr": (1,)}, FAST)
    with pytest.raises(KeyError, match=r"no part 'ids'; the parts are \['tokens', 'lr'\]"):
        inputs.upload(ids=np.zeros((2, 2)))
    with pytest.raises(KeyError, match="has no part 'ids'"):
        inputs["ids"]
    with pytest.raises(ValueError, match=r"part 'tokens' takes numbers of shape \(2, 2\), got int64 \(4,\)"):
        inputs.upload(tokens=np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match=r"part 'tokens' takes numbers of shape \(2, 2\), got float64 \(\)"):
        inputs.upload(tokens=1.0)
    with pytest.raises(ValueError, match=r"part 'tokens' takes numbers .* got <U1"):
        inputs.upload(tokens=np.full((2, 2), "a"))
    with pytest.raises(ValueError, match=r"part 'tokens' holds the integer 16777217, beyond 16777216"):
        inputs.upload(tokens=np.full((2, 2), 2**24 + 1))
    with pytest.raises(ValueError, match=r"part 'x' has a negative size in shape \(2, -1\)"):
        StepInputs({"x": (2, -1)}, FAST)
    with pytest.raises(ValueError, match="at least one value"):
        StepInputs({"x": (0,)}, FAST)


def _dropout_draws(seed: StepSeed) -> np.ndarray:
    x = minitorch.ones((4, 8), backend=FAST)
    rows = []
    for _ in range(3):
        seed.advance()
        with seed.scope():
            rows.append(minitorch.nn.dropout(x, 0.5).to_numpy())
    return np.stack(rows)


def test_step_seed_on_the_cpu_leaves_the_random_numbers_as_without_it() -> None:
    minitorch.manual_seed(3)
    with_seed = _dropout_draws(StepSeed(FAST))
    state = minitorch.get_rng_state()
    minitorch.manual_seed(3)
    x = minitorch.ones((4, 8), backend=FAST)
    without = np.stack([minitorch.nn.dropout(x, 0.5).to_numpy() for _ in range(3)])
    np.testing.assert_array_equal(with_seed, without)
    assert minitorch.get_rng_state() == state
    assert not np.array_equal(with_seed[0], with_seed[1])


class _FakeCuda:
    """torch.cuda's graph API as StepGraphs uses it: captures are counted, a replay calls nothing."""

    def __init__(self) -> None:
        self.capturing = False
        self.replays = 0
        self.resets = 0
        cuda = self

        class CUDAGraph:
            def replay(self) -> None:
                cuda.replays += 1

            def reset(self) -> None:
                cuda.resets += 1

            def pool(self) -> str:
                return "pool"

        @contextmanager
        def graph(g: Any, pool: Any = None, capture_error_mode: str = "") -> Any:
            assert capture_error_mode == "thread_local"
            cuda.capturing = True
            try:
                yield
            finally:
                cuda.capturing = False

        self.CUDAGraph, self.graph = CUDAGraph, graph


def test_step_graphs_run_eagerly_then_capture_then_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _FakeCuda()
    monkeypatch.setattr(graphs, "runtime", lambda: SimpleNamespace(torch=SimpleNamespace(cuda=cuda)))
    runs: List[bool] = []
    g = StepGraphs(True)
    assert g.run("a", lambda: runs.append(cuda.capturing)) is False
    assert runs == [False, True] and g.captured == 1
    assert g.run("a", lambda: runs.append(cuda.capturing)) is True
    assert runs == [False, True] and cuda.replays == 1 and g.replayed == 1
    assert g.run("b", lambda: runs.append(cuda.capturing), capture=False) is False
    assert g.run("b", lambda: runs.append(cuda.capturing), capture=False) is False
    assert runs == [False, True, False, False] and g.captured == 1
    g.release()
    assert cuda.resets == 1
    assert g.run("a", lambda: runs.append(cuda.capturing)) is False and g.captured == 2


def test_step_graphs_disabled_run_every_step_eagerly() -> None:
    runs: List[int] = []
    g = StepGraphs(False)
    assert [g.run("a", lambda: runs.append(1)) for _ in range(3)] == [False] * 3
    assert runs == [1, 1, 1] and g.captured == 0 and g.replayed == 0


def test_a_replayed_step_reads_each_steps_uploaded_inputs() -> None:
    inputs = StepInputs({"x": (2, 3), "scale": (1,)}, EMULATED)
    out = minitorch.zeros((2, 3), backend=EMULATED)
    g = EmulatedGraphs(True)

    def step() -> None:
        with minitorch.no_grad():
            out.copy_((inputs["x"] * inputs["scale"]).relu())

    results = []
    for k in range(4):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) - k
        inputs.upload(x=x, scale=k + 1)
        replayed = g.run("step", step)
        results.append(replayed)
        np.testing.assert_array_equal(out.to_numpy(), np.maximum(x * (k + 1), 0.0))
    assert results == [False, True, True, True]
