"""FastOps: the CPU default backend, numba-compiled and parallel over output elements.

Elementwise and reduce kernels (fast_kernels.py, compiled once per scalar function and cached on
disk by numba, see `kernels`) run over a coalesced layout (size-1 dims dropped, dims contiguous in
every operand merged, broadcast dims at stride 0): parallel over rows of the last dim, computing a
row's storage positions once, with unit-stride loops the compiler vectorizes.  Matmul goes to
NumPy's BLAS on strided views of the storages (no copies).  The first process that uses a kernel
compiles it (a one-line notice says so); later ones load it from the cache.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numba
import numpy as np
from numba import njit, prange

from . import operators
from .dtypes import DType, float32, int64
from .simple_ops import SimpleOps
from .tensor_data import TensorData, broadcast_strides, coalesce, shape_broadcast
from .tensor_ops import TensorOps, as_array, emulated, empty, host_argsort, host_ids, new_output, typed_start

KERNEL_TEMPLATE = Path(__file__).with_name("fast_kernels.py")
_modules: Dict[str, Any] = {}
_noticed: List[bool] = []


def cache_dir() -> Path:
    """Where the compiled CPU kernels are kept: $MINITORCH_CACHE_DIR, else ~/.cache/minitorch."""
    return Path(os.environ.get("MINITORCH_CACHE_DIR") or Path.home() / ".cache" / "minitorch")


def kernel(fn: Callable, kind: str) -> Callable[[], Any]:
    """A getter of the `kind` kernel ("unary", "binary" or "reduce") of the minitorch.operators
    function fn: fast_kernels.py compiled for fn, from its own copy of the template (named by the
    template's and operators.py's contents, so an edit of either makes new copies), beside which
    numba caches the machine code on disk; a later process loads it instead of compiling.  The copy
    is loaded on the getter's first call (importing minitorch compiles and loads nothing)."""
    name = getattr(fn, "__name__", "")
    if getattr(operators, name, None) is not fn:
        raise ValueError(f"FastOps compiles the functions of minitorch.operators; {fn!r} is not one of them")

    def get() -> Any:
        module = _modules.get(name)
        if module is None:
            module = _modules[name] = _load(name)
        found = getattr(module, kind)
        if not found.signatures and not _noticed and not _cached(module, kind):
            _noticed.append(True)
            print(
                f"minitorch: compiling CPU kernels with numba on their first use, a few seconds each "
                f"(cached in {Path(module.__file__).parent} for later runs)",
                file=sys.stderr,
            )
        return found

    return get


def _cached(module: Any, kind: str) -> bool:
    """Whether numba's cache beside module's file holds its `kind` kernel (an index file of it)."""
    directory = Path(module.__file__).parent / "__pycache__"
    prefix = f"{module.__name__}.{kind}-"
    return directory.is_dir() and any(p.name.startswith(prefix) and p.suffix == ".nbi" for p in directory.iterdir())


def _load(name: str) -> Any:
    source = KERNEL_TEMPLATE.read_bytes()
    digest = hashlib.sha256(source + Path(operators.__file__).read_bytes()).hexdigest()[:16]
    module_name = f"minitorch_kernels_{digest}__{name}"
    path = _copy_of_template(module_name, source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # numba's cache finds a kernel's module by name
    spec.loader.exec_module(module)
    return module


def _copy_of_template(module_name: str, source: bytes) -> Path:
    """The template's copy for one function: in cache_dir(), or where that is not writable, in a
    fresh temporary directory (compiled again in every process).  Never the template itself: numba
    names a cache by its source file, so two functions compiled from one file would share one."""
    for directory in (cache_dir() / "kernels", None):
        directory = Path(tempfile.mkdtemp(prefix="minitorch-kernels-")) if directory is None else directory
        path = directory / f"{module_name}.py"
        try:
            if not path.exists():
                directory.mkdir(parents=True, exist_ok=True)
                staged = directory / f".{module_name}.{os.getpid()}.tmp"
                staged.write_bytes(source)
                os.replace(staged, path)
            return path
        except OSError:
            continue
    raise OSError("no writable directory for minitorch's CPU kernels (set MINITORCH_CACHE_DIR)")


# Below this many elements a kernel runs on one thread.  A parallel region waits for every thread
# to be scheduled: microseconds on an idle machine, but a whole scheduler time slice (~15 ms,
# measured on a busy 2-core machine) when other processes hold the cores, while one thread streams
# 2M floats in about 2 ms.
PARALLEL_MIN_ELEMENTS = 1 << 21


def _launch(kernel: Any, work: int, *args: Any) -> None:
    if work >= PARALLEL_MIN_ELEMENTS:
        kernel(*args)
        return
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        kernel(*args)
    finally:
        numba.set_num_threads(threads)


_plans: Dict[tuple, tuple] = {}


def _plan(shape: Tuple[int, ...], operands: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...]]]) -> tuple:
    """(shape, strides of each operand) as int64 arrays, operands broadcast to shape and dims coalesced
    (size-1 dims dropped, neighbours contiguous in every operand merged); cached by layout."""
    key = (shape,) + tuple(operands)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= 4096:
            _plans.clear()
        merged, strides = coalesce(shape, [broadcast_strides(s, st, shape) for s, st in operands])
        plan = (np.array(merged, dtype=np.int64),) + tuple(np.array(st, dtype=np.int64) for st in strides)
        _plans[key] = plan
    return plan


