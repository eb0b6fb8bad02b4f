"""CudaKernelOps: the CUDA backend's op table.  Tensors live on the GPU; every number is computed
by our kernels (src/*.cu), bound in the `minitorch.cuda` package, one module per library.

Storage is a 1-D `torch` tensor from PyTorch's caching allocator in the dtype's own format (float32,
bfloat16, float16; bool as float32); ops take TensorData, pass raw device pointers and shapes/strides
by value, and launch on PyTorch's current stream.  No op copies between host and device: data
crosses only in `storage_from_numpy` / `storage_to_numpy`, which `transfer_stats()` counts.  Nothing
is loaded at import, so `import minitorch` works without a GPU; the first CUDA storage loads the
kernels and names the fix when they are missing.

Dtypes: casts and copies of every dtype run in convert_kernel.so; a product dispatches on its dtype
in `matmul.matrix_multiply`, a Linear's in `matmul.linear_fw` / `linear_bw`; every other op has
float32 kernels only and raises NoKernelError ("minitorch: no bfloat16 CUDA kernel for 'exp' (cast
with .float() first)") for a tensor stored in another format, before anything runs: nothing is
computed in another precision than asked.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .cuda import (
    attention, beam_search, classifier, combine, convert, embedding, kv_cache, layernorm, matmul, optimizer, random,
    softmax, staging, topk,
)  # fmt: skip
from .cuda.runtime import (
    INT_LIMIT,
    CudaKernelError,
    CudaShapeError,
    count_transfer,
    cuda_memory_stats,
    require_float32,
    reset_transfer_stats,
    runtime,
    storage_dtype,
    storage_empty,
    transfer_stats,
    unavailable_reason,
)
from .tensor_ops import TensorOps

__all__ = [
    "CudaKernelOps", "CudaKernelError", "CudaShapeError", "cuda_memory_stats", "transfer_stats",
    "reset_transfer_stats", "unavailable_reason",
]  # fmt: skip


def _from_numpy(arr: np.ndarray) -> Any:
    """Host->device copy of a 1-D float32 array (counted in transfer_stats)."""
    rt = runtime()
    host = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    if host.size >= INT_LIMIT:
        raise CudaShapeError(f"a CUDA tensor of {host.size} elements exceeds the limit of {INT_LIMIT - 1}")
    count_transfer("h2d", host.nbytes)
    return rt.torch.from_numpy(host).to(rt.device)


def _to_numpy(storage: Any) -> np.ndarray:
    """Device->host copy of a buffer as float32 values (counted in transfer_stats); waits for
    queued kernels.  A 16-bit buffer crosses as its words, widened on the host."""
    count_transfer("d2h", storage.numel() * storage.element_size())
    dtype = storage_dtype(storage)
    if dtype.rounds:
        return dtype.decode(storage.detach().view(runtime().torch.int16).cpu().numpy().view(np.uint16))
    return storage.detach().cpu().numpy()


def _float32_only(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, refusing with NoKernelError (naming op) tensors stored in a format its kernels do not read."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        require_float32(op, *args, *kwargs.values())
        return fn(*args, **kwargs)

    return checked


def _float32_ops(factory: Callable[..., Any], names: Any = None) -> Any:
    """A map/zip/reduce factory whose ops are _float32_only, named by their operators function
    (names: other names for some, e.g. reduce(add) is 'sum')."""
    return staticmethod(lambda fn, *args: _float32_only((names or {}).get(fn.__name__, fn.__name__), factory(fn, *args)))


def _hook(name: str, fn: Callable[..., Any]) -> Any:
    return staticmethod(_float32_only(name, fn))


class CudaKernelOps(TensorOps):
    """The CUDA backend: device storage from PyTorch's caching allocator, compute in our kernels."""

    is_cuda = True
    emulates_dtypes = False

    storage_empty = staticmethod(storage_empty)
    storage_from_numpy = staticmethod(_from_numpy)
    storage_to_numpy = staticmethod(_to_numpy)
    storage_upload = staticmethod(staging.upload_storage)
    cast = staticmethod(convert.cast)
    matrix_multiply = staticmethod(matmul.matrix_multiply)  # dispatches on dtype itself
    fill = _hook("fill", combine.fill)
    arange = _hook("arange", combine.arange)
    uniform = _hook("uniform", random.uniform)
    map = _float32_ops(combine.map_op)
    map_scalar = _float32_ops(combine.map_scalar_op)
    zip = _float32_ops(combine.zip_op)
    reduce = _float32_ops(combine.reduce_op, {"add": "sum", "mul": "prod"})

    # kernel hooks of the fused ops
    linear_fw = staticmethod(matmul.linear_fw)  # dispatches on dtype itself, as linear_bw
    linear_bw = staticmethod(matmul.linear_bw)
    embedding_fw = _hook("embedding_fw", embedding.embedding_fw)
    embedding_bw = _hook("embedding_bw", embedding.embedding_bw)
    attn_softmax_fw = _hook("attn_softmax_fw", softmax.attn_softmax_fw)
    attn_softmax_bw = _hook("attn_softmax_bw", softmax.attn_softmax_bw)
    layernorm_fw = _hook("layernorm_fw", layernorm.layernorm_fw)
    layernorm_bw = _hook("layernorm_bw", layernorm.layernorm_bw)
    attention_fw = _hook("attention_fw", attention.attention_fw)
    attention_bw = _hook("attention_bw", attention.attention_bw)
    linear_cross_entropy_fw = _hook("linear_cross_entropy_fw", classifier.linear_cross_entropy_fw)
    adamw_step = _hook("adamw_step", optimizer.adamw_step)
    adamw_multi = staticmethod(optimizer.MultiTensorAdamW)  # its update refuses other dtypes
    gradient_pack = _hook("gradient_pack", optimizer.gradient_pack)
    slot_write = _hook("slot_write", kv_cache.slot_write)
    slot_attention = _hook("slot_attention", kv_cache.slot_attention)
    gather_rows = _hook("gather_rows", embedding.gather_rows)
    top_k = _hook("top_k", topk.top_k)
    beam_search_step = _hook("beam_search_step", beam_search.beam_search_step)
