"""Fused ops, one module each: the public entry (the only place that checks its inputs), the autodiff
Function, and the composed reference built from Tensor operations.  Each Function calls the
backend's kernel hook where the backend has one (see `minitorch.tensor_ops.TensorOps`) and the
composed reference where it does not, so every backend supports every op.

These modules use Tensors only through their methods and never import `minitorch.tensor`, so
`tensor.py` can build its `attn_softmax`/`layernorm` methods on them without an import cycle.
"""

from .adamw import adamw_step
from .attention import fused_attention, fused_attention_qkv
from .embedding import embedding
from .layernorm import layernorm
from .linear import feed_forward
from .linear_cross_entropy import fused_linear_cross_entropy
from .softmax import attn_softmax
from .topk import top_k

__all__ = [
    "adamw_step", "attn_softmax", "embedding", "feed_forward", "fused_attention", "fused_attention_qkv",
    "fused_linear_cross_entropy", "layernorm", "top_k",
]