@njit(parallel=True, cache=True)
def _gather_kernel(out, weight, w_strides, ids, n, c, v):  # type: ignore[no-untyped-def]
    for rr in prange(n):
        r = np.int64(rr)
        row = int(ids[r])
        if row < 0 or row >= v:
            for j in range(c):
                out[r * c + j] = 0.0
        else:
            for j in range(c):
                out[r * c + j] = weight[row * w_strides[0] + j * w_strides[1]]


@njit(cache=True)
def _scatter_add_kernel(out, grad, ids, n, c):  # type: ignore[no-untyped-def]
    for r in range(n):
        row = int(ids[r])
        for j in range(c):
            out[row * c + j] += grad[r * c + j]


@njit(parallel=True, cache=True)
def _arg_reduce_kernel(out, a, bases, n, step, largest):  # type: ignore[no-untyped-def]
    for rr in prange(bases.size):
        r = np.int64(rr)
        p = bases[r]
        best = a[p]
        at = 0
        j = 1
        while j < n and best == best:  # a NaN is the extreme: the first one ends the search
            v = a[p + j * step]
            if v != v or (v > best if largest else v < best):
                best = v
                at = j
            j += 1
        out[r] = at


@njit(parallel=True, cache=True)
def _cumsum_kernel(out, out_bases, out_step, a, bases, n, step):  # type: ignore[no-untyped-def]
    for rr in prange(bases.size):
        r = np.int64(rr)
        acc = a[bases[r]]
        out[out_bases[r]] = acc
        for j in range(1, n):
            acc += a[bases[r] + j * step]
            out[out_bases[r] + j * out_step] = acc


def _row_bases(t: TensorData, dim: int) -> np.ndarray:
    """Storage positions of t's elements whose index along dim is 0, in row-major order."""
    bases = np.zeros((1,) * t.dims, dtype=np.int64)
    for d, (size, stride) in enumerate(zip(t.shape, t.strides)):
        if d != dim:
            bases = bases + (np.arange(size, dtype=np.int64) * stride).reshape((1,) * d + (size,) + (1,) * (t.dims - d - 1))
    return bases.reshape(-1)


def _contiguous(t: TensorData) -> TensorData:
    return t if t.is_contiguous() else _copy_op()(t)


@functools.lru_cache(maxsize=None)
def _copy_op() -> Callable[..., TensorData]:
    return FastOps.map(operators.id)


