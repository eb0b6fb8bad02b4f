"""Stream-K in the bf16 Hopper matmul (src/matmul/stream_k.cuh, on bf16_wgmma.cuh's 128-row tiles): the
last tiles' K tiles dealt out in equal shares, a tile shared by several blocks finished by the block
holding its first K tiles with the partial tiles the others leave in the workspace. Forced by
MINITORCH_BF16_STREAM_K=1 wherever a 128-row shape's tiles allow it (a last wave that leaves SMs idle),
and checked against torch float64 within 2x torch's own bf16 error (test_matmul_bf16.check_product).
"""

from __future__ import annotations

import pytest

from minitorch.cuda import matmul_bf16

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

from test_matmul_bf16 import check_product, operand  # noqa: E402

# bf16_tma.cuh's 128-row shapes: 128 x 256, 128 x 192, 128 x 128
STREAM_K_SHAPES = [0, 1, 2]
HOPPER = torch.cuda.get_device_capability() == (9, 0)


def stream_k_bytes() -> int:
    """The workspace of a stream-K product (stream_k.cuh): a 128 x 256 float32 partial tile and 8 flags a SM."""
    return 4 * torch.cuda.get_device_properties(0).multi_processor_count * (128 * 256 + 16)


@pytest.fixture
def stream_k(monkeypatch):
    monkeypatch.setenv("MINITORCH_BF16_STREAM_K", "1")
    return monkeypatch


@pytest.mark.parametrize("shape", STREAM_K_SHAPES)
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_stream_k_layouts(stream_k, shape: int, a_t: bool, b_t: bool) -> None:
    """Each 128-row shape with stream-K in every operand layout: a few tiles and a long K (every tile shared
    by many blocks, most of them holding a middle part only), partial tiles at every edge, both output
    dtypes."""
    stream_k.setenv("MINITORCH_BF16_TMA_SHAPE", str(shape))
    gen = torch.Generator(device="cuda").manual_seed(300 + shape + 8 * a_t + 16 * b_t)
    a, b = operand(gen, (200, 8192), a_t, True), operand(gen, (8192, 296), b_t, True)
    if HOPPER:  # the planner took stream-K
        assert matmul_bf16.workspace_bytes(200, 296, 8192, 1, (*a.stride(), *b.stride())) == stream_k_bytes()
    check_product(a, b)
    check_product(operand(gen, (389, 1000), a_t, True), operand(gen, (1000, 264), b_t, True), torch.float32)


@pytest.mark.parametrize("activation", [None, "gelu", "relu"])
def test_stream_k_epilogues_and_batches(stream_k, activation) -> None:
    """The epilogues on shared tiles (+ bias, activation with the pre-activation kept; padded output rows
    left untouched) and a broadcast batch, whose tiles the shares cross from one matrix into the next."""
    gen = torch.Generator(device="cuda").manual_seed(310)
    a, b = operand(gen, (300, 2048), False, True), operand(gen, (2048, 520), True, True)
    check_product(a, b, bias=True, activation=activation, pad=8)
    check_product(operand(gen, (3, 136, 640), False, True), operand(gen, (640, 264), False, True))


def test_stream_k_after_whole_waves(stream_k) -> None:
    """A product of several waves (GPT-2's fc layer, 384 tiles of 128 x 256 on 132 SMs): the whole waves
    but the last run as they are, then the rest's K tiles in shares; also unforced, as the planner takes
    it."""
    gen = torch.Generator(device="cuda").manual_seed(320)
    a, b = operand(gen, (4096, 768), False, True), operand(gen, (768, 3072), False, True)
    check_product(a, b, bias=True)
    stream_k.delenv("MINITORCH_BF16_STREAM_K")
    check_product(operand(gen, (4096, 4096), False, True), operand(gen, (4096, 4096), False, True))


def test_stream_k_graph_replay(stream_k) -> None:
    """A stream-K product captured in a CUDA graph: every replay gives the eager result's bits, also after
    the workspace (partial tiles and flags) held other data; the flags a replay raises it also clears."""
    gen = torch.Generator(device="cuda").manual_seed(330)
    M, N, K = 256, 512, 8192
    a, b = operand(gen, (M, K), False, True), operand(gen, (K, N), True, True)
    strides = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    ws = torch.empty(matmul_bf16.workspace_bytes(M, N, K, 1, strides), dtype=torch.uint8, device="cuda")
    eager = matmul_bf16.matmul(a, b, out_dtype=torch.float32, workspace=ws)
    out = torch.full((M, N), float("nan"), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        matmul_bf16.matmul(a, b, out=out, workspace=ws)
    for fill in (0, 255, 7, None, None):
        if fill is not None:
            ws.fill_(fill)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
