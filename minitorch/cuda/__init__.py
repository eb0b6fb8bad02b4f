"""Bindings of the CUDA kernel libraries (src/*.cu -> minitorch/cuda_kernels/*.so).

`runtime` loads the libraries and holds the stream, errors and statistics; `layout` plans the
shape/stride structs the kernels take; `staging` queues pinned host->device uploads; `timer` times
GPU work for tests and benchmarks; every other module binds one library: its ctypes signatures and
launch wrappers over TensorData.  `minitorch.cuda_kernel_ops.CudaKernelOps` is the op table
built from them.  Nothing here imports torch or loads a library at import time.

`minitorch.cuda.is_available()` answers as torch.cuda.is_available() does, for minitorch's backend.
"""


def is_available() -> bool:
    """Whether the CUDA backend can run here: torch with a CUDA GPU and every kernel library built and
    up to date (minitorch.cuda_unavailable_reason() says what is missing)."""
    from ..backends import cuda_unavailable_reason  # late: the backend choice is built on these bindings

    return cuda_unavailable_reason() is None
