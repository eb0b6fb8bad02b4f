"""minitorch: tensors, autodiff, modules and optimizers, with a hand-written CUDA backend.

`import minitorch` works on any machine; the CUDA backend loads its compiled kernels the first
time a CUDA tensor is made and says how to build them if they are missing.
"""

from . import nn, operators
from .autodiff import Context, backpropagate, central_difference, no_grad, topological_sort
from .cuda_kernel_ops import CudaKernelOps
from .fast_ops import FastOps
from .module import Module, ModuleList, Parameter
from .modules_basic import Dropout, Embedding, LayerNorm1d, Linear
from .modules_transformer import DecoderLM, FeedForward, MultiHeadAttention, TransformerLayer
from .optim import SGD, Adam
from .scalar import Scalar, ScalarHistory, derivative_check
from .tensor import (
    History,
    Tensor,
    from_torch,
    full,
    get_rng_state,
    manual_seed,
    ones,
    rand,
    set_rng_state,
    tensor,
    tensor_from_numpy,
    zeros,
)
from .tensor_data import IndexingError, TensorData, shape_broadcast
from .tensor_ops import SimpleBackend, SimpleOps, TensorBackend, TensorOps

__all__ = [
    "nn",
    "operators",
    "Context",
    "backpropagate",
    "central_difference",
    "no_grad",
    "topological_sort",
    "CudaKernelOps",
    "FastOps",
    "Module",
    "ModuleList",
    "Parameter",
    "Dropout",
    "Embedding",
    "LayerNorm1d",
    "Linear",
    "DecoderLM",
    "FeedForward",
    "MultiHeadAttention",
    "TransformerLayer",
    "SGD",
    "Adam",
    "Scalar",
    "ScalarHistory",
    "derivative_check",
    "History",
    "Tensor",
    "from_torch",
    "full",
    "get_rng_state",
    "manual_seed",
    "ones",
    "rand",
    "set_rng_state",
    "tensor",
    "tensor_from_numpy",
    "zeros",
    "IndexingError",
    "TensorData",
    "shape_broadcast",
    "SimpleBackend",
    "SimpleOps",
    "TensorBackend",
    "TensorOps",
]
