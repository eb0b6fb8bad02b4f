"""Loading the kernel libraries, the CUDA runtime state (torch, stream, device), errors and stats.

Storage of a CUDA tensor is a 1-D `torch` tensor of its dtype's storage format (float32 for float32
and bool, bfloat16, float16) on the current CUDA device, used only as a buffer from PyTorch's
caching allocator; kernels get raw device pointers and launch on PyTorch's current stream.  Nothing is loaded at import: the first use loads torch and the libraries and raises
a RuntimeError that names the fix when something is missing.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..dtypes import DType, dtype_named, float32, no_kernel
from ..tensor_data import IndexingError, TensorData

KERNEL_DIR = Path(__file__).resolve().parent.parent / "cuda_kernels"
BUILD_HINT = "build them with `bash compile_cuda.sh` in the repository root"
INT_LIMIT = 2**31  # kernels index with 32-bit ints

Signatures = Dict[str, Tuple[Any, List[Any]]]
ERROR_STRING: Signatures = {"minitorch_error_string": (ctypes.c_char_p, [ctypes.c_int])}


class CudaKernelError(RuntimeError):
    """A kernel launcher returned a CUDA error code."""


class CudaShapeError(IndexingError, ValueError):
    """Shapes that do not fit an op (an IndexingError like the CPU backends raise, and a ValueError)."""


def library_path(name: str) -> Path:
    """Where compile_cuda.sh puts the library built from src/<name>.cu."""
    return KERNEL_DIR / f"{name}.so"


def load_library(name: str, signatures: Signatures) -> ctypes.CDLL:
    """Load one kernel library with its argtypes/restype declared (no GPU needed to load it)."""
    path = library_path(name)
    if not path.exists():
        raise RuntimeError(f"CUDA kernels are not built: {path} is missing; {BUILD_HINT}")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise RuntimeError(f"cannot load CUDA kernels from {path}: {e}; {BUILD_HINT}") from e
    for symbol, (restype, argtypes) in {**ERROR_STRING, **signatures}.items():
        try:
            fn = getattr(lib, symbol)
        except AttributeError:
            raise RuntimeError(f"{path} does not export {symbol}: it is out of date; {BUILD_HINT}") from None
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


class Runtime:
    """torch, the device, the stream getter and the loaded libraries."""

    def __init__(self) -> None:
        try:
            import torch
        except ImportError as e:
            raise RuntimeError("the CUDA backend needs PyTorch (it provides device memory and streams)") from e
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the CUDA backend needs a CUDA GPU, and torch.cuda.is_available() is False here; "
                "use the CPU backend (FastOps) on this machine"
            )
        local_rank = os.environ.get("LOCAL_RANK", "")
        if local_rank.isdigit() and int(local_rank) < torch.cuda.device_count():
            # Under torchrun, this process's GPU, before anything here touches one: a program that
            # looks at the device before joining its process group (choosing a preset) stays off GPU 0.
            torch.cuda.set_device(int(local_rank))
        self.torch = torch
        self.float32 = torch.float32
        self.device = torch.device("cuda")
        self.libs: Dict[str, ctypes.CDLL] = {}
        self._side: Dict[int, Any] = {}
        self.unsettled: Dict[Any, Any] = {}  # stream -> (the side stream, the SideWork forked from it not yet joined)
        self.sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        get_device = getattr(torch._C, "_cuda_getDevice", None)
        if get_raw is not None and get_device is not None:
            # The private accessors skip building a torch.cuda.Stream object per launch (~1 us).
            self.stream: Callable[[], int] = lambda: get_raw(get_device())
        else:
            self.stream = lambda: torch.cuda.current_stream().cuda_stream

    def lib(self, name: str, signatures: Signatures) -> ctypes.CDLL:
        """The library built from src/<name>.cu, loaded once."""
        lib = self.libs.get(name)
        if lib is None:
            lib = self.libs[name] = load_library(name, signatures)
        return lib

    def buffer(self, floats: int) -> Any:
        """An uninitialized device buffer of `floats` float32 from the caching allocator."""
        return self.torch.empty(floats, dtype=self.float32, device=self.device)

    def storage(self, size: int, dtype: DType) -> Any:
        """An uninitialized device buffer of `size` elements in dtype's storage format."""
        return self.torch.empty(size, dtype=getattr(self.torch, dtype.storage), device=self.device)

    def side_stream(self) -> Any:
        """A second stream of the current device (made once), for work that may run beside the
        current stream's (see fork)."""
        device = self.torch.cuda.current_device()
        found = self._side.get(device)
        if found is None:
            found = self._side[device] = self.torch.cuda.Stream(device=device)
        return found


