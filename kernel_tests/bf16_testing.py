"""Helpers of the bfloat16 kernel tests: bfloat16 CUDA inputs shared with torch, and the accuracy
bound every bfloat16 kernel meets: its error against a float64 reference computed from the same
(bfloat16-rounded) inputs is at most twice the error of torch's own bfloat16 op on them."""

from __future__ import annotations

from typing import Any

import numpy as np

import minitorch

# An error this small passes whatever torch's: both results are exact up to float32 rounding.
EXACT = 1e-6


def bf16_pair(arr: np.ndarray) -> Any:
    """(minitorch bfloat16 CUDA tensor, the torch bfloat16 tensor it shares memory with) of arr's values
    rounded to bfloat16."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).cuda().bfloat16()
    return minitorch.from_torch(t), t


def values(t: Any) -> np.ndarray:
    """A minitorch or torch tensor's values as float64 numpy."""
    if isinstance(t, minitorch.Tensor):
        t = t.to_torch()
    return t.detach().double().cpu().numpy()


def assert_bf16_bound(ours: Any, theirs: Any, ref: Any, what: str, ratio: float = 2.0) -> None:
    """max |ours - ref| <= ratio * max |theirs - ref| (+ EXACT), ours and theirs being our and torch's
    bfloat16 results of the op whose float64 result on the same inputs is ref.  Prints one line of the
    two errors and the bound (`pytest -s kernel_tests/test_bf16_*.py | grep "bf16 error"` lists them)."""
    ref64 = values(ref)
    ours64, theirs64 = values(ours), values(theirs)
    assert ours64.shape == ref64.shape, f"{what}: shape {ours64.shape}, expected {ref64.shape}"
    assert np.isfinite(ours64).all(), f"{what}: non-finite values"
    err = float(np.abs(ours64 - ref64).max()) if ref64.size else 0.0
    torch_err = float(np.abs(theirs64 - ref64).max()) if ref64.size else 0.0
    bound = ratio * torch_err + EXACT * max(1.0, float(np.abs(ref64).max()))
    print(f"bf16 error | {what} | ours {err:.3g} | torch {torch_err:.3g} | bound {bound:.3g}")  # pytest -s shows it
    assert err <= bound, f"{what}: max error {err:.3g} exceeds {ratio} x torch bfloat16's ({bound:.3g})"
