"""How float32 matrix products are computed, chosen as in PyTorch: the matmul library's products and
those inside the fused attention kernels.

"highest" (the default): on the CUDA tensor cores in 3xTF32 (each operand split into two TF32
parts, three products): float32 accuracy.  "high": one TF32 product per pair (10-bit mantissas,
like torch.backends.cuda.matmul.allow_tf32 = True): faster, errors near 1e-3 relative.  The CPU
backends always compute in float32; the setting changes nothing there.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

PRECISIONS = ("highest", "high")
# The training programs' --matmul-precision help.
PRECISION_HELP = "CUDA float32 matmuls and fused attention: highest = 3xTF32 (float32 accuracy), high = one TF32 product"
_precision = ["highest"]


def set_float32_matmul_precision(precision: str) -> None:
    """Choose "highest" (3xTF32, float32 accuracy) or "high" (one TF32 product) for the CUDA matmuls
    and the products inside the fused attention kernels."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"float32 matmul precision must be one of {PRECISIONS}, got {precision!r} "
            f"(minitorch has no bfloat16 'medium' mode)"
        )
    _precision[0] = precision


def get_float32_matmul_precision() -> str:
    """The current float32 matmul precision: "highest" or "high"."""
    return _precision[0]


@contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """Run the block under this precision, then restore the one set before (also on errors)."""
    before = get_float32_matmul_precision()
    set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        set_float32_matmul_precision(before)


def precision_code() -> int:
    """The kernels' code of the current precision (its index in PRECISIONS)."""
    return PRECISIONS.index(_precision[0])
