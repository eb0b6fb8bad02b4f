"""Bindings of random_kernel.so (src/random_kernel.cu): Philox uniform numbers on the device."""

from __future__ import annotations

import ctypes

from .. import rng
from ..tensor_data import TensorData
from .combine import out_layout
from .layout import MtLayout
from .runtime import check, ptr, runtime

_P, _I, _U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong
SIGNATURES = {
    "launch_uniform": (_I, [_P, MtLayout, _U64, _P]),
    "launch_uniform_from": (_I, [_P, MtLayout, _P, _U64, _P]),
}


def uniform(out: TensorData, seed: int) -> None:
    """Uniform [0, 1) values generated on the device; a function of (seed mod 2^64, element ordinal).
    Inside `minitorch.rng.seeds_from_device` the key is read from the device buffer when the kernel
    runs and `seed` (the call's ordinal) selects the stream."""
    if out.size:
        rt = runtime()
        lib = rt.lib("random_kernel", SIGNATURES)
        seed_buffer = rng.device_seed()
        if seed_buffer is None:
            code = lib.launch_uniform(ptr(out), out_layout(out), int(seed) & 0xFFFFFFFFFFFFFFFF, rt.stream())
        else:
            code = lib.launch_uniform_from(ptr(out), out_layout(out), seed_buffer.data_ptr(), int(seed), rt.stream())
        check(code, lib, "uniform")
