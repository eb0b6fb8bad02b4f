"""CudaKernelOps: the CUDA backend's op table.  Tensors live on the GPU; every number is computed
by our kernels (src/*.cu), bound in the `minitorch.cuda` package, one module per library.

Storage is a 1-D float32 `torch` tensor from PyTorch's caching allocator; ops take TensorData,
pass raw device pointers and shapes/strides by value, and launch on PyTorch's current stream.  No
op copies between host and device: data crosses only in `storage_from_numpy` / `storage_to_numpy`,
which `transfer_stats()` counts.  Nothing is loaded at import, so `import minitorch` works without
a GPU; the first CUDA storage loads the kernels and names the fix when they are missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .cuda import (
    attention, beam_search, classifier, combine, embedding, kv_cache, layernorm, matmul, optimizer, random, softmax,
    staging, topk,
)  # fmt: skip
from .cuda.runtime import (
    INT_LIMIT,
    CudaKernelError,
    CudaShapeError,
    count_transfer,
    cuda_memory_stats,
    reset_transfer_stats,
    runtime,
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
    """Device->host copy of a buffer (counted in transfer_stats); waits for queued kernels."""
    count_transfer("d2h", storage.numel() * 4)
    return storage.detach().cpu().numpy()


class CudaKernelOps(TensorOps):
    """The CUDA backend: device storage from PyTorch's caching allocator, compute in our kernels."""

    is_cuda = True

    storage_empty = staticmethod(storage_empty)
    storage_from_numpy = staticmethod(_from_numpy)
    storage_to_numpy = staticmethod(_to_numpy)
    fill = staticmethod(combine.fill)
    arange = staticmethod(combine.arange)
    uniform = staticmethod(random.uniform)
    map = staticmethod(combine.map_op)
    map_scalar = staticmethod(combine.map_scalar_op)
    zip = staticmethod(combine.zip_op)
    reduce = staticmethod(combine.reduce_op)
    matrix_multiply = staticmethod(matmul.matrix_multiply)

    # kernel hooks of the fused ops
    linear_fw = staticmethod(matmul.linear_fw)
    embedding_fw = staticmethod(embedding.embedding_fw)
    embedding_bw = staticmethod(embedding.embedding_bw)
    attn_softmax_fw = staticmethod(softmax.attn_softmax_fw)
    attn_softmax_bw = staticmethod(softmax.attn_softmax_bw)
    layernorm_fw = staticmethod(layernorm.layernorm_fw)
    layernorm_bw = staticmethod(layernorm.layernorm_bw)
    attention_fw = staticmethod(attention.attention_fw)
    attention_bw = staticmethod(attention.attention_bw)
    linear_cross_entropy_fw = staticmethod(classifier.linear_cross_entropy_fw)
    adamw_step = staticmethod(optimizer.adamw_step)
    adamw_multi = staticmethod(optimizer.MultiTensorAdamW)
    gradient_pack = staticmethod(optimizer.gradient_pack)
    storage_upload = staticmethod(staging.upload_storage)
    slot_write = staticmethod(kv_cache.slot_write)
    slot_attention = staticmethod(kv_cache.slot_attention)
    gather_rows = staticmethod(embedding.gather_rows)
    top_k = staticmethod(topk.top_k)
    beam_search_step = staticmethod(beam_search.beam_search_step)
