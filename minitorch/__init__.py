"""minitorch: tensors, autodiff, modules and optimizers, with a hand-written CUDA backend.

`import minitorch` works on any machine; the CUDA backend loads its compiled kernels the first
time a CUDA tensor is made and says how to build them if they are missing.
"""

from . import dtypes, nn, operators
from .attention_config import AttentionConfig
from .autocast import autocast, get_autocast_dtype, is_autocast_enabled, refresh_working_copies
from .autodiff import Context, backpropagate, central_difference, enable_grad, no_grad, topological_sort
from .backends import BackendChoice, choose_backend, cuda_unavailable_reason, peak_memory_mb
from .checkpoint import checkpoint
from .cuda_kernel_ops import CudaKernelOps, cuda_memory_stats
from .fast_ops import FastOps
from .fused import adamw_step, fused_attention, fused_attention_qkv, fused_linear_cross_entropy
from .kv_cache import KVCache
from .module import LoadResult, Module, ModuleList, Parameter, Sequential
from .modules_basic import GELU, Dropout, Embedding, LayerNorm, LayerNorm1d, Linear, ReLU
from .modules_transformer import DecoderLM, FeedForward, MultiHeadAttention, TransformerLayer
from .optim import SGD, Adam, AdamW
from . import precision
from .precision import float32_matmul_precision, get_float32_matmul_precision, set_float32_matmul_precision
from .scalar import Scalar, ScalarHistory, derivative_check
from .rng import get_rng_state, manual_seed, set_rng_state
from . import graphs, serialization
from .graphs import StepGraphs, StepInputs, StepSeed
from .serialization import LoadError, atomic_write, load, save
from .tensor import History, Tensor
from .tensor_combine import cat, matmul, stack, where
from .tensor_reduce import ValuesIndices
from .dtypes import DType, NoKernelError, bfloat16, bool_, float16, float32, int64, promote_types, result_type
from .tensor_create import (
    arange,
    eye,
    from_numpy,
    from_torch,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    rand,
    randn,
    tensor,
    tensor_from_numpy,
    zeros,
    zeros_like,
)
from .tensor_data import IndexingError, TensorData, shape_broadcast
from .simple_ops import SimpleBackend, SimpleOps
from .tensor_ops import TensorBackend, TensorOps

__all__ = [
    "dtypes",
    "DType",
    "NoKernelError",
    "bfloat16",
    "float16",
    "int64",
    "long",
    "ValuesIndices",
    "eye",
    "from_numpy",
    "full_like",
    "linspace",
    "matmul",
    "randn",
    "promote_types",
    "result_type",
    "autocast",
    "get_autocast_dtype",
    "is_autocast_enabled",
    "refresh_working_copies",
    "nn",
    "AttentionConfig",
    "precision",
    "operators",
    "Context",
    "backpropagate",
    "central_difference",
    "enable_grad",
    "no_grad",
    "topological_sort",
    "BackendChoice",
    "choose_backend",
    "cuda_unavailable_reason",
    "peak_memory_mb",
    "checkpoint",
    "CudaKernelOps",
    "cuda_memory_stats",
    "FastOps",
    "fused_linear_cross_entropy",
    "adamw_step",
    "fused_attention",
    "fused_attention_qkv",
    "KVCache",
    "LoadResult",
    "Module",
    "ModuleList",
    "Parameter",
    "Dropout",
    "Embedding",
    "LayerNorm1d",
    "LayerNorm",
    "GELU",
    "ReLU",
    "Sequential",
    "Linear",
    "DecoderLM",
    "FeedForward",
    "MultiHeadAttention",
    "TransformerLayer",
    "SGD",
    "Adam",
    "AdamW",
    "get_float32_matmul_precision",
    "set_float32_matmul_precision",
    "float32_matmul_precision",
    "Scalar",
    "ScalarHistory",
    "derivative_check",
    "History",
    "Tensor",
    "arange",
    "bool",
    "cat",
    "float32",
    "from_torch",
    "full",
    "get_rng_state",
    "manual_seed",
    "graphs",
    "StepGraphs",
    "StepInputs",
    "StepSeed",
    "serialization",
    "LoadError",
    "atomic_write",
    "load",
    "ones",
    "ones_like",
    "rand",
    "save",
    "set_rng_state",
    "tensor",
    "stack",
    "tensor_from_numpy",
    "where",
    "zeros",
    "zeros_like",
    "IndexingError",
    "TensorData",
    "shape_broadcast",
    "SimpleBackend",
    "SimpleOps",
    "TensorBackend",
    "TensorOps",
]

bool = bool_  # minitorch.bool, as torch.bool: the dtype of comparisons' results (after __all__, so builtins stay usable above)
long = int64  # torch.long
