"""The programs' --dtype: the precision a model's forward passes run in.

fp32: float32 throughout.  bf16: minitorch.autocast(bfloat16, low_activations=True): the
parameters stay float32 master weights, updated by a float32 AdamW; the products read each weight's
bfloat16 working copy (rewritten after every update, see minitorch.autocast); activations are
bfloat16 between kernels; LayerNorm and softmax statistics, reductions and the losses are float32;
weight gradients are float32.  Checkpoints hold the float32 masters, so a run resumes in either
dtype.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import minitorch

DTYPES = ("fp32", "bf16")
DTYPE_HELP = (
    "fp32: float32 throughout; bf16: float32 master weights and AdamW, bf16 working copies of the weights and "
    "bf16 activations between kernels, float32 statistics, reductions and losses (checkpoints keep the float32 "
    "masters: a run resumes in either dtype)"
)


def compute_precision(dtype: str) -> ContextManager[object]:
    """The context a forward pass (training, validation, decoding) runs in for --dtype `dtype`."""
    if dtype == "bf16":
        return minitorch.autocast(minitorch.bfloat16, low_activations=True)
    if dtype == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"--dtype must be one of {DTYPES}, got {dtype!r}")
