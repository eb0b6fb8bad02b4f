"""Bindings of the CUDA kernel libraries (src/*.cu -> minitorch/cuda_kernels/*.so).

`runtime` loads the libraries and holds the stream, errors and statistics; `layout` plans the
shape/stride structs the kernels take; `staging` queues pinned host->device uploads; `timer` times
GPU work for tests and benchmarks; every other module binds one library: its ctypes signatures and
launch wrappers over TensorData.  `minitorch.cuda_kernel_ops.CudaKernelOps` is the op table
built from them.  Nothing here imports torch or loads a library at import time.
"""
