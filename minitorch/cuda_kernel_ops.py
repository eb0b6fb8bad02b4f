"""CudaKernelOps: the CUDA backend's op table.  Tensors live on the GPU; every number is computed
by our kernels (src/*.cu), bound in the `minitorch.cuda` package, one module per library.

Storage is a 1-D `torch` tensor from PyTorch's caching allocator in the dtype's own format (float32,
bfloat16, float16; bool as float32); ops take TensorData, pass raw device pointers and shapes/strides
by value, and launch on PyTorch's current stream.  No op copies between host and device: data
crosses only in `storage_from_numpy` / `storage_to_numpy`, which `transfer_stats()` counts.  Nothing
is loaded at import, so `import minitorch` works without a GPU; the first CUDA storage loads the
kernels and names the fix when they are missing.

Dtypes: casts and copies of every dtype run in convert_kernel.so; a product dispatches on its dtype
in `matmul.matrix_multiply`, a Linear's in `matmul.linear_fw` / `linear_bw`; map/zip/reduce have
float32 and bfloat16 kernels (float32 math); fused attention (`attention.attention_fw/bw`), the
fused linear cross-entropy (`classifier.linear_cross_entropy_fw`) and the KV cache
(`kv_cache.slot_write` and `slot_attention`) dispatch in their bindings, on float32 or bfloat16;
every other op has the kernels its entry below names and raises NoKernelError ("minitorch: no
float16 CUDA kernel for 'exp' (cast with .float() first)") for a tensor stored in another format,
before anything runs: nothing is computed in another precision than asked.
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
    KERNEL_STORAGE,
    require_storage,
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


def _checked(op: str, fn: Callable[..., Any], formats: Any = ("float32",)) -> Callable[..., Any]:
    """fn, refusing with NoKernelError (naming op) tensors stored in a format outside `formats`, the
    ones its kernels read."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        require_storage(op, formats, *args, *kwargs.values())
        return fn(*args, **kwargs)

    return checked


def _templated_ops(factory: Callable[..., Any], names: Any = None) -> Any:
    """A map/zip/reduce factory whose ops refuse formats outside KERNEL_STORAGE, named by their
    operators function (names: other names for some, e.g. reduce(add) is 'sum')."""
    return staticmethod(
        lambda fn, *args: _checked((names or {}).get(fn.__name__, fn.__name__), factory(fn, *args), KERNEL_STORAGE)
    )


def _hook(name: str, fn: Callable[..., Any]) -> Any:
    return staticmethod(_checked(name, fn))


def _activation_hook(name: str, fn: Callable[..., Any], activations: int) -> Any:
    """A hook whose first `activations` arguments may be stored in any of KERNEL_STORAGE (its
    kernels are templated on their format) and the others (weights, statistics) as float32 only."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        require_storage(name, KERNEL_STORAGE, *args[:activations])
        require_storage(name, ("float32",), *args[activations:], *kwargs.values())
        return fn(*args, **kwargs)

    return staticmethod(checked)


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
    map = _templated_ops(combine.map_op)
    map_scalar = _templated_ops(combine.map_scalar_op)
    zip = _templated_ops(combine.zip_op)
    reduce = _templated_ops(combine.reduce_op, {"add": "sum", "mul": "prod"})

    # kernel hooks of the fused ops
    linear_fw = staticmethod(matmul.linear_fw)  # dispatches on dtype itself, as linear_bw
    linear_bw = staticmethod(matmul.linear_bw)
    embedding_fw = _activation_hook("embedding_fw", embedding.embedding_fw, 1)
    embedding_bw = _activation_hook("embedding_bw", embedding.embedding_bw, 1)
    attn_softmax_fw = _activation_hook("attn_softmax_fw", softmax.attn_softmax_fw, 2)
    attn_softmax_bw = _activation_hook("attn_softmax_bw", softmax.attn_softmax_bw, 2)
    layernorm_fw = _activation_hook("layernorm_fw", layernorm.layernorm_fw, 1)
    layernorm_bw = _activation_hook("layernorm_bw", layernorm.layernorm_bw, 2)
    attention_fw = staticmethod(attention.attention_fw)  # dispatches on dtype itself
    attention_bw = staticmethod(attention.attention_bw)
    linear_cross_entropy_fw = staticmethod(classifier.linear_cross_entropy_fw)  # dispatches on dtype itself
    adamw_step = _hook("adamw_step", optimizer.adamw_step)
    adamw_multi = staticmethod(optimizer.MultiTensorAdamW)  # its update checks the dtypes itself
    gradient_pack = _hook("gradient_pack", optimizer.gradient_pack)
    slot_write = staticmethod(kv_cache.slot_write)  # float32 or bfloat16
    slot_attention = staticmethod(kv_cache.slot_attention)  # float32 or bfloat16
    gather_rows = _activation_hook("gather_rows", embedding.gather_rows, 2)
    top_k = _hook("top_k", topk.top_k)
    beam_search_step = _hook("beam_search_step", beam_search.beam_search_step)
