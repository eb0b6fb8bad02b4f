"""CudaKernelOps: the CUDA backend's op table.  Tensors live on the GPU; every number is computed
by our kernels (src/*.cu), bound in the `minitorch.cuda` package, one module per library.

Storage is a 1-D `torch` tensor from PyTorch's caching allocator in the dtype's own format (float32,
bfloat16, float16, int64; bool as float32); ops take TensorData, pass raw device pointers and
shapes/strides by value, and launch on PyTorch's current stream.  No op copies between host and device: data
crosses only in `storage_from_numpy` / `storage_to_numpy`, which `transfer_stats()` counts.  Nothing
is loaded at import, so `import minitorch` works without a GPU; the first CUDA storage loads the
kernels and names the fix when they are missing.

Dtypes: casts and copies of the float dtypes run in convert_kernel.so, those involving int64 in
int_kernel.so; a product dispatches on its dtype in `matmul.matrix_multiply`, a Linear's in
`matmul.linear_fw` / `linear_bw`; map/zip/reduce have float32 and bfloat16 kernels (float32 math) in
combine.so and int64 ones in int_kernel.so (`_by_storage`); the index ops (arg_reduce, cumsum,
sort_indices) take float32 or int64; fused attention (`attention.attention_fw/bw`, and the packed
`attention_qkv_fw/bw` in bfloat16, None for other dtypes: the caller splits qkv), the fused linear
cross-entropy (`classifier.linear_cross_entropy_fw`), the cross-entropy rows of nn.cross_entropy
(`classifier.softmax_loss_fw/bw`) and the KV cache (`kv_cache.slot_write` and
`slot_attention`) dispatch in their bindings, on float32 or bfloat16; every other op has the kernels
its entry below names and raises NoKernelError ("minitorch: no float16 CUDA kernel for 'exp' (cast
with .float() first)") for a tensor stored in another format, before anything runs: nothing is
computed in another precision than asked.  The kernel hooks that take ids (embedding rows, targets,
gathered rows) read them as float32: int64 ids are converted on the device first, exactly, where the
size they address is at most 2^24.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from .cuda import (
    attention, beam_search, classifier, combine, convert, embedding, integer, kv_cache, layernorm, matmul, optimizer,
    random, softmax, staging, topk,
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
    settle_side,
    storage_dtype,
    storage_empty,
    transfer_stats,
    unavailable_reason,
)
from .dtypes import FLOAT32_EXACT_INTEGERS, DType, float32, int64, no_kernel
from .tensor_data import TensorData
from .tensor_ops import TensorOps

__all__ = [
    "CudaKernelOps", "CudaKernelError", "CudaShapeError", "cuda_memory_stats", "transfer_stats",
    "reset_transfer_stats", "unavailable_reason",
]  # fmt: skip


def _from_numpy(arr: np.ndarray) -> Any:
    """Host->device copy of a 1-D array, int64 for an integer array, float32 otherwise (counted in
    transfer_stats)."""
    rt = runtime()
    host = np.ascontiguousarray(arr, dtype=np.int64 if np.asarray(arr).dtype.kind in "iu" else np.float32).reshape(-1)
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


def _by_storage(float_factory: Callable[..., Any], int_factory: Callable[..., Any], int_names: Sequence[str],
                names: Any = None) -> Any:  # fmt: skip
    """A map/zip/reduce factory whose ops run combine.so's kernels on KERNEL_STORAGE formats and
    int_kernel.so's on int64 storage (for the functions in int_names), NoKernelError naming the op
    (names: other names for some, e.g. reduce(add) is 'sum') otherwise; a function neither library
    has is refused at once (combine.so's ValueError)."""

    def factory(fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        name = (names or {}).get(fn.__name__, fn.__name__)
        integral = integer.has_op(fn, tuple(int_names))
        try:
            float_op: Optional[Callable[..., Any]] = _checked(name, float_factory(fn, *args), KERNEL_STORAGE)
        except ValueError:
            if not integral:
                raise
            float_op = None
        int_op = int_factory(fn, *args) if integral else None

        def run(a: TensorData, *rest: Any, **kwargs: Any) -> Any:
            op = int_op if a.dtype.storage == "int64" else float_op
            if op is None:
                raise no_kernel(name, a.dtype)
            return op(a, *rest, **kwargs)

        return run

    return staticmethod(factory)


def _hook(name: str, fn: Callable[..., Any]) -> Any:
    return staticmethod(_checked(name, fn))


def _activation_hook(name: str, fn: Callable[..., Any], activations: int) -> Any:
    """A hook whose first `activations` arguments and its keyword arguments (an addend laid out as an
    activation) may be stored in any of KERNEL_STORAGE (its kernels are templated on their format)
    and the other positional ones (weights, statistics) as float32 only."""

    def checked(*args: Any, **kwargs: Any) -> Any:
        require_storage(name, KERNEL_STORAGE, *args[:activations], *kwargs.values())
        require_storage(name, ("float32",), *args[activations:])
        return fn(*args, **kwargs)

    return staticmethod(checked)


def _float_ids(t: TensorData, addressed: int, what: str) -> TensorData:
    """Ids for a kernel that reads them as float32: int64 ids converted on the device (exact: the
    size they address is checked to be at most 2^24); float32 ids as they are."""
    if not t.dtype.is_integer:
        return t
    if addressed > FLOAT32_EXACT_INTEGERS:
        raise CudaShapeError(
            f"{what}: int64 ids addressing {addressed} rows (more than {FLOAT32_EXACT_INTEGERS}) have no CUDA kernel"
        )
    return integer.cast(t, float32)


def _by_dtype(float_fn: Callable[..., Any], int_fn: Callable[..., Any], op: str) -> Any:
    """An op on one tensor (and Python values) by its storage: int64 -> int_fn, float32 -> float_fn."""

    def run(a: TensorData, *rest: Any) -> Any:
        if a.dtype.storage == "int64":
            return int_fn(a, *rest)
        require_storage(op, ("float32",), a)
        return float_fn(a, *rest)

    return staticmethod(run)


def _embedding_fw(weight: TensorData, ids: TensorData, dtype: Optional[DType] = None) -> TensorData:
    if weight.dtype.is_integer:
        rows = ids if ids.dtype.is_integer else integer.cast(ids, int64)
        return integer.gather_rows(integer.contiguous(weight), integer.contiguous(rows))
    require_storage("embedding_fw", KERNEL_STORAGE, weight)
    return embedding.embedding_fw(weight, _float_ids(ids, weight.shape[0], "embedding"), dtype)


def _embedding_bw(
    grad_out: TensorData, ids: TensorData, num_embeddings: int, dtype: Optional[DType] = None,
    initial: Optional[TensorData] = None, in_place: bool = False,
) -> TensorData:  # fmt: skip
    require_storage("embedding_bw", KERNEL_STORAGE, grad_out, initial)
    ids = _float_ids(ids, num_embeddings, "embedding backward")
    return embedding.embedding_bw(grad_out, ids, num_embeddings, dtype, initial, in_place)


def _gather_rows(out: TensorData, source: TensorData, ids: TensorData) -> None:
    require_storage("gather_rows", KERNEL_STORAGE, out, source)
    embedding.gather_rows(out, source, _float_ids(ids, source.shape[0], "gather_rows"))


def _linear_cross_entropy_fw(hidden: TensorData, weight: TensorData, bias: Any, targets: TensorData, *rest: Any) -> Any:
    targets = _float_ids(targets, weight.shape[1], "fused_linear_cross_entropy targets")
    return classifier.linear_cross_entropy_fw(hidden, weight, bias, targets, *rest)


def _cast(a: TensorData, dtype: DType, out: Optional[TensorData] = None) -> TensorData:
    target = dtype if out is None else out.dtype
    if "int64" in (a.dtype.storage, target.storage):
        return integer.cast(a, target, out)
    return convert.cast(a, dtype, out)


class CudaKernelOps(TensorOps):
    """The CUDA backend: device storage from PyTorch's caching allocator, compute in our kernels."""

    is_cuda = True
    emulates_dtypes = False

    storage_empty = staticmethod(storage_empty)
    storage_from_numpy = staticmethod(_from_numpy)
    storage_to_numpy = staticmethod(_to_numpy)
    storage_upload = staticmethod(staging.upload_storage)
    cast = staticmethod(_cast)
    matrix_multiply = staticmethod(matmul.matrix_multiply)  # dispatches on dtype itself
    fill = _by_dtype(combine.fill, integer.fill, "fill")
    arange = _by_dtype(combine.arange, integer.arange, "arange")
    uniform = _hook("uniform", random.uniform)
    map = _by_storage(combine.map_op, integer.map_op, integer.UNARY_OPS)
    map_scalar = _by_storage(combine.map_scalar_op, integer.map_scalar_op, integer.BINARY_OPS)
    zip = _by_storage(combine.zip_op, integer.zip_op, integer.BINARY_OPS)
    reduce = _by_storage(combine.reduce_op, integer.reduce_op, integer.REDUCE_OPS, {"add": "sum", "mul": "prod"})
    arg_reduce = staticmethod(integer.arg_reduce)
    cumsum = staticmethod(integer.cumsum)
    sort_indices = staticmethod(integer.sort_indices)

    # kernel hooks of the fused ops
    linear_fw = staticmethod(matmul.linear_fw)  # dispatches on dtype itself, as linear_bw
    linear_bw = staticmethod(matmul.linear_bw)
    settle_side = staticmethod(settle_side)  # the end of backward: wait for linear_bw's side-stream work
    embedding_fw = staticmethod(_embedding_fw)
    embedding_bw = staticmethod(_embedding_bw)
    attn_softmax_fw = _activation_hook("attn_softmax_fw", softmax.attn_softmax_fw, 2)
    attn_softmax_bw = _activation_hook("attn_softmax_bw", softmax.attn_softmax_bw, 2)
    layernorm_fw = _activation_hook("layernorm_fw", layernorm.layernorm_fw, 1)
    layernorm_bw = _activation_hook("layernorm_bw", layernorm.layernorm_bw, 2)
    attention_fw = staticmethod(attention.attention_fw)  # dispatches on dtype itself
    attention_bw = staticmethod(attention.attention_bw)
    attention_qkv_fw = staticmethod(attention.attention_qkv_fw)  # bfloat16; None for other dtypes
    attention_qkv_bw = staticmethod(attention.attention_qkv_bw)
    linear_cross_entropy_fw = staticmethod(_linear_cross_entropy_fw)  # dispatches on dtype in the binding
    softmax_loss_fw = _activation_hook("cross_entropy", classifier.softmax_loss_fw, 1)  # float32 ids and losses
    softmax_loss_bw = _activation_hook("cross_entropy", classifier.softmax_loss_bw, 1)
    adamw_step = _hook("adamw_step", optimizer.adamw_step)
    adamw_multi = staticmethod(optimizer.MultiTensorAdamW)  # its update checks the dtypes itself
    gradient_pack = _hook("gradient_pack", optimizer.gradient_pack)
    slot_write = staticmethod(kv_cache.slot_write)  # float32 or bfloat16
    slot_attention = staticmethod(kv_cache.slot_attention)  # float32 or bfloat16
    gather_rows = staticmethod(_gather_rows)
    top_k = _hook("top_k", topk.top_k)
    beam_search_step = _hook("beam_search_step", beam_search.beam_search_step)
