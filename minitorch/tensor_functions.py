"""Autodiff Functions over tensors.

Each Function runs backend ops in `forward` and `backward`; nothing here knows where storage lives.
Inputs arrive detached (no history); non-tensor arguments (dims, scalars, flags) pass through as
plain Python values and get no gradient.  `backward` returns gradients for the tensor arguments in
order; trailing tensor arguments that take no gradient (masks, ids) may be left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from .autodiff import Context, is_grad_enabled

if TYPE_CHECKING:
    from .tensor import Tensor


_TYPES: List[Any] = []


def _tensor_types() -> Tuple[Any, Any]:
    """(Tensor, History): tensor.py imports this module, so the classes are fetched once, late."""
    if not _TYPES:
        from .tensor import History, Tensor

        _TYPES.extend((Tensor, History))
    return _TYPES[0], _TYPES[1]


def _wrap(result: Any) -> Tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


class Function:
    """Base class: `apply` records history so `backward` can be chained."""

    @classmethod
    def _backward(cls, ctx: Context, grad_out: "Tensor") -> Tuple["Tensor", ...]:
        return _wrap(cls.backward(ctx, grad_out))  # type: ignore[attr-defined]

    @classmethod
    def apply(cls, *vals: Any) -> "Tensor":
        """Run forward on detached inputs; record (cls, ctx, inputs) when any input needs grad."""
        Tensor, History = _tensor_types()
        need_grad = False
        raw: List[Any] = []
        for v in vals:
            if isinstance(v, Tensor):
                if v.requires_grad():
                    need_grad = True
                raw.append(v.detach())
            else:
                raw.append(v)
        need_grad = need_grad and is_grad_enabled()
        ctx = Context(not need_grad)
        out = cls.forward(ctx, *raw)  # type: ignore[attr-defined]
        if not need_grad:
            return out
        inputs = tuple(v for v in vals if isinstance(v, Tensor))
        return Tensor(out._tensor, History(cls, ctx, inputs), backend=out.backend)


class Neg(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        return t1.backend.neg_map(t1)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output.backend.neg_map(grad_output)


class Inv(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        ctx.save_for_backward(t1)
        return t1.backend.inv_map(t1)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (t1,) = ctx.saved_values
        return grad_output.backend.inv_back_zip(t1, grad_output)


class Add(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor", t2: "Tensor") -> "Tensor":
        return t1.backend.add_zip(t1, t2)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor"]:
        return grad_output, grad_output


class Mul(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        ctx.save_for_backward(a, b)
        return a.backend.mul_zip(a, b)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor"]:
        a, b = ctx.saved_values
        mul = grad_output.backend.mul_zip
        return mul(grad_output, b), mul(grad_output, a)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        out = t1.backend.sigmoid_map(t1)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (out,) = ctx.saved_values
        return grad_output.backend.sigmoid_back_zip(out, grad_output)


class ReLU(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        ctx.save_for_backward(t1)
        return t1.backend.relu_map(t1)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (t1,) = ctx.saved_values
        return grad_output.backend.relu_back_zip(t1, grad_output)


class GELU(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        ctx.save_for_backward(t1)
        return t1.backend.gelu_map(t1)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (t1,) = ctx.saved_values
        return grad_output.backend.gelu_back_zip(t1, grad_output)


class Tanh(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        out = t1.backend.tanh_map(t1)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (out,) = ctx.saved_values
        return grad_output.backend.tanh_back_zip(out, grad_output)


class Log(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        ctx.save_for_backward(t1)
        return t1.backend.log_map(t1)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (t1,) = ctx.saved_values
        return grad_output.backend.log_back_zip(t1, grad_output)


class Exp(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor") -> "Tensor":
        out = t1.backend.exp_map(t1)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (out,) = ctx.saved_values
        return grad_output.backend.mul_zip(out, grad_output)


class AddScalar(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor", s: float) -> "Tensor":
        return t1.backend.add_scalar(t1, s)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output


class MulScalar(Function):
    @staticmethod
    def forward(ctx: Context, t1: "Tensor", s: float) -> "Tensor":
        ctx.save_for_backward(s)
        return t1.backend.mul_scalar(t1, s)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (s,) = ctx.saved_values
        return grad_output.backend.mul_scalar(grad_output, s)


class PowerScalar(Function):
    """x ** p for a Python float p."""

    @staticmethod
    def forward(ctx: Context, t1: "Tensor", p: float) -> "Tensor":
        ctx.save_for_backward(t1, p)
        return t1.backend.pow_scalar(t1, p)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        t1, p = ctx.saved_values
        backend = grad_output.backend
        if p == 0.0:
            return backend.mul_scalar(grad_output, 0.0)
        slope = backend.mul_scalar(backend.pow_scalar(t1, p - 1.0), p)
        return backend.mul_zip(slope, grad_output)


def _no_grad_backward(n_tensors: int) -> Any:
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        zero = grad_output.backend.mul_scalar(grad_output, 0.0)
        return (zero,) * n_tensors

    return staticmethod(backward)


class LT(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        return a.backend.lt_zip(a, b)

    backward = _no_grad_backward(2)


class EQ(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        return a.backend.eq_zip(a, b)

    backward = _no_grad_backward(2)


class IsClose(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        return a.backend.is_close_zip(a, b)

    backward = _no_grad_backward(2)


class LTScalar(Function):
    """x < s for a Python float s."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", s: float) -> "Tensor":
        return a.backend.lt_scalar(a, s)

    backward = _no_grad_backward(1)


