"""Bindings of optimizer_kernel.so (src/optimizer_kernel.cu): the fused AdamW update of one tensor,
the multi-tensor step (global gradient norm, clip and AdamW for all parameters in a few
launches, reading the learning rate and step count from device memory), and the gradient pack of
data-parallel training (many gradients scaled into their bucket slots in one launch).

Mixed precision: parameters and moments are float32; a gradient may be float32 or bfloat16, and a
parameter may have a bfloat16 working copy that the multi-tensor update rewrites from the new
float32 values in the same pass."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ..tensor_data import TensorData
from .combine import contiguous
from ..dtypes import bfloat16
from .runtime import (
    BUILD_HINT, KERNEL_STORAGE, Runtime, check, on_load, ptr, require_float32, require_storage, runtime, storage_code,
)  # fmt: skip
from .staging import uploader

MAX_TENSORS = 160  # kMaxTensors of optimizer_kernel.cu
CHUNK = 32768  # kChunk
COEFFICIENT_FLOATS = 10  # sizeof(AdamWCoefficients) / 4; grad_norm is the last


class TensorList(ctypes.Structure):
    """The by-value TensorList of optimizer_kernel.cu."""

    _fields_ = [
        ("param", ctypes.c_void_p * MAX_TENSORS),
        ("grad", ctypes.c_void_p * MAX_TENSORS),
        ("exp_avg", ctypes.c_void_p * MAX_TENSORS),
        ("exp_avg_sq", ctypes.c_void_p * MAX_TENSORS),
        ("working", ctypes.c_void_p * MAX_TENSORS),
        ("numel", ctypes.c_longlong * MAX_TENSORS),
        ("grad_format", ctypes.c_int * MAX_TENSORS),
        ("block_start", ctypes.c_int * (MAX_TENSORS + 1)),
        ("count", ctypes.c_int),
    ]


_P, _I, _F, _D, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_longlong
SIGNATURES = {
    "launch_adamw": (_I, [_P, _P, _P, _P, _LL, _D, _D, _D, _D, _D, _I, _P]),
    "launch_grad_sumsq": (_I, [TensorList, _P, _P]),
    "launch_adamw_prepare": (_I, [_P, _I, _P, _D, _D, _D, _D, _D, _P, _P]),
    "launch_adamw_multi": (_I, [TensorList, _P, _P]),
    "launch_gradient_pack": (_I, [TensorList, _F, _I, _P]),
    "adamw_max_tensors": (_I, []),
    "adamw_chunk": (_LL, []),
    "adamw_coefficient_floats": (_I, []),
}


def _lib(rt: Runtime) -> ctypes.CDLL:
    return rt.lib("optimizer_kernel", SIGNATURES)


@on_load
def _check_sizes(rt: Runtime) -> None:
    lib = _lib(rt)
    built = (lib.adamw_max_tensors(), lib.adamw_chunk(), lib.adamw_coefficient_floats())
    if built != (MAX_TENSORS, CHUNK, COEFFICIENT_FLOATS):
        raise RuntimeError(f"optimizer_kernel.so sizes {built} differ from the binding's "
                           f"{(MAX_TENSORS, CHUNK, COEFFICIENT_FLOATS)}; {BUILD_HINT}")


def adamw_step(
    param: TensorData, grad: TensorData, exp_avg: TensorData, exp_avg_sq: TensorData,
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
) -> None:  # fmt: skip
    """param, exp_avg and exp_avg_sq (contiguous) updated in place in one pass (28 bytes per element)."""
    rt = runtime()
    lib = _lib(rt)
    g = contiguous(grad)
    code = lib.launch_adamw(
        ptr(param), ptr(g), ptr(exp_avg), ptr(exp_avg_sq), param.size, lr, beta1, beta2, eps, weight_decay,
        int(step), rt.stream(),
    )  # fmt: skip
    check(code, lib, f"adamw_step {param.shape}")


class MultiTensorAdamW:
    """Device state of the multi-tensor step: the [lr, step] values the host uploads, the norm
    partials and the coefficients (whose last float is the global gradient norm)."""

    def __init__(self) -> None:
        rt = runtime()
        self.hyper = rt.torch.zeros(2, dtype=rt.torch.float64, device=rt.device)
        self.coefficients = rt.buffer(COEFFICIENT_FLOATS)
        self.partials: Any = None

    def set_step(self, lr: float, step: int) -> None:
        """Queue the learning rate and step count of the next `update` (no wait on the GPU)."""
        uploader().upload(self.hyper, np.array([lr, step], dtype=np.float64))

    def grad_norm(self) -> TensorData:
        """The global gradient norm of the last update, before clipping, as a (1,) TensorData."""
        return TensorData(self.coefficients[COEFFICIENT_FLOATS - 1 :], (1,))

    def update(
        self, params: Sequence[TensorData], grads: Sequence[TensorData], exp_avgs: Sequence[TensorData],
        exp_avg_sqs: Sequence[TensorData], max_norm: float, beta1: float, beta2: float, eps: float,
        weight_decay: float, reduce_partials: Optional[Callable[[Any], None]] = None,
        workings: Optional[Sequence[Optional[TensorData]]] = None,
    ) -> None:  # fmt: skip
        """Norm, clip (max_norm <= 0: off) and AdamW of every parameter; all contiguous; params and
        moments float32, grads float32 or bfloat16.
        reduce_partials(partials): called on the torch buffer of the norm's partial sums of squares
        before they are added up, to sum them in place over the processes that each update a shard
        of the parameters (equal shards give equal partial counts), so the norm and clip are global.
        workings[i] (contiguous bfloat16 of params[i]'s size, or None) is overwritten with the updated
        params[i] rounded to bfloat16."""
        require_float32("adamw_multi", params, exp_avgs, exp_avg_sqs)
        require_storage("adamw_multi", KERNEL_STORAGE, grads)
        workings = list(workings) if workings is not None else [None] * len(params)
        for p, w in zip(params, workings):
            if w is not None and (w.dtype.storage != bfloat16.storage or w.size != p.size or not w.is_contiguous()):
                raise ValueError(f"adamw_multi: working copy {w.dtype.name} {w.shape} for a parameter of shape {p.shape}; "
                                 "it must be a contiguous bfloat16 tensor of the same size")
        rt = runtime()
        lib = _lib(rt)
        grads = [contiguous(g) for g in grads]
        lists = _tensor_lists(params, grads, exp_avgs, exp_avg_sqs, workings)
        n_partials = sum(l.block_start[l.count] for l in lists)
        if self.partials is None or self.partials.numel() < n_partials:
            self.partials = rt.buffer(n_partials)
        stream = rt.stream()
        offset = 0
        for l in lists:
            code = lib.launch_grad_sumsq(l, self.partials.data_ptr() + 4 * offset, stream)
            check(code, lib, "gradient norm")
            offset += l.block_start[l.count]
        if reduce_partials is not None:
            reduce_partials(self.partials[:n_partials])
        code = lib.launch_adamw_prepare(
            self.partials.data_ptr(), n_partials, self.hyper.data_ptr(), max_norm, beta1, beta2, eps, weight_decay,
            self.coefficients.data_ptr(), stream,
        )  # fmt: skip
        check(code, lib, "adamw prepare")
        for l in lists:
            check(lib.launch_adamw_multi(l, self.coefficients.data_ptr(), stream), lib, "multi-tensor adamw")


def gradient_pack(
    slots: Sequence[TensorData], grads: Sequence[TensorData], scale: float, accumulate: bool = False
) -> None:
    """slots[i] <- grads[i] * scale (accumulate: slots[i] += grads[i] * scale) for every i (contiguous
    slots of equal sizes), in one launch per MAX_TENSORS gradients: the copy of data-parallel
    gradients into their bucket, or their sum over the micro-batches of a step."""
    rt = runtime()
    lib = _lib(rt)
    for slot, grad in zip(slots, grads):
        if slot.size != grad.size:
            raise ValueError(f"gradient_pack: gradient of shape {grad.shape} for a slot of shape {slot.shape}")
    grads = [contiguous(g) for g in grads]
    for l in _tensor_lists(slots, grads):
        check(lib.launch_gradient_pack(l, scale, int(accumulate), rt.stream()), lib, f"gradient pack of {l.count} tensors")


def _tensor_lists(*columns: Sequence[Optional[TensorData]]) -> List[TensorList]:
    """Lists of the rows (param, grad[, exp_avg, exp_avg_sq, working]); absent columns and None
    working copies stay null."""
    lists = []
    rows = list(zip(*columns))
    for start in range(0, len(rows), MAX_TENSORS):
        l = TensorList()
        l.block_start[0] = 0
        for t, (p, g, *rest) in enumerate(rows[start : start + MAX_TENSORS]):
            l.param[t], l.grad[t], l.grad_format[t] = ptr(p), ptr(g), storage_code(g)
            if rest:
                l.exp_avg[t], l.exp_avg_sq[t] = ptr(rest[0]), ptr(rest[1])
                l.working[t] = None if rest[2] is None else ptr(rest[2])
            l.numel[t] = p.size
            l.block_start[t + 1] = l.block_start[t] + -(-p.size // CHUNK)
        l.count = min(MAX_TENSORS, len(rows) - start)
        lists.append(l)
    return lists
