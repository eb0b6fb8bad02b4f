"""CudaKernelOps: the CUDA backend.  Tensors live on the GPU; every number is computed by our kernels.

Storage of a CUDA tensor is a 1-D float32 `torch` tensor on the current CUDA device, used only as a
buffer from PyTorch's caching allocator.  Ops pass raw device pointers, and shapes/strides by value,
to the kernels compiled from `src/*.cu` into `minitorch/cuda_kernels/*.so` (`bash compile_cuda.sh`),
and launch them on PyTorch's current stream.  No op copies between host and device: data crosses only
in `storage_from_numpy` / `storage_to_numpy`, which `transfer_stats()` counts.

Nothing is loaded at import: `import minitorch` works without a GPU, torch's CUDA, or built
kernels.  The first CUDA storage (or op) loads them and raises a RuntimeError that names the fix when
something is missing.

Embedding ids live on the device, so they cannot be checked without a copy: an id that is not an
integer in [0, num_embeddings) gives a row of zeros in `embedding_fw` and is skipped by
`embedding_bw`.  Check ids on the host before moving them to the GPU when that matters.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import operators
from .tensor_data import MAX_DIMS, IndexingError, prod, strides_from_shape
from .tensor_ops import TensorOps

if TYPE_CHECKING:
    from .tensor import Tensor

KERNEL_DIR = Path(__file__).resolve().parent / "cuda_kernels"
BUILD_HINT = "build them with `bash compile_cuda.sh` in the repository root"
_INT_LIMIT = 2**31  # kernels index with 32-bit ints

# Opcodes of combine.cu, by position; checked against the names the library exports when it loads.
UNARY_OPS = ("id", "neg", "sigmoid", "relu", "log", "exp", "inv", "tanh", "gelu")
BINARY_OPS = (
    "add", "mul", "lt", "eq", "is_close", "max", "pow",
    "relu_back", "log_back", "inv_back", "sigmoid_back", "tanh_back", "gelu_back",
)  # fmt: skip
REDUCE_OPS = ("add", "mul", "max")
_UNARY_CODES: Dict[Callable, int] = {getattr(operators, n): i for i, n in enumerate(UNARY_OPS)}
_BINARY_CODES: Dict[Callable, int] = {getattr(operators, n): i for i, n in enumerate(BINARY_OPS)}

# Exported symbols of each library (tests/test_cuda_build.py checks them).
COMBINE_SYMBOLS = (
    "minitorch_error_string", "minitorch_unary_op_count", "minitorch_unary_op_name",
    "minitorch_binary_op_count", "minitorch_binary_op_name", "launch_map", "launch_map_scalar",
    "launch_zip", "launch_fill", "launch_arange", "launch_uniform", "reduce_workspace_floats",
    "launch_reduce", "launch_matmul", "launch_embedding_fw", "launch_embedding_bw",
)  # fmt: skip
SOFTMAX_SYMBOLS = ("minitorch_error_string", "launch_attn_softmax", "launch_attn_softmax_bw")
LAYERNORM_SYMBOLS = (
    "minitorch_error_string", "launch_layernorm", "layernorm_bw_workspace_floats", "launch_layernorm_bw",
)  # fmt: skip
CLASSIFIER_SYMBOLS = ("minitorch_error_string", "launch_fused_classifier", "fused_loss_vocab_splits")
OPTIMIZER_SYMBOLS = ("minitorch_error_string", "launch_adamw")
ATTENTION_SYMBOLS = (
    "minitorch_error_string", "launch_attention_fw", "attention_bw_workspace_floats", "launch_attention_bw",
)  # fmt: skip
ATTENTION_ACTIVATIONS = ("softmax", "relu")  # activation codes of attention_kernel.cu, by position
ATTENTION_MAX_HEAD_DIM = 128


class MtLayout(ctypes.Structure):
    """The by-value layout struct of src/includes/layout.cuh: shape and strides, outermost dim first."""

    _fields_ = [("ndim", ctypes.c_int), ("shape", ctypes.c_int * MAX_DIMS), ("strides", ctypes.c_int * MAX_DIMS)]


class CudaKernelError(RuntimeError):
    """A kernel launcher returned a CUDA error code."""


class CudaShapeError(IndexingError, ValueError):
    """Shapes that do not fit an op (an IndexingError like the CPU backends raise, and a ValueError)."""


# ---- loading ------------------------------------------------------------------------------------
_P = ctypes.c_void_p
_I = ctypes.c_int
_F = ctypes.c_float
_D = ctypes.c_double
_LL = ctypes.c_longlong
_L = MtLayout

_SIGNATURES: Dict[str, Dict[str, Tuple[Any, List[Any]]]] = {
    "combine": {
        "minitorch_error_string": (ctypes.c_char_p, [_I]),
        "minitorch_unary_op_count": (_I, []),
        "minitorch_unary_op_name": (ctypes.c_char_p, [_I]),
        "minitorch_binary_op_count": (_I, []),
        "minitorch_binary_op_name": (ctypes.c_char_p, [_I]),
        "launch_map": (_I, [_I, _P, _L, _P, _L, _P]),
        "launch_map_scalar": (_I, [_I, _P, _L, _P, _L, _F, _P]),
        "launch_zip": (_I, [_I, _P, _L, _P, _L, _P, _L, _P]),
        "launch_fill": (_I, [_P, _L, _F, _P]),
        "launch_arange": (_I, [_P, _I, _P]),
        "launch_uniform": (_I, [_P, _L, ctypes.c_ulonglong, _P]),
        "reduce_workspace_floats": (_LL, [_I, _I, _I]),
        "launch_reduce": (_I, [_I, _P, _L, _P, _L, _I, _I, _F, _P, _LL, _P]),
        "launch_matmul": (_I, [_P, _P, _P, _I, _I, _I, _I, _I, _I, _I, _L, _L, _P]),
        "launch_embedding_fw": (_I, [_P, _P, _P, _I, _I, _I, _P]),
        "launch_embedding_bw": (_I, [_P, _P, _P, _I, _I, _I, _P]),
    },
    "softmax_kernel": {
        "minitorch_error_string": (ctypes.c_char_p, [_I]),
        "launch_attn_softmax": (_I, [_P, _P, _P, _I, _I, _I, _I, _I, _P]),
        "launch_attn_softmax_bw": (_I, [_P, _P, _P, _I, _I, _P]),
    },
    "layernorm_kernel": {
        "minitorch_error_string": (ctypes.c_char_p, [_I]),
        "launch_layernorm": (_I, [_P, _P, _P, _P, _P, _P, _I, _I, _F, _P]),
        "layernorm_bw_workspace_floats": (_LL, [_I, _I]),
        "launch_layernorm_bw": (_I, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _P]),
    },
    "classifier_kernel": {
        "minitorch_error_string": (ctypes.c_char_p, [_I]),
        "launch_fused_classifier": (_I, [_P, _P, _P, _P, _P, _P, _I, _I, _I, _P]),
        "fused_loss_vocab_splits": (_I, [_I, _I, _I]),
    },
    "optimizer_kernel": {
        "minitorch_error_string": (ctypes.c_char_p, [_I]),
        "launch_adamw": (_I, [_P, _P, _P, _P, _LL, _D, _D, _D, _D, _D, _I, _P]),
    },
    "attention_kernel": {
        "minitorch_error_string": (ctypes.c_char_p, [_I]),
        "launch_attention_fw": (_I, [_P] * 6 + [_I] * 7 + [_F, _P]),
        "attention_bw_workspace_floats": (_LL, [_I, _I, _I]),
        "launch_attention_bw": (_I, [_P] * 11 + [_I] * 7 + [_F, _P]),
    },
}


def library_path(name: str) -> Path:
    """Where compile_cuda.sh puts the library built from src/<name>.cu."""
    return KERNEL_DIR / f"{name}.so"


def load_library(name: str) -> ctypes.CDLL:
    """Load one kernel library with its argtypes/restype declared (no GPU needed to load it)."""
    path = library_path(name)
    if not path.exists():
        raise RuntimeError(f"CUDA kernels are not built: {path} is missing; {BUILD_HINT}")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise RuntimeError(f"cannot load CUDA kernels from {path}: {e}; {BUILD_HINT}") from e
    for symbol, (restype, argtypes) in _SIGNATURES[name].items():
        try:
            fn = getattr(lib, symbol)
        except AttributeError:
            raise RuntimeError(f"{path} does not export {symbol}: it is out of date; {BUILD_HINT}") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _check_opcode_tables(lib: ctypes.CDLL) -> None:
    for kind, names, count, name_of in (
        ("unary", UNARY_OPS, lib.minitorch_unary_op_count, lib.minitorch_unary_op_name),
        ("binary", BINARY_OPS, lib.minitorch_binary_op_count, lib.minitorch_binary_op_name),
    ):
        built = tuple(name_of(i).decode() for i in range(count()))
        if built != names:
            raise RuntimeError(
                f"combine.so's {kind} opcodes {built} differ from cuda_kernel_ops.py's {names}; {BUILD_HINT}"
            )


class _Runtime:
    """What the backend needs once loaded: torch, the combine library, the stream getter."""

    def __init__(self) -> None:
        self.combine = load_library("combine")
        _check_opcode_tables(self.combine)
        try:
            import torch
        except ImportError as e:
            raise RuntimeError("the CUDA backend needs PyTorch (it provides device memory and streams)") from e
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the CUDA backend needs a CUDA GPU, and torch.cuda.is_available() is False here; "
                "use the CPU backend (FastOps) on this machine"
            )
        self.torch = torch
        self.float32 = torch.float32
        self.device = torch.device("cuda")
        self.fused: Dict[str, ctypes.CDLL] = {}
        self.sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        if get_raw is not None and get_device is not None:
            # The private accessors skip building a torch.cuda.Stream object per launch (~1 us).
            self.stream: Callable[[], int] = lambda: get_raw(get_device())
        else:
            self.stream = lambda: torch.cuda.current_stream().cuda_stream

    def fused_lib(self, name: str) -> ctypes.CDLL:
        lib = self.fused.get(name)
        if lib is None:
            lib = self.fused[name] = load_library(name)
        return lib


_rt: Optional[_Runtime] = None


def _runtime() -> _Runtime:
    global _rt
    if _rt is None:
        _rt = _Runtime()
    return _rt


def unavailable_reason() -> Optional[str]:
    """Why the CUDA backend cannot run here (None when it can); loads it on success."""
    try:
        _runtime()
    except RuntimeError as e:
        return str(e)
    return None


def _check(code: int, lib: ctypes.CDLL, what: str) -> None:
    if code:
        raise CudaKernelError(f"CUDA {what} failed: {lib.minitorch_error_string(code).decode()} (cudaError {code})")


# ---- host<->device transfer accounting ------------------------------------------------------------
_transfers = {"h2d": 0, "d2h": 0, "h2d_bytes": 0, "d2h_bytes": 0}


def transfer_stats() -> Dict[str, int]:
    """Host->device and device->host copies (and bytes) made by this backend since the last reset."""
    return dict(_transfers)


def reset_transfer_stats() -> None:
    """Zero the transfer counters."""
    for k in _transfers:
        _transfers[k] = 0


def cuda_memory_stats(reset: bool = False) -> Dict[str, int]:
    """Device memory held by tensors, in bytes: {"current": now, "peak": the most since the last
    reset}.  All CUDA storage comes from PyTorch's caching allocator, so these are
    torch.cuda.memory_allocated() and max_memory_allocated() (memory the allocator keeps cached
    but no tensor holds is not counted).  reset=True starts a new peak window after the reading."""
    rt = _rt or _runtime()
    cuda = rt.torch.cuda
    stats = {"current": int(cuda.memory_allocated()), "peak": int(cuda.max_memory_allocated())}
    if reset:
        cuda.reset_peak_memory_stats()
    return stats


# ---- layouts --------------------------------------------------------------------------------------
_LAYOUT_CACHE_LIMIT = 4096


def _coalesce(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> Tuple[Tuple[int, ...], List[List[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every operand, so the kernels
    index fewer dims (a contiguous tensor becomes one dim of stride 1)."""
    out_shape: List[int] = []
    out_strides: List[List[int]] = [[] for _ in strides]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if out_shape and all(o[-1] == s[d] * size for o, s in zip(out_strides, strides)):
            out_shape[-1] *= size
            for o, s in zip(out_strides, strides):
                o[-1] = s[d]
        else:
            out_shape.append(size)
            for o, s in zip(out_strides, strides):
                o.append(s[d])
    if not out_shape:
        return (1,), [[1] for _ in strides]
    return tuple(out_shape), out_strides