class EQScalar(Function):
    """x == s for a Python float s."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", s: float) -> "Tensor":
        return a.backend.eq_scalar(a, s)

    backward = _no_grad_backward(1)


class Sum(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", dim: int) -> "Tensor":
        ctx.save_for_backward(a.shape)
        return a.backend.add_reduce(a, dim)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (shape,) = ctx.saved_values
        return grad_output.expand(shape)


class Max(Function):
    """Max over one dim (kept with size 1); every element tied for the max receives the gradient."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", dim: int) -> "Tensor":
        out = a.backend.max_reduce(a, dim)
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        a, out = ctx.saved_values
        backend = grad_output.backend
        return backend.mul_zip(backend.eq_zip(a, out), grad_output)


class Permute(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", order: Tuple[int, ...]) -> "Tensor":
        ctx.save_for_backward(order)
        return a._new(a._tensor.permute(*order))

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (order,) = ctx.saved_values
        inverse = [0] * len(order)
        for i, o in enumerate(order):
            inverse[o] = i
        return grad_output._new(grad_output._tensor.permute(*inverse))


class View(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", shape: Tuple[int, ...]) -> "Tensor":
        ctx.save_for_backward(a.shape)
        return a._view(shape)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        (shape,) = ctx.saved_values
        return grad_output.contiguous()._view(shape)


class Expand(Function):
    """A broadcast view; the chain rule sums the gradient back to the input's shape."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor", shape: Tuple[int, ...]) -> "Tensor":
        return a._expand_view(shape)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output


class Copy(Function):
    """A contiguous copy (what `contiguous()` runs when the layout is not already contiguous)."""

    @staticmethod
    def forward(ctx: Context, a: "Tensor") -> "Tensor":
        return a.backend.id_map(a)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> "Tensor":
        return grad_output


def _transpose(t: "Tensor") -> "Tensor":
    order = list(range(t.dims))
    order[-2], order[-1] = order[-1], order[-2]
    return t._new(t._tensor.permute(*order))


class MatMul(Function):
    @staticmethod
    def forward(ctx: Context, a: "Tensor", b: "Tensor") -> "Tensor":
        ctx.save_for_backward(a, b)
        return a.backend.matrix_multiply(a, b)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor"]:
        a, b = ctx.saved_values
        mm = grad_output.backend.matrix_multiply
        return mm(grad_output, _transpose(b)), mm(_transpose(a), grad_output)


class Attn_Softmax(Function):
    """Softmax over the last dim of attention scores [B, H, Tq, Tk], with padding and causal masks."""

    @staticmethod
    def forward(ctx: Context, inp: "Tensor", mask: Optional["Tensor"], causal: bool) -> "Tensor":
        out = inp.backend.ops.attn_softmax_fw(inp, mask, causal)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        (out,) = ctx.saved_values
        grad = out.backend.ops.attn_softmax_bw(grad_output, out)
        return (grad,)


class FusedAttention(Function):
    """Attention of q [B, H, Tq, D] over k, v [B, H, Tk, D] in one op (see minitorch.fused_attention);
    saves q, k, v, the output and the per-row log-sum-exp, never the [Tq, Tk] weights."""

    @staticmethod
    def forward(
        ctx: Context, q: "Tensor", k: "Tensor", v: "Tensor", mask: Optional["Tensor"], causal: bool,
        activation: str, scale: float,
    ) -> "Tensor":  # fmt: skip
        out, lse = q.backend.ops.fused_attention_fw(q, k, v, mask, causal, activation, scale)
        ctx.save_for_backward(q, k, v, out, lse, mask, causal, activation, scale)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor", "Tensor"]:
        q, k, v, out, lse, mask, causal, activation, scale = ctx.saved_values
        return grad_output.backend.ops.fused_attention_bw(grad_output, q, k, v, out, lse, mask, causal, activation, scale)


class LayerNorm(Function):
    """LayerNorm over the last dim with learned gamma and beta."""

    @staticmethod
    def forward(ctx: Context, inp: "Tensor", gamma: "Tensor", beta: "Tensor", eps: float) -> "Tensor":
        out, mean, rstd = inp.backend.ops.layernorm_fw(inp, gamma, beta, eps)
        ctx.save_for_backward(inp, gamma, mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", "Tensor", "Tensor"]:
        inp, gamma, mean, rstd = ctx.saved_values
        return grad_output.backend.ops.layernorm_bw(grad_output, inp, gamma, mean, rstd)


class Embedding(Function):
    """Rows of weight [V, C] picked by integral ids [...]; the gradient scatters back into weight."""

    @staticmethod
    def forward(ctx: Context, weight: "Tensor", ids: "Tensor") -> "Tensor":
        ctx.save_for_backward(ids, weight.shape[0])
        return weight.backend.ops.embedding_fw(weight, ids)

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        ids, num_embeddings = ctx.saved_values
        return (grad_output.backend.ops.embedding_bw(grad_output, ids, num_embeddings),)




class FusedLinearCrossEntropy(Function):
    """Token-weighted cross-entropy of hidden @ weight (+ bias), with its gradients computed in the
    forward pass (the backend hook `fused_linear_cross_entropy_fw` works chunk by chunk, so the
    [tokens, vocab] logits never exist).  The saved dhidden, dweight (and dbias) are the gradients
    for an incoming gradient of 1; backward only scales them."""

    @staticmethod
    def forward(
        ctx: Context,
        hidden: "Tensor",
        weight: "Tensor",
        bias: Optional["Tensor"],
        targets: "Tensor",
        token_weights: "Tensor",
        chunk_size: int,
    ) -> "Tensor":
        loss, dhidden, dweight, dbias = hidden.backend.ops.fused_linear_cross_entropy_fw(
            hidden, weight, bias, targets, token_weights, chunk_size, not ctx.no_grad
        )
        ctx.save_for_backward(dhidden, dweight, dbias)
        return loss

    @staticmethod
    def backward(ctx: Context, grad_output: "Tensor") -> Tuple["Tensor", ...]:
        dhidden, dweight, dbias = ctx.saved_values
        mul = grad_output.backend.mul_zip
        grads = (mul(dhidden, grad_output), mul(dweight, grad_output))
        return grads if dbias is None else grads + (mul(dbias, grad_output),)
