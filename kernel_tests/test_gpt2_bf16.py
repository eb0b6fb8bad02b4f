"""A GPT-2 training step under --dtype bf16 on CUDA against PyTorch autocast bf16 from the same weights.

A small GPT-2 (GPT-2's initialisation, llm.c's layout) computes one step's loss and gradients in
minitorch with the programs' bf16 mode (project/common/precision.py: float32 masters, bf16 working
copies and activations; fused kernels, attention and loss, the programs' defaults) and in PyTorch
under torch.autocast(bfloat16) (benchmarks/gpt2_torch_peer.py's model: SDPA attention, float32
residual stream); the reference is the same PyTorch model in float64. Each gradient tensor's error
(max|g - ref| / max|ref|) must stay within RATIO x PyTorch autocast's own error on it, and the loss's
within 2x. RATIO is 4, not 2: the residual stream here is bf16 (llm.c's choice, half the bytes), which
torch autocast keeps in float32, and the LayerNorm weights' gradients feel that rounding of their
inputs (the CPU emulation of this test's model measured 1.0-1.7x on most tensors, 2.4x on the final
LayerNorm's weight). The ratios are printed (pytest -s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import minitorch
from project.common.precision import compute_precision
from project.gpt2.llmc import GPT2Config, PARAMETER_NAMES
from project.gpt2.model import GPT2, gpt2_init_params

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from gpt2_torch_peer import TorchGPT2  # noqa: E402

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
CONFIG = GPT2Config.with_padded_vocab(max_seq_len=256, vocab_size=1000, num_layers=3, num_heads=4, channels=128)
B, T = 4, 256
FLOOR = 1e-5
RATIO = 4.0


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    if not np.isfinite(out).all():
        return float("inf")
    return float(np.abs(out - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def torch_step(params, ids, targets, dtype, autocast: bool):
    model = TorchGPT2(CONFIG)
    model.load_llmc(params)
    model.to(device="cuda", dtype=dtype)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = model(torch.from_numpy(ids).cuda(), torch.from_numpy(targets).cuda())
    loss.backward()
    return loss.item(), model.llmc_grads()


def test_gpt2_bf16_step_gradients_match_torch_autocast() -> None:
    params = gpt2_init_params(CONFIG, seed=0)
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, CONFIG.vocab_size, (B, T)), rng.integers(0, CONFIG.vocab_size, (B, T))
    exact_loss, exact = torch_step(params, ids, targets, torch.float64, autocast=False)
    theirs_loss, theirs = torch_step(params, ids, targets, torch.float32, autocast=True)

    model = GPT2(CONFIG, backend=CUDA, use_fused_kernel=True, attention="fused")
    model.load_llmc_params(params)
    with compute_precision("bf16"):
        loss = model.loss(model.token_ids(ids), model.token_ids(targets), "fused")
    loss.backward()
    assert {p.value.grad.dtype for p in model.parameters()} == {minitorch.float32}
    mine = model.llmc_grads()

    bound = max(2.0 * abs(theirs_loss - exact_loss), FLOOR * abs(exact_loss))
    assert abs(loss.item() - exact_loss) <= bound, f"loss {loss.item()} vs {exact_loss} (torch autocast {theirs_loss})"
    for name in PARAMETER_NAMES:
        ref = exact[name][: CONFIG.vocab_size] if name == "wte" else exact[name]
        m = mine[name][: CONFIG.vocab_size] if name == "wte" else mine[name]
        t = theirs[name][: CONFIG.vocab_size] if name == "wte" else theirs[name]
        torch_error, error = rel_err(t, ref), rel_err(m, ref)
        print(f"d{name}: error {error:.3g}, torch autocast's {torch_error:.3g} ({error / max(torch_error, 1e-30):.2f}x)")
        assert error <= max(RATIO * torch_error, FLOOR), f"d{name}: error {error:.3g} vs torch autocast's {torch_error:.3g}"