def _layout(shape: Sequence[int], strides: Sequence[int]) -> MtLayout:
    span = sum((s - 1) * st for s, st in zip(shape, strides))
    if prod(shape) >= _INT_LIMIT or span >= _INT_LIMIT or any(st < 0 for st in strides):
        raise CudaShapeError(
            f"layout shape {tuple(shape)} strides {tuple(strides)} exceeds the CUDA kernels' 32-bit indexing"
        )
    layout = MtLayout()
    layout.ndim = len(shape)
    for d, (s, st) in enumerate(zip(shape, strides)):
        layout.shape[d] = s
        layout.strides[d] = st
    return layout


def _broadcast_strides(shape: Tuple[int, ...], strides: Tuple[int, ...], out_shape: Tuple[int, ...]) -> List[int]:
    """Strides of a tensor viewed with the broadcast shape out_shape (0 on broadcast dims)."""
    pad = len(out_shape) - len(shape)
    return [0 if d < pad or shape[d - pad] != out_shape[d] else strides[d - pad] for d in range(len(out_shape))]


def _broadcast_shape(op: str, a: Tuple[int, ...], b: Tuple[int, ...]) -> Tuple[int, ...]:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + a
    pb = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise CudaShapeError(f"{op}: shapes {a} and {b} cannot be broadcast together")
        out.append(x if y == 1 else y)
    return tuple(out)