_rt: List[Runtime] = []
_checks: List[Callable[[Runtime], None]] = []


class SideWork:
    """Work queued on the side stream by one fork: settle() makes the stream that forked it wait for
    it (an event edge inside a CUDA graph capture); only the first call waits."""

    def __init__(self, main: Any, event: Any):
        self._main, self._event = main, event

    def settle(self) -> None:
        if self._event is not None:
            self._main.wait_event(self._event)
            self._event = None

    def joined(self) -> None:
        """The stream that forked it has waited for the whole side stream (settle_side): nothing left
        to wait for (and no event of an earlier step waited for inside a later graph capture)."""
        self._event = None


def fork(
    beside: Callable[[], None], then: Callable[[], None], reads: Sequence[TensorData], writes: Sequence[TensorData],
    readers_wait: bool = False,
) -> SideWork:
    """beside() queued on the runtime's side stream and then() on the current stream, to run at the
    same time: the side stream first waits for everything queued on the current stream so far.  The
    current stream does not wait for beside()'s work here: the returned SideWork does that when
    settled, which fork marks each of `writes` (the TensorData beside() writes) to need before any use
    (TensorData.in_flight) and each of `reads` (those it only reads) before a write into them
    (TensorData.read_beside), so that backward runs on while, say, a weight gradient is still being
    made, and waits only where something reads it or writes into what it reads (see Tensor.settle);
    settle_side() waits for all of it.  readers_wait: `reads` too are waited for before any use, as
    `writes` are (TensorData.in_flight): for side work that, left to run beside what reads them
    next, would hold the SMs that work needs.  The caching allocator keeps `reads` and `writes` from reuse
    until the side stream is done with them, so the caller may drop them at once.  Buffers beside()
    allocates come from the side stream's pool."""
    rt = runtime()
    main, side = rt.torch.cuda.current_stream(), rt.side_stream()
    side.wait_stream(main)
    with rt.torch.cuda.stream(side):
        beside()
        event = side.record_event()
    work = SideWork(main, event)
    for t in (*reads, *writes):
        t._storage.record_stream(side)
    for t in reads:
        if readers_wait:
            t.in_flight = work
        else:
            t.read_beside = work
    for t in writes:
        t.in_flight = work
    then()
    rt.unsettled.setdefault(main, (side, []))[1].append(work)
    return work


def settle_side() -> None:
    """The current stream waits for all the work forked from it onto the side stream (the end of a
    backward pass: what follows reads the gradients, and a CUDA graph capture must join every stream
    it forked)."""
    rt = runtime()
    if not rt.unsettled:
        return
    main = rt.torch.cuda.current_stream()
    side, works = rt.unsettled.pop(main, (None, ()))
    if side is not None:
        main.wait_stream(side)
    for work in works:
        work.joined()


def on_load(check: Callable[[Runtime], None]) -> Callable[[Runtime], None]:
    """Register a check that runs once when the runtime loads (e.g. the opcode tables)."""
    _checks.append(check)
    return check


def runtime() -> Runtime:
    """The loaded runtime (loaded on first use)."""
    if not _rt:
        rt = Runtime()
        for check in _checks:
            check(rt)
        _rt.append(rt)
    return _rt[0]