class FastOps(TensorOps):
    """numba-parallel CPU backend (the default)."""

    storage_empty = SimpleOps.storage_empty
    storage_from_numpy = SimpleOps.storage_from_numpy
    storage_to_numpy = SimpleOps.storage_to_numpy
    storage_upload = SimpleOps.storage_upload
    fill = SimpleOps.fill
    arange = SimpleOps.arange
    uniform = SimpleOps.uniform

    @staticmethod
    def map(fn: Callable[[float], float]) -> Callable[..., TensorData]:
        compiled = kernel(fn, "unary")

        def ret(x: TensorData, out: Optional[TensorData] = None) -> TensorData:
            o = new_output(FastOps, x.shape, fn, x) if out is None else out
            if o.size:
                shape, so, sa = _plan(o.shape, ((o.shape, o.strides), (x.shape, x.strides)))
                _launch(compiled(), o.size, o._storage, so, x._storage, sa, shape)
            return o

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[..., TensorData]:
        op = FastOps.zip(fn)
        return lambda x, s, out=None: op(x, TensorData(np.array([s], dtype=np.int64 if isinstance(s, int) else np.float32), ()), out)

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[[TensorData, TensorData], TensorData]:
        compiled = kernel(fn, "binary")

        def ret(x: TensorData, y: TensorData, out: Optional[TensorData] = None) -> TensorData:
            o = new_output(FastOps, shape_broadcast(x.shape, y.shape), fn, x) if out is None else out
            if o.size:
                shape, so, sa, sb = _plan(o.shape, ((o.shape, o.strides), (x.shape, x.strides), (y.shape, y.strides)))
                _launch(compiled(), o.size, o._storage, so, x._storage, sa, y._storage, sb, shape)
            return o

        return ret

    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[[TensorData, int], TensorData]:
        compiled = kernel(fn, "reduce")

        def ret(x: TensorData, dim: int) -> TensorData:
            o = new_output(FastOps, x.shape[:dim] + (1,) + x.shape[dim + 1 :], fn, x)
            if o.size:
                outer = x.shape[:dim] + (1,) + x.shape[dim + 1 :]
                shape, so, sa = _plan(outer, ((o.shape, o.strides), (outer, x.strides[:dim] + (0,) + x.strides[dim + 1 :])))
                n = x.shape[dim]
                step = x.strides[dim] if n > 1 else 1
                _launch(compiled(), x.size, o._storage, so, x._storage, sa, shape, n, step, typed_start(start, x))
            return o

        return ret

    @staticmethod
    def matrix_multiply(x: TensorData, y: TensorData) -> TensorData:
        """Batched, broadcasting x @ y by NumPy's matmul (BLAS gemm per matrix) on strided views of
        the storages, so transposed and permuted operands are read in place, without copies."""
        batch = shape_broadcast(x.shape[:-2], y.shape[:-2])
        o = new_output(FastOps, batch + (x.shape[-2], y.shape[-1]), None, x)
        if o.size:
            np.matmul(as_array(x), as_array(y), out=as_array(o))
        return o

    @staticmethod
    def arg_reduce(x: TensorData, dim: int, largest: bool) -> TensorData:
        """See TensorOps: the position of the first max/min along dim (NaN the extreme), int64."""
        o = empty(FastOps, x.shape[:dim] + (1,) + x.shape[dim + 1 :], int64)
        if o.size:
            bases = _row_bases(x, dim)
            _launch(_arg_reduce_kernel, x.size, o._storage, x._storage, bases, x.shape[dim], x.strides[dim], largest)
        return o

    @staticmethod
    def cumsum(x: TensorData, dim: int) -> TensorData:
        """Running sums along dim, in x's storage type (float32 sums in float32, in order)."""
        o = empty(FastOps, x.shape, int64 if x.dtype.is_integer else float32)
        if o.size:
            args = (o._storage, _row_bases(o, dim), o.strides[dim], x._storage, _row_bases(x, dim), x.shape[dim], x.strides[dim])
            _launch(_cumsum_kernel, x.size, *args)
        return o

    sort_indices = staticmethod(host_argsort)

    @staticmethod
    def embedding_fw(weight: TensorData, ids: TensorData, dtype: Optional[DType] = None) -> TensorData:
        """weight [V, C] rows picked by integral ids [...] -> [..., C] of dtype (default weight's);
        ids outside [0, V) raise."""
        V, C = weight.shape
        flat = host_ids(ids, V)
        o = empty(FastOps, ids.shape + (C,), weight.dtype)
        _launch(_gather_kernel, o.size, o._storage, weight._storage, weight.np_strides, flat, ids.size, C, V)
        return emulated(o, dtype or weight.dtype)

    @staticmethod
    def embedding_bw(
        grad_out: TensorData, ids: TensorData, num_embeddings: int, dtype: Optional[DType] = None,
        initial: Optional[TensorData] = None, in_place: bool = False,
    ) -> TensorData:  # fmt: skip
        """Scatter-add of grad_out rows [..., C] into a zeroed [num_embeddings, C] gradient of dtype
        (default grad_out's), or into a copy of initial (initial itself with in_place: the caller's
        contiguous float32 table), summed in float32."""
        C = grad_out.shape[-1]
        flat = host_ids(ids, num_embeddings)
        if in_place and initial is not None:
            o = initial
        else:
            o = empty(FastOps, (num_embeddings, C))
            o._storage[:] = 0.0 if initial is None else _contiguous(initial)._storage
        _scatter_add_kernel(o._storage, _contiguous(grad_out)._storage, flat, ids.size, C)
        return emulated(o, dtype or grad_out.dtype)