def _elementwise_plan(out_shape: Tuple[int, ...], out_strides: Tuple[int, ...],
                      inputs: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...]]]) -> Tuple[MtLayout, ...]:
    strides = [list(out_strides)] + [_broadcast_strides(s, st, out_shape) for s, st in inputs]
    shape, merged = _coalesce(out_shape, strides)
    return tuple(_layout(shape, st) for st in merged)


def _remember(cache: Dict[Any, Any], key: Any, value: Any) -> Any:
    if len(cache) >= _LAYOUT_CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


_map_plans: Dict[Any, Tuple[MtLayout, MtLayout]] = {}
_zip_plans: Dict[Any, Tuple[Tuple[int, ...], MtLayout, MtLayout, MtLayout]] = {}
_out_plans: Dict[Any, MtLayout] = {}
_reduce_plans: Dict[Any, Tuple[Tuple[int, ...], MtLayout, MtLayout, int, int, int, int]] = {}
_matmul_plans: Dict[Any, Tuple[Tuple[int, ...], Tuple[int, ...], MtLayout, MtLayout]] = {}


def _out_layout(out: "Tensor") -> MtLayout:
    """Layout of a tensor that an op only writes (fill, uniform)."""
    key = (out.shape, out._tensor.strides)
    layout = _out_plans.get(key)
    if layout is None:
        layout = _remember(_out_plans, key, _elementwise_plan(out.shape, out._tensor.strides, [])[0])
    return layout


def _map_layouts(op: str, a: "Tensor", out: Optional["Tensor"]) -> Tuple[MtLayout, MtLayout]:
    """(out layout, a layout); out None means a new contiguous tensor of a's shape."""
    a_shape, a_strides = a.shape, a._tensor.strides
    key = (a_shape, a_strides, None if out is None else (out.shape, out._tensor.strides))
    plan = _map_plans.get(key)
    if plan is None:
        if out is None:
            out_shape, out_strides = a_shape, strides_from_shape(a_shape)
        else:
            out_shape, out_strides = out.shape, out._tensor.strides
            if _broadcast_shape(op, a_shape, out_shape) != out_shape:
                raise CudaShapeError(f"{op}: input of shape {a_shape} does not broadcast to out of shape {out_shape}")
        out_l, a_l = _elementwise_plan(out_shape, out_strides, [(a_shape, a_strides)])
        plan = _remember(_map_plans, key, (out_l, a_l))
    return plan


# ---- checks ------------------------------------------------------------------------------------------
def _require_cuda(op: str, *tensors: "Tensor") -> None:
    for t in tensors:
        if not t.backend.cuda:
            raise TypeError(
                f"{op}: tensor of shape {t.shape} is on {t.backend.ops.__name__}, not CudaKernelOps; "
                f"move it with .to(TensorBackend(CudaKernelOps))"
            )


def _opcode(fn: Callable, table: Dict[Callable, int], kind: str, names: Sequence[str]) -> int:
    code = table.get(fn)
    if code is None:
        raise ValueError(
            f"CudaKernelOps.{kind}: {getattr(fn, '__name__', fn)!r} has no CUDA kernel; "
            f"supported minitorch.operators functions: {', '.join(names)}"
        )
    return code


def _ptr(t: "Tensor") -> int:
    return t._tensor._storage.data_ptr()


def _contiguous(t: "Tensor") -> "Tensor":
    return t if t._tensor.is_contiguous() else t.contiguous()