def is_loaded() -> bool:
    """True once the runtime has loaded in this process (a CUDA tensor or kernel has been made), so
    that a device is in use; never loads it."""
    return bool(_rt)


def unavailable_reason() -> Optional[str]:
    """Why the CUDA backend cannot run here (None when it can); loads it on success."""
    try:
        runtime()
    except RuntimeError as e:
        return str(e)
    return None


def check_names(library: str, kind: str, count: Callable[[], int], name_of: Callable[[int], bytes],
                expected: Tuple[str, ...], binding: str) -> None:  # fmt: skip
    """RuntimeError naming the fix when a library's exported table (count() entries, name_of(i) each:
    opcodes, dtype codes) differs from its binding's."""
    built = tuple(name_of(i).decode() for i in range(count()))
    if built != expected:
        raise RuntimeError(f"{library}.so's {kind} {built} differ from {binding}'s {expected}; {BUILD_HINT}")


def check(code: int, lib: ctypes.CDLL, what: str) -> None:
    """Raise CudaKernelError with the CUDA error text when a launcher returned non-zero."""
    if code:
        raise CudaKernelError(f"CUDA {what} failed: {lib.minitorch_error_string(code).decode()} (cudaError {code})")


def ptr(t: TensorData) -> int:
    """Device address of a TensorData's storage."""
    return t._storage.data_ptr()


def empty(shape: Tuple[int, ...], dtype: DType = float32) -> TensorData:
    """An uninitialized contiguous CUDA TensorData."""
    size = 1
    for s in shape:
        size *= s
    return TensorData(storage_empty(size, dtype), shape, dtype=dtype)


def storage_empty(size: int, dtype: DType = float32) -> Any:
    """Uninitialized device buffer of `size` elements in dtype's storage format."""
    if size >= INT_LIMIT:
        raise CudaShapeError(f"a CUDA tensor of {size} elements exceeds the limit of {INT_LIMIT - 1}")
    return runtime().storage(size, dtype)


def storage_dtype(storage: Any) -> DType:
    """The minitorch dtype of a device buffer's format (float32 for a bool tensor's storage)."""
    return dtype_named(str(storage.dtype).replace("torch.", ""))


# The storage formats of the kernels templated on their element type, by their code in the C ABI
# (mt::with_storage of src/includes/storage.cuh).
KERNEL_STORAGE = ("float32", "bfloat16")


def require_storage(op: str, formats: Tuple[str, ...], *args: Any) -> None:
    """NoKernelError naming op when an argument (a TensorData, or a list or tuple of them) is stored
    in a format outside `formats`, the ones op's kernels read and write."""
    for arg in args:
        for t in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(t, TensorData) and t.dtype.storage not in formats:
                raise no_kernel(op, t.dtype)


def require_float32(op: str, *args: Any) -> None:
    """NoKernelError naming op when an argument is stored in another format than float32."""
    require_storage(op, (float32.storage,), *args)


def storage_code(t: TensorData) -> int:
    """t's storage format as the code of the templated kernels (KERNEL_STORAGE); ValueError for
    others (hooks check with require_storage first)."""
    return KERNEL_STORAGE.index(t.dtype.storage)


# ---- host<->device transfer accounting ------------------------------------------------------------
_transfers = {"h2d": 0, "d2h": 0, "h2d_bytes": 0, "d2h_bytes": 0}


def count_transfer(direction: str, nbytes: int) -> None:
    """Record one host<->device copy ("h2d" or "d2h") of nbytes."""
    _transfers[direction] += 1
    _transfers[direction + "_bytes"] += nbytes


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
    cuda = runtime().torch.cuda
    stats = {"current": int(cuda.memory_allocated()), "peak": int(cuda.max_memory_allocated())}
    if reset:
        cuda.reset_peak_memory_stats()
    return stats
