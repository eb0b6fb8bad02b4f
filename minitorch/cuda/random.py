"""Bindings of random_kernel.so (src/random_kernel.cu): Philox uniform numbers on the device."""

from __future__ import annotations

import ctypes

from ..tensor_data import TensorData
from .combine import out_layout
from .layout import MtLayout
from .runtime import check, ptr, runtime

SIGNATURES = {"launch_uniform": (ctypes.c_int, [ctypes.c_void_p, MtLayout, ctypes.c_ulonglong, ctypes.c_void_p])}


def uniform(out: TensorData, seed: int) -> None:
    """Uniform [0, 1) values generated on the device; a function of (seed mod 2^64, element ordinal)."""
    if out.size:
        rt = runtime()
        lib = rt.lib("random_kernel", SIGNATURES)
        check(lib.launch_uniform(ptr(out), out_layout(out), int(seed) & 0xFFFFFFFFFFFFFFFF, rt.stream()), lib, "uniform")