class CudaKernelOps(TensorOps):
    """The CUDA backend: device storage from PyTorch's caching allocator, compute in our kernels."""

    is_cuda = True

    # ---- storage ---------------------------------------------------------------------------------
    @staticmethod
    def storage_empty(size: int) -> Any:
        """Uninitialized device buffer of `size` float32."""
        rt = _rt or _runtime()
        if size >= _INT_LIMIT:
            raise CudaShapeError(f"a CUDA tensor of {size} elements exceeds the limit of {_INT_LIMIT - 1}")
        return rt.torch.empty(size, dtype=rt.float32, device=rt.device)

    @staticmethod
    def storage_from_numpy(arr: np.ndarray) -> Any:
        """Host->device copy of a 1-D float32 array (counted in transfer_stats)."""
        rt = _rt or _runtime()
        host = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
        if host.size >= _INT_LIMIT:
            raise CudaShapeError(f"a CUDA tensor of {host.size} elements exceeds the limit of {_INT_LIMIT - 1}")
        _transfers["h2d"] += 1
        _transfers["h2d_bytes"] += host.nbytes
        return rt.torch.from_numpy(host).to(rt.device)

    @staticmethod
    def storage_to_numpy(storage: Any) -> np.ndarray:
        """Device->host copy of a buffer (counted in transfer_stats); waits for queued kernels."""
        _transfers["d2h"] += 1
        _transfers["d2h_bytes"] += storage.numel() * 4
        return storage.detach().cpu().numpy()

    @staticmethod
    def fill(out: "Tensor", value: float) -> None:
        """Set every element of out (any layout) to value."""
        rt = _rt or _runtime()
        _require_cuda("fill", out)
        if out.size == 0:
            return
        _check(rt.combine.launch_fill(_ptr(out), _out_layout(out), value, rt.stream()), rt.combine, "fill")

    @staticmethod
    def arange(out: "Tensor") -> None:
        """out[i] = i over the flat storage of a contiguous tensor."""
        rt = _rt or _runtime()
        _require_cuda("arange", out)
        if not out.is_contiguous():
            raise CudaShapeError(f"arange needs a contiguous tensor, got {out.shape} strides {out._tensor.strides}")
        _check(rt.combine.launch_arange(_ptr(out), out.size, rt.stream()), rt.combine, "arange")

    @staticmethod
    def uniform(out: "Tensor", seed: int) -> None:
        """Uniform [0, 1) values generated on the device; a function of (seed mod 2^64, element ordinal)."""
        rt = _rt or _runtime()
        _require_cuda("uniform", out)
        if out.size == 0:
            return
        code = rt.combine.launch_uniform(_ptr(out), _out_layout(out), int(seed) & 0xFFFFFFFFFFFFFFFF, rt.stream())
        _check(code, rt.combine, "uniform")

    # ---- elementwise -------------------------------------------------------------------------------
    @staticmethod
    def map(fn: Callable[[float], float]) -> Callable[..., "Tensor"]:
        """fn(a) elementwise; `out`, if given, is written in place (a broadcasts to its shape)."""
        op = _opcode(fn, _UNARY_CODES, "map", UNARY_OPS)
        name = f"map({UNARY_OPS[op]})"

        def ret(a: "Tensor", out: Optional["Tensor"] = None) -> "Tensor":
            rt = _rt or _runtime()
            if out is None:
                _require_cuda(name, a)
                out_l, a_l = _map_layouts(name, a, None)
                out = a._new_empty(a.shape)
            else:
                _require_cuda(name, a, out)
                out_l, a_l = _map_layouts(name, a, out)
            if out.size:
                code = rt.combine.launch_map(op, _ptr(out), out_l, _ptr(a), a_l, rt.stream())
                _check(code, rt.combine, name)
            return out

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[["Tensor", float], "Tensor"]:
        """fn(a, s) elementwise with a Python float s."""
        op = _opcode(fn, _BINARY_CODES, "map_scalar", BINARY_OPS)
        name = f"map_scalar({BINARY_OPS[op]})"

        def ret(a: "Tensor", s: float) -> "Tensor":
            rt = _rt or _runtime()
            _require_cuda(name, a)
            out_l, a_l = _map_layouts(name, a, None)
            out = a._new_empty(a.shape)
            if out.size:
                code = rt.combine.launch_map_scalar(op, _ptr(out), out_l, _ptr(a), a_l, s, rt.stream())
                _check(code, rt.combine, name)
            return out

        return ret

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[["Tensor", "Tensor"], "Tensor"]:
        """fn(a, b) elementwise with numpy broadcasting; the result is a new contiguous tensor."""
        op = _opcode(fn, _BINARY_CODES, "zip", BINARY_OPS)
        name = f"zip({BINARY_OPS[op]})"

        def ret(a: "Tensor", b: "Tensor") -> "Tensor":
            rt = _rt or _runtime()
            _require_cuda(name, a, b)
            key = (a.shape, a._tensor.strides, b.shape, b._tensor.strides)
            plan = _zip_plans.get(key)
            if plan is None:
                out_shape = _broadcast_shape(name, a.shape, b.shape)
                inputs = [(a.shape, a._tensor.strides), (b.shape, b._tensor.strides)]
                layouts = _elementwise_plan(out_shape, strides_from_shape(out_shape), inputs)
                plan = _remember(_zip_plans, key, (out_shape,) + layouts)
            out_shape, out_l, a_l, b_l = plan
            out = a._new_empty(out_shape)
            if out.size:
                code = rt.combine.launch_zip(op, _ptr(out), out_l, _ptr(a), a_l, _ptr(b), b_l, rt.stream())
                _check(code, rt.combine, name)
            return out

        return ret

    # ---- reduce ------------------------------------------------------------------------------------
    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[["Tensor", int], "Tensor"]:
        """fold(fn, start) along one dim, which is kept with size 1; fn is add, mul or max."""
        op = _opcode(fn, _BINARY_CODES, "reduce", REDUCE_OPS)
        if BINARY_OPS[op] not in REDUCE_OPS:
            raise ValueError(f"CudaKernelOps.reduce supports {', '.join(REDUCE_OPS)}, not {BINARY_OPS[op]}")
        name = f"reduce({BINARY_OPS[op]})"
        start = float(start)

        def ret(a: "Tensor", dim: int) -> "Tensor":
            rt = _rt or _runtime()
            _require_cuda(name, a)
            key = (a.shape, a._tensor.strides, dim)
            plan = _reduce_plans.get(key)
            if plan is None:
                plan = _remember(_reduce_plans, key, _reduce_plan(rt, name, a.shape, a._tensor.strides, dim))
            out_shape, out_l, outer_l, n_out, reduce_len, reduce_stride, ws_len = plan
            out = a._new_empty(out_shape)
            if n_out == 0:
                return out
            ws = rt.torch.empty(ws_len, dtype=rt.float32, device=rt.device) if ws_len else None
            code = rt.combine.launch_reduce(
                op, _ptr(out), out_l, _ptr(a), outer_l, reduce_len, reduce_stride, start,
                None if ws is None else ws.data_ptr(), ws_len, rt.stream(),
            )  # fmt: skip
            _check(code, rt.combine, name)
            return out

        return ret

    # ---- matmul ------------------------------------------------------------------------------------
    @staticmethod
    def matrix_multiply(a: "Tensor", b: "Tensor") -> "Tensor":
        """a [..., n, k] @ b [..., k, m] -> [broadcast(...), n, m], any strides."""
        rt = _rt or _runtime()
        _require_cuda("matmul", a, b)
        key = (a.shape, a._tensor.strides, b.shape, b._tensor.strides)
        plan = _matmul_plans.get(key)
        if plan is None:
            plan = _remember(_matmul_plans, key, _matmul_plan(a.shape, a._tensor.strides, b.shape, b._tensor.strides))
        out_shape, strides, a_batch, b_batch = plan
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        if len(out_shape) == 2:
            split = _split_k(n, m, k, rt.sm_count)
            if split > 1:
                return _matmul_split_k(rt, a, b, strides, split)
        out = a._new_empty(out_shape)
        if out.size:
            code = rt.combine.launch_matmul(
                _ptr(out), _ptr(a), _ptr(b), n, m, k, *strides, a_batch, b_batch, rt.stream()
            )
            _check(code, rt.combine, f"matmul {a.shape} @ {b.shape}")
        return out

    # ---- fused hooks ---------------------------------------------------------------------------------
    @staticmethod
    def embedding_fw(weight: "Tensor", ids: "Tensor") -> "Tensor":
        """weight[ids] -> [*ids.shape, C]; an id outside [0, V) (or not an integer) gives zeros."""
        rt = _rt or _runtime()
        _require_cuda("embedding_fw", weight, ids)
        if weight.dims != 2:
            raise CudaShapeError(f"embedding_fw: weight must be [num_embeddings, dim], got shape {weight.shape}")
        V, C = weight.shape
        out = weight._new_empty(ids.shape + (C,))
        if out.size:
            w, i = _contiguous(weight), _contiguous(ids)
            code = rt.combine.launch_embedding_fw(_ptr(out), _ptr(w), _ptr(i), ids.size, V, C, rt.stream())
            _check(code, rt.combine, "embedding_fw")
        return out

    @staticmethod
    def embedding_bw(grad_out: "Tensor", ids: "Tensor", num_embeddings: int) -> "Tensor":
        """Scatter-add of the rows of grad_out [*ids.shape, C] into a zeroed [num_embeddings, C]."""
        rt = _rt or _runtime()
        _require_cuda("embedding_bw", grad_out, ids)
        if grad_out.shape[:-1] != ids.shape:
            raise CudaShapeError(f"embedding_bw: grad_out {grad_out.shape} does not match ids of shape {ids.shape}")
        C = grad_out.shape[-1]
        out = grad_out._new_empty((num_embeddings, C))
        CudaKernelOps.fill(out, 0.0)
        if grad_out.size:
            g, i = _contiguous(grad_out), _contiguous(ids)
            code = rt.combine.launch_embedding_bw(_ptr(out), _ptr(g), _ptr(i), ids.size, num_embeddings, C, rt.stream())
            _check(code, rt.combine, "embedding_bw")
        return out

    @staticmethod
    def attn_softmax_fw(inp: "Tensor", mask: Optional["Tensor"], causal: bool) -> "Tensor":
        """Fused attention softmax of inp [B, H, Tq, Tk] with an additive mask [B, Tk] (or [B, 1, 1, Tk])."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("softmax_kernel")
        _require_cuda("attn_softmax_fw", inp, *(() if mask is None else (mask,)))
        if inp.dims != 4:
            raise CudaShapeError(f"attn_softmax_fw: scores must be [B, H, Tq, Tk], got shape {inp.shape}")
        B, H, Tq, Tk = inp.shape
        if mask is not None and mask.shape not in ((B, Tk), (B, 1, 1, Tk)):
            raise CudaShapeError(
                f"attn_softmax_fw: mask of shape {mask.shape} must be [B, Tk] = {(B, Tk)} or [B, 1, 1, Tk] "
                f"for scores {inp.shape}"
            )
        x = _contiguous(inp)
        m = None if mask is None else _contiguous(mask)
        out = inp._new_empty(inp.shape)
        if out.size:
            mask_ptr = None if m is None else _ptr(m)
            code = lib.launch_attn_softmax(_ptr(out), _ptr(x), mask_ptr, B, H, Tq, Tk, int(bool(causal)), rt.stream())
            _check(code, lib, f"attn_softmax_fw {inp.shape}")
        return out

    @staticmethod
    def attn_softmax_bw(grad_out: "Tensor", soft_out: "Tensor") -> "Tensor":
        """soft_out * (grad_out - sum_lastdim(grad_out * soft_out))."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("softmax_kernel")
        _require_cuda("attn_softmax_bw", grad_out, soft_out)
        if grad_out.shape != soft_out.shape or grad_out.dims == 0:
            raise CudaShapeError(f"attn_softmax_bw: grad_out {grad_out.shape} and output {soft_out.shape} differ")
        out = grad_out._new_empty(grad_out.shape)
        if out.size:
            k_len = grad_out.shape[-1]
            g, y = _contiguous(grad_out), _contiguous(soft_out)
            code = lib.launch_attn_softmax_bw(_ptr(out), _ptr(g), _ptr(y), out.size // k_len, k_len, rt.stream())
            _check(code, lib, f"attn_softmax_bw {grad_out.shape}")
        return out

    @staticmethod
    def layernorm_fw(
        inp: "Tensor", gamma: "Tensor", beta: "Tensor", eps: float
    ) -> Tuple["Tensor", "Tensor", "Tensor"]:
        """Fused LayerNorm over the last dim: (out, mean [rows], rstd [rows])."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("layernorm_kernel")
        _require_cuda("layernorm_fw", inp, gamma, beta)
        C = inp.shape[-1] if inp.dims else 0
        if C == 0 or gamma.shape != (C,) or beta.shape != (C,):
            raise CudaShapeError(
                f"layernorm_fw: input {inp.shape} needs gamma and beta of shape ({C},), "
                f"got {gamma.shape} and {beta.shape}"
            )
        rows = inp.size // C
        out = inp._new_empty(inp.shape)
        mean = inp._new_empty((rows,))
        rstd = inp._new_empty((rows,))
        if rows:
            x, g, b = _contiguous(inp), _contiguous(gamma), _contiguous(beta)
            code = lib.launch_layernorm(
                _ptr(out), _ptr(mean), _ptr(rstd), _ptr(x), _ptr(g), _ptr(b), rows, C, float(eps), rt.stream()
            )
            _check(code, lib, f"layernorm_fw {inp.shape}")
        return out, mean, rstd

    @staticmethod
    def layernorm_bw(
        grad_out: "Tensor", inp: "Tensor", gamma: "Tensor", mean: "Tensor", rstd: "Tensor"
    ) -> Tuple["Tensor", "Tensor", "Tensor"]:
        """Fused LayerNorm backward: (dinp, dgamma, dbeta)."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("layernorm_kernel")
        _require_cuda("layernorm_bw", grad_out, inp, gamma, mean, rstd)
        C = inp.shape[-1] if inp.dims else 0
        rows = inp.size // C if C else 0
        if C == 0 or grad_out.shape != inp.shape or gamma.shape != (C,) or mean.size != rows or rstd.size != rows:
            raise CudaShapeError(
                f"layernorm_bw: grad_out {grad_out.shape}, input {inp.shape}, gamma {gamma.shape}, mean {mean.shape}, "
                f"rstd {rstd.shape} do not fit together"
            )
        dinp = inp._new_empty(inp.shape)
        dgamma = inp._new_empty((C,))
        dbeta = inp._new_empty((C,))
        if rows:
            ws_len = lib.layernorm_bw_workspace_floats(rows, C)
            if ws_len < 0:  # the size query itself failed: it returns minus the CUDA error code
                _check(int(-ws_len), lib, f"layernorm_bw workspace query for [{rows}, {C}]")
            ws = rt.torch.empty(max(ws_len, 1), dtype=rt.float32, device=rt.device)
            tensors = tuple(_contiguous(t) for t in (grad_out, inp, gamma, mean, rstd))
            code = lib.launch_layernorm_bw(
                _ptr(dinp), _ptr(dgamma), _ptr(dbeta), *(_ptr(t) for t in tensors), ws.data_ptr(), rows, C, rt.stream()
            )
            _check(code, lib, f"layernorm_bw {inp.shape}")
        else:
            CudaKernelOps.fill(dgamma, 0.0)
            CudaKernelOps.fill(dbeta, 0.0)
        return dinp, dgamma, dbeta

    @staticmethod
    def fused_attention_fw(
        q: "Tensor", k: "Tensor", v: "Tensor", mask: Optional["Tensor"], causal: bool, activation: str, scale: float
    ) -> Tuple["Tensor", "Tensor"]:
        """Fused attention (src/attention_kernel.cu), see minitorch.fused_attention: (out [B, H, Tq, D],
        lse [B, H, Tq]); lse is the softmax's log-sum-exp per query (-inf for a row with no key), 0 for relu."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("attention_kernel")
        _require_cuda("fused_attention_fw", q, k, v, *(() if mask is None else (mask,)))
        B, H, Tq, Tk, D, act = _attention_sizes("fused_attention_fw", q, k, v, mask, activation)
        out = q._new_empty(q.shape)
        lse = q._new_empty((B, H, Tq))
        if out.size:
            qc, kc, vc = _contiguous(q), _contiguous(k), _contiguous(v)
            mask_ptr = None if mask is None else _ptr(_contiguous(mask))
            code = lib.launch_attention_fw(
                _ptr(out), _ptr(lse), _ptr(qc), _ptr(kc), _ptr(vc), mask_ptr, B, H, Tq, Tk, D, int(bool(causal)), act,
                float(scale), rt.stream(),
            )  # fmt: skip
            _check(code, lib, f"fused_attention_fw q {q.shape} k {k.shape}")
        return out, lse

    @staticmethod
    def fused_attention_bw(
        grad_out: "Tensor", q: "Tensor", k: "Tensor", v: "Tensor", out: "Tensor", lse: "Tensor",
        mask: Optional["Tensor"], causal: bool, activation: str, scale: float,
    ) -> Tuple["Tensor", "Tensor", "Tensor"]:
        """Fused attention backward: (dq, dk, dv), recomputing the scores tile by tile from q, k, v and lse.
        dq is accumulated with atomics, so its last bits may vary from run to run."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("attention_kernel")
        _require_cuda("fused_attention_bw", grad_out, q, k, v, out, lse, *(() if mask is None else (mask,)))
        B, H, Tq, Tk, D, act = _attention_sizes("fused_attention_bw", q, k, v, mask, activation)
        if grad_out.shape != q.shape or out.shape != q.shape or lse.shape != (B, H, Tq):
            raise CudaShapeError(
                f"fused_attention_bw: grad_out {grad_out.shape}, out {out.shape} and lse {lse.shape} must be "
                f"{q.shape}, {q.shape} and {(B, H, Tq)}"
            )
        dq, dk, dv = q._new_empty(q.shape), k._new_empty(k.shape), v._new_empty(v.shape)
        if q.size == 0:
            CudaKernelOps.fill(dk, 0.0)
            CudaKernelOps.fill(dv, 0.0)
            return dq, dk, dv
        ws_len = lib.attention_bw_workspace_floats(B, H, Tq) if act == 0 else 1
        ws = rt.torch.empty(ws_len, dtype=rt.float32, device=rt.device)
        tensors = tuple(_contiguous(t) for t in (grad_out, q, k, v, out, lse))
        mask_ptr = None if mask is None else _ptr(_contiguous(mask))
        code = lib.launch_attention_bw(
            _ptr(dq), _ptr(dk), _ptr(dv), *(_ptr(t) for t in tensors), mask_ptr, ws.data_ptr(), B, H, Tq, Tk, D,
            int(bool(causal)), act, float(scale), rt.stream(),
        )  # fmt: skip
        _check(code, lib, f"fused_attention_bw q {q.shape} k {k.shape}")
        return dq, dk, dv

    @staticmethod
    def fused_linear_cross_entropy_fw(
        hidden: "Tensor",
        weight: "Tensor",
        bias: Optional["Tensor"],
        targets: "Tensor",
        token_weights: "Tensor",
        chunk_size: int,
        need_grad: bool,
    ) -> Tuple["Tensor", Optional["Tensor"], Optional["Tensor"], Optional["Tensor"]]:
        """Chunked LM head + fused classifier (src/classifier_kernel.cu); see TensorOps for the
        contract.  A target outside [0, V) on a token with a non-zero weight makes the loss NaN."""
        tensors = (hidden, weight, targets, token_weights) + (() if bias is None else (bias,))
        _require_cuda("fused_linear_cross_entropy", *tensors)
        return _fused_linear_cross_entropy(hidden, weight, bias, targets, token_weights, chunk_size, need_grad)

    @staticmethod
    def adamw_step(
        param: "Tensor",
        grad: "Tensor",
        exp_avg: "Tensor",
        exp_avg_sq: "Tensor",
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        step: int,
    ) -> None:
        """Fused AdamW (src/optimizer_kernel.cu): param, exp_avg and exp_avg_sq updated in place in
        one pass (28 bytes per element)."""
        rt = _rt or _runtime()
        lib = rt.fused_lib("optimizer_kernel")
        _require_cuda("adamw_step", param, grad, exp_avg, exp_avg_sq)
        for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
            if t.shape != param.shape:
                raise CudaShapeError(f"adamw_step: {name} of shape {t.shape} for a parameter of shape {param.shape}")
        for name, t in (("param", param), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
            if not t.is_contiguous():
                raise CudaShapeError(
                    f"adamw_step updates {name} in place and needs it contiguous, got shape {t.shape} "
                    f"strides {t._tensor.strides}"
                )
        g = _contiguous(grad)
        code = lib.launch_adamw(
            _ptr(param), _ptr(g), _ptr(exp_avg), _ptr(exp_avg_sq), param.size, lr, beta1, beta2, eps,
            weight_decay, int(step), rt.stream(),
        )  # fmt: skip
        _check(code, lib, f"adamw_step {param.shape}")


def _attention_sizes(
    op: str, q: "Tensor", k: "Tensor", v: "Tensor", mask: Optional["Tensor"], activation: str
) -> Tuple[int, int, int, int, int, int]:
    """(B, H, Tq, Tk, D, activation code) after checking the shapes the attention kernels take."""
    if q.dims != 4 or k.dims != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise CudaShapeError(
            f"{op}: q [B, H, Tq, D], k and v [B, H, Tk, D] expected, got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if not 1 <= D <= ATTENTION_MAX_HEAD_DIM or Tk == 0:
        raise CudaShapeError(
            f"{op}: the CUDA kernels take head dims 1..{ATTENTION_MAX_HEAD_DIM} and at least one key, got q {q.shape}, "
            f"k {k.shape}"
        )
    if mask is not None and mask.shape not in ((B, Tk), (B, 1, 1, Tk)):
        raise CudaShapeError(f"{op}: mask of shape {mask.shape} must be [B, Tk] = {(B, Tk)} for k {k.shape}")
    if activation not in ATTENTION_ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ATTENTION_ACTIVATIONS}, got {activation!r}")
    return B, H, Tq, Tk, D, ATTENTION_ACTIVATIONS.index(activation)


def _reduce_plan(
    rt: _Runtime, op: str, shape: Tuple[int, ...], strides: Tuple[int, ...], dim: int
) -> Tuple[Tuple[int, ...], MtLayout, MtLayout, int, int, int, int]:
    if not 0 <= dim < len(shape):
        raise CudaShapeError(f"{op}: dim {dim} is out of range for shape {shape}")
    _layout(shape, strides)  # rejects layouts beyond 32-bit offsets
    out_shape = shape[:dim] + (1,) + shape[dim + 1 :]
    out_strides = strides_from_shape(out_shape)
    keep = [d for d in range(len(shape)) if d != dim]
    outer_shape = [shape[d] for d in keep]
    merged_shape, (out_st, in_st) = _coalesce(outer_shape, [[out_strides[d] for d in keep], [strides[d] for d in keep]])
    reduce_len = shape[dim]
    # A reduced dim of size 1 has an arbitrary stride; 1 keeps it on the row kernel's path.
    reduce_stride = strides[dim] if reduce_len > 1 else 1
    n_out = prod(outer_shape)
    # The workspace size depends only on the sizes and the device, so it is planned once too.
    ws_len = rt.combine.reduce_workspace_floats(n_out, reduce_len, reduce_stride) if n_out else 0
    out_l, in_l = _layout(merged_shape, out_st), _layout(merged_shape, in_st)
    return out_shape, out_l, in_l, n_out, reduce_len, reduce_stride, ws_len


# Split-K: a product with few output tiles and a long inner dimension (the weight gradients
# x^T @ dy: [C, tokens] @ [tokens, C']) would leave most SMs idle, so K is cut into `split` slices
# computed as a batch of products (slice s reads A and B from s * K/split on) and then summed.
_TILE = 128
_SPLIT_K_MIN_SLICE = 256


@functools.lru_cache(maxsize=1024)
def _split_k(n: int, m: int, k: int, sm_count: int) -> int:
    """How many K slices fill about two waves of the GPU (1: no split); slices divide K evenly."""
    tiles = -(-n // _TILE) * -(-m // _TILE)
    if tiles >= sm_count or k < 2 * _SPLIT_K_MIN_SLICE:
        return 1
    want = min(-(-2 * sm_count // tiles), k // _SPLIT_K_MIN_SLICE)
    return max((s for s in range(1, want + 1) if k % s == 0), default=1)


def _matmul_split_k(rt: "_Runtime", a: "Tensor", b: "Tensor", strides: Tuple[int, int, int, int], split: int) -> "Tensor":
    n, k, m = a.shape[0], a.shape[1], b.shape[1]
    part = k // split
    partial = a._new_empty((split, n, m))
    a_slices = _layout((split,), (part * strides[1],))
    b_slices = _layout((split,), (part * strides[2],))
    code = rt.combine.launch_matmul(
        _ptr(partial), _ptr(a), _ptr(b), n, m, part, *strides, a_slices, b_slices, rt.stream()
    )
    _check(code, rt.combine, f"matmul {a.shape} @ {b.shape} (split-K {split})")
    return a.backend.add_reduce(partial, 0)._view((n, m))


def _matmul_plan(
    a_shape: Tuple[int, ...], a_strides: Tuple[int, ...], b_shape: Tuple[int, ...], b_strides: Tuple[int, ...]
) -> Tuple[Tuple[int, ...], Tuple[int, int, int, int], MtLayout, MtLayout]:
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise CudaShapeError(f"matmul needs tensors of at least 2 dims, got {a_shape} @ {b_shape}")
    if a_shape[-1] != b_shape[-2]:
        raise CudaShapeError(f"matmul shapes {a_shape} @ {b_shape}: inner sizes {a_shape[-1]} and {b_shape[-2]} differ")
    batch = _broadcast_shape("matmul batch dims", a_shape[:-2], b_shape[:-2])
    for shape, strides in ((a_shape, a_strides), (b_shape, b_strides)):
        _layout(shape, strides)  # rejects layouts beyond 32-bit offsets
    a_bs = _broadcast_strides(a_shape[:-2], a_strides[:-2], batch)
    b_bs = _broadcast_strides(b_shape[:-2], b_strides[:-2], batch)
    merged, (a_st, b_st) = _coalesce(batch, [a_bs, b_bs])
    out_shape = batch + (a_shape[-2], b_shape[-1])
    if prod(out_shape) >= _INT_LIMIT:
        raise CudaShapeError(f"matmul {a_shape} @ {b_shape}: the result exceeds the CUDA kernels' 32-bit indexing")
    mat_strides = (a_strides[-2], a_strides[-1], b_strides[-2], b_strides[-1])
    return out_shape, mat_strides, _layout(merged, a_st), _layout(merged, b_st)


# ---- fused linear cross-entropy ------------------------------------------------------------------
# Everything [rows, V]-sized lives in one reused buffer: each chunk's logits, which the fused
# classifier overwrites with their gradient.  The products run through combine.so's matmul launcher
# directly, on raw pointers into row blocks of the inputs and outputs (no copies, no views).
_F32 = 4  # bytes per element


def _raw_matmul(
    rt: _Runtime, out: int, a: int, b: int, M: int, N: int, K: int, a_strides: Tuple[int, int],
    b_strides: Tuple[int, int], batch: int = 1, batch_offset: int = 0,
) -> None:
    """out[i] = A[i] @ B[i] for i < batch, out contiguous [batch, M, N]; A[i][r, k] =
    a[i * batch_offset + r * a_strides[0] + k * a_strides[1]], B[i][k, c] likewise with b."""
    slices = _layout((batch,), (batch_offset,))
    code = rt.combine.launch_matmul(out, a, b, M, N, K, *a_strides, *b_strides, slices, slices, rt.stream())
    _check(code, rt.combine, f"matmul [{M}, {K}] @ [{K}, {N}] x{batch}")


def _column_sums(rt: _Runtime, out: int, a: int, n_out: int, n_rows: int, row_stride: int) -> None:
    """out[o] = sum over r < n_rows of a[o + r * row_stride], for o < n_out (deterministic)."""
    ws_len = rt.combine.reduce_workspace_floats(n_out, n_rows, row_stride)
    ws = rt.torch.empty(ws_len, dtype=rt.float32, device=rt.device) if ws_len else None
    flat = _layout((n_out,), (1,))
    code = rt.combine.launch_reduce(
        _BINARY_CODES[operators.add], out, flat, a, flat, n_rows, row_stride, 0.0,
        None if ws is None else ws.data_ptr(), ws_len, rt.stream(),
    )  # fmt: skip
    _check(code, rt.combine, f"column sums of [{n_rows}, {n_out}]")


def _add_into(rt: _Runtime, dst: int, src: int, n: int) -> None:
    """dst[i] += src[i] for i < n."""
    flat = _layout((n,), (1,))
    code = rt.combine.launch_zip(_BINARY_CODES[operators.add], dst, flat, dst, flat, src, flat, rt.stream())
    _check(code, rt.combine, f"accumulate {n} floats")


def _fused_linear_cross_entropy(
    hidden: "Tensor", weight: "Tensor", bias: Optional["Tensor"], targets: "Tensor", token_weights: "Tensor",
    chunk_size: int, need_grad: bool,
) -> Tuple["Tensor", Optional["Tensor"], Optional["Tensor"], Optional["Tensor"]]:
    rt = _rt or _runtime()
    lib = rt.fused_lib("classifier_kernel")
    if hidden.dims != 2 or weight.dims != 2 or hidden.shape[1] != weight.shape[0]:
        raise CudaShapeError(f"fused_linear_cross_entropy: hidden {hidden.shape} @ weight {weight.shape}")
    N, C = hidden.shape
    V = weight.shape[1]
    if N < 1 or C < 1 or V < 1 or chunk_size < 1:
        raise CudaShapeError(f"fused_linear_cross_entropy: empty problem hidden {hidden.shape}, weight {weight.shape}")
    if targets.shape != (N,) or token_weights.shape != (N,) or (bias is not None and bias.shape != (V,)):
        raise CudaShapeError(
            f"fused_linear_cross_entropy: hidden {hidden.shape}, weight {weight.shape} need targets and token weights "
            f"({N},) and bias ({V},), got {targets.shape}, {token_weights.shape}, "
            f"{None if bias is None else bias.shape}"
        )
    chunk = min(chunk_size, N)
    if chunk * V >= _INT_LIMIT:
        raise CudaShapeError(
            f"fused_linear_cross_entropy: a chunk of {chunk} rows x {V} classes exceeds the kernels' 32-bit "
            f"indexing; pass chunk_size <= {(_INT_LIMIT - 1) // V}"
        )
    h, w, ids, tw = (_contiguous(t) for t in (hidden, weight, targets, token_weights))
    b = None if bias is None else _contiguous(bias)
    hp, wp, bp = _ptr(h), _ptr(w), None if b is None else _ptr(b)
    weight_sum = tw.backend.add_reduce(tw, 0)
    losses = hidden._new_empty((N,))
    logits = rt.torch.empty(chunk * V, dtype=rt.float32, device=rt.device)
    lg = logits.data_ptr()
    dhidden = dweight = dbias = partial = w_scratch = b_scratch = None
    slabs: Dict[int, Tuple[int, int, int, int]] = {}
    if need_grad:
        dhidden, dweight = hidden._new_empty((N, C)), weight._new_empty((C, V))
        dbias = None if b is None else weight._new_empty((V,))
        # dhidden = dlogits @ weight^T is split over `splits` vocab slabs of `slab` columns (one
        # batched launch) plus, when slab does not divide V, a last short slab of `rest` columns; the
        # partial products are then summed into dhidden's rows. Planned per row count (the full
        # chunks and the last one).
        for rows in {chunk, N - (N - 1) // chunk * chunk}:
            splits = lib.fused_loss_vocab_splits(rows, C, V)
            slab = V // splits
            rest = V - splits * slab
            slabs[rows] = (splits, slab, rest, splits + (1 if rest else 0))
        partial_len = max((n_parts * rows * C for rows, (_, _, _, n_parts) in slabs.items() if n_parts > 1), default=0)
        if partial_len:
            partial = rt.torch.empty(partial_len, dtype=rt.float32, device=rt.device)
        # Later chunks' contributions to dweight and dbias go through a scratch buffer and are added.
        w_scratch = rt.torch.empty(C * V, dtype=rt.float32, device=rt.device) if N > chunk else None
        b_scratch = rt.torch.empty(V, dtype=rt.float32, device=rt.device) if N > chunk and b is not None else None
    for n0 in range(0, N, chunk):
        rows = min(chunk, N - n0)
        h_rows = hp + _F32 * n0 * C
        _raw_matmul(rt, lg, h_rows, wp, rows, V, C, (C, 1), (V, 1))
        code = lib.launch_fused_classifier(
            lg, _ptr(losses) + _F32 * n0, bp, _ptr(ids) + _F32 * n0, _ptr(tw) + _F32 * n0, _ptr(weight_sum),
            rows, V, int(need_grad), rt.stream(),
        )  # fmt: skip
        _check(code, lib, f"fused classifier [{rows}, {V}]")
        if dhidden is None or dweight is None:
            continue
        dh_rows = _ptr(dhidden) + _F32 * n0 * C
        splits, slab, rest, n_parts = slabs[rows]
        if n_parts == 1:
            _raw_matmul(rt, dh_rows, lg, wp, rows, C, V, (V, 1), (1, V))
        else:
            pp = partial.data_ptr()
            _raw_matmul(rt, pp, lg, wp, rows, C, slab, (V, 1), (1, V), batch=splits, batch_offset=slab)
            if rest:
                off = _F32 * splits * slab
                _raw_matmul(rt, pp + _F32 * splits * rows * C, lg + off, wp + off, rows, C, rest, (V, 1), (1, V))
            _column_sums(rt, dh_rows, pp, rows * C, n_parts, rows * C)
        first = n0 == 0
        _raw_matmul(rt, _ptr(dweight) if first else w_scratch.data_ptr(), h_rows, lg, C, V, rows, (1, C), (V, 1))
        if not first:
            _add_into(rt, _ptr(dweight), w_scratch.data_ptr(), C * V)
        if dbias is not None:
            _column_sums(rt, _ptr(dbias) if first else b_scratch.data_ptr(), lg, V, rows, V)
            if not first:
                _add_into(rt, _ptr(dbias), b_scratch.data_ptr(), V)
    return losses.backend.add_reduce(losses, 0), dhidden, dweight, dbias
