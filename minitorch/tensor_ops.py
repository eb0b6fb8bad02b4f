"""Backends: the TensorOps protocol, SimpleOps (pure Python) and TensorBackend (a table of ops).

A backend is a class of static methods.  `map`, `map_scalar`, `zip` and `reduce` take a scalar
function from `operators` and return a tensor op; the CPU backends compile that function, the CUDA
backend maps it to an opcode of its kernels.  The fused hooks (attention softmax, LayerNorm,
embedding, linear cross-entropy, AdamW) have composed reference implementations here, built from
those ops, so every backend supports them; the CUDA backend overrides them with fused kernels.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import operators
from .tensor_data import (
    IndexingError,
    TensorData,
    broadcast_index,
    index_to_position,
    shape_broadcast,
    to_index,
)

if TYPE_CHECKING:
    from .tensor import Tensor

NEG_BIG = -1e30  # added to causally masked scores in the composed softmax: finite, far below any real score


def _check_same_backend(name: str, *tensors: "Tensor") -> None:
    first = tensors[0]
    for t in tensors[1:]:
        if t.backend.ops is not first.backend.ops:
            raise TypeError(
                f"{name}: tensor of shape {first.shape} is on {first.backend.ops.__name__} but tensor of "
                f"shape {t.shape} is on {t.backend.ops.__name__}"
            )


def _attention_weights(
    q: "Tensor", k: "Tensor", mask: Optional["Tensor"], causal: bool, activation: str, scale: float
) -> Tuple["Tensor", "Tensor"]:
    """(weights [B, H, Tq, Tk], lse [B, H, Tq]) of attention from composed ops, with x = scale * q k^T + mask:
    softmax over the kept keys (lse its log-sum-exp, -inf for a row without keys) or relu(x) (lse 0);
    causally removed keys get weight 0."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    x = (q @ k.transpose(2, 3)) * scale
    if mask is not None:
        x = x + mask.contiguous().view(B, 1, 1, Tk)
    allowed = None
    if causal:
        cols = q._arange(Tk).view(1, Tk)
        rows = q._arange(Tq).view(Tq, 1) + float(Tk - Tq) + 0.5
        allowed = cols < rows
    if activation == "relu":
        weights = x.relu() if allowed is None else x.relu() * allowed
        return weights, q.zeros((B, H, Tq))
    if allowed is not None:
        x = x + (allowed - 1.0) * (-NEG_BIG)
    m = x.max(3)
    m = m.backend.max_scalar(m, -3.0e38)  # a row of -inf keeps a finite shift, so x - m is never nan
    e = (x - m).exp()
    if allowed is not None:
        e = e * allowed
    s = e.sum(3)
    # A row without keys has e = 0 and s = 0: weights 0, and log(0) = -inf makes its lse -inf.
    return e / (s + (s == 0.0)), (m + s.log()).view(B, H, Tq)


class TensorOps:
    """What a backend provides; see the module docstring.  Subclasses fill in the storage and
    elementwise/reduce/matmul ops; the fused hooks below work for any of them."""

    is_cuda = False

    # ---- fused hooks: composed reference implementations -----------------------------------
    @staticmethod
    def attn_softmax_fw(inp: "Tensor", mask: Optional["Tensor"], causal: bool) -> "Tensor":
        """Softmax over the last dim of inp [B, H, Tq, Tk] + mask [B, Tk]; see Tensor.attn_softmax."""
        B, H, Tq, Tk = inp.shape
        x = inp
        if mask is not None:
            x = x + mask.view(B, 1, 1, Tk)
        allowed = None
        if causal:
            cols = inp._arange(Tk).view(1, Tk)
            rows = inp._arange(Tq).view(Tq, 1) + float(Tk - Tq) + 0.5
            allowed = cols < rows
            x = x + (allowed - 1.0) * (-NEG_BIG)
        m = x.max(3)
        m = m.backend.max_scalar(m, -3.0e38)  # a row of -inf keeps a finite shift, so x - m is never nan
        e = (x - m).exp()
        if allowed is not None:
            e = e * allowed
        s = e.sum(3)
        # A live row sums to >= 1 (its max contributes exp(0)); a dead row sums to 0 and must give 0.
        s = s.backend.max_scalar(s, 1.0) * (s > 0.0) + (s == 0.0)
        return (e / s).contiguous()

    @staticmethod
    def attn_softmax_bw(grad_out: "Tensor", soft_out: "Tensor") -> "Tensor":
        """y * (g - sum(g * y)) over the last dim."""
        gy = grad_out * soft_out
        return (soft_out * (grad_out - gy.sum(soft_out.dims - 1))).contiguous()

    @staticmethod
    def fused_attention_fw(
        q: "Tensor", k: "Tensor", v: "Tensor", mask: Optional["Tensor"], causal: bool, activation: str, scale: float
    ) -> Tuple["Tensor", "Tensor"]:
        """(out [B, H, Tq, D], lse [B, H, Tq]) of attention; see minitorch.fused_attention.  The composed
        form: the [Tq, Tk] weights are materialized."""
        weights, lse = _attention_weights(q, k, mask, causal, activation, scale)
        return (weights @ v).contiguous(), lse

    @staticmethod
    def fused_attention_bw(
        grad_out: "Tensor", q: "Tensor", k: "Tensor", v: "Tensor", out: "Tensor", lse: "Tensor",
        mask: Optional["Tensor"], causal: bool, activation: str, scale: float,
    ) -> Tuple["Tensor", "Tensor", "Tensor"]:
        """(dq, dk, dv) of fused_attention_fw; the composed form recomputes the weights (out and lse,
        which the fused kernels use, are not needed here)."""
        weights, _ = _attention_weights(q, k, mask, causal, activation, scale)
        dweights = grad_out @ v.transpose(2, 3)
        if activation == "relu":
            dscores = dweights * (weights > 0.0)
        else:
            dscores = TensorOps.attn_softmax_bw(dweights, weights)
        dscores = dscores * scale
        dq = dscores @ k
        dk = dscores.transpose(2, 3) @ q
        dv = weights.transpose(2, 3) @ grad_out
        return dq.contiguous(), dk.contiguous(), dv.contiguous()

    @staticmethod
    def layernorm_fw(
        inp: "Tensor", gamma: "Tensor", beta: "Tensor", eps: float
    ) -> Tuple["Tensor", "Tensor", "Tensor"]:
        """(out, mean [rows], rstd [rows]) of LayerNorm over the last dim (biased variance)."""
        C = inp.shape[-1]
        rows = inp.size // C
        x = inp.contiguous().view(rows, C)
        mean = x.mean(1)
        xc = x - mean
        var = (xc * xc).mean(1)
        rstd = (var + eps) ** -0.5
        out = xc * rstd * gamma.view(1, C) + beta.view(1, C)
        return out.view(*inp.shape), mean.view(rows), rstd.view(rows)

    @staticmethod
    def layernorm_bw(
        grad_out: "Tensor", inp: "Tensor", gamma: "Tensor", mean: "Tensor", rstd: "Tensor"
    ) -> Tuple["Tensor", "Tensor", "Tensor"]:
        """(dinp, dgamma, dbeta) of LayerNorm."""
        C = inp.shape[-1]
        rows = inp.size // C
        x = inp.contiguous().view(rows, C)
        dy = grad_out.contiguous().view(rows, C)
        r = rstd.view(rows, 1)
        xhat = (x - mean.view(rows, 1)) * r
        dbeta = dy.sum(0).view(C)
        dgamma = (dy * xhat).sum(0).view(C)
        g = dy * gamma.view(1, C)
        dx = (g - g.mean(1) - xhat * (g * xhat).mean(1)) * r
        return dx.view(*inp.shape), dgamma, dbeta

    @staticmethod
    def embedding_fw(weight: "Tensor", ids: "Tensor") -> "Tensor":
        """weight[ids]: a one-hot matrix product (the composed form any backend can run)."""
        V, C = weight.shape
        flat = ids.contiguous().view(ids.size, 1)
        one_hot = flat == weight._arange(V).view(1, V)
        return (one_hot @ weight).view(*ids.shape, C)

    @staticmethod
    def embedding_bw(grad_out: "Tensor", ids: "Tensor", num_embeddings: int) -> "Tensor":
        """Scatter-add of grad_out rows into a [V, C] gradient, as one-hot^T @ grad."""
        C = grad_out.shape[-1]
        flat = ids.contiguous().view(ids.size, 1)
        one_hot = flat == grad_out._arange(num_embeddings).view(1, num_embeddings)
        return one_hot.transpose(0, 1) @ grad_out.contiguous().view(ids.size, C)

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
        """(loss (1,), dhidden [N, C], dweight [C, V], dbias [V]) of the token-weighted cross-entropy
        sum_r ce_r * w_r / sum(w) of logits = hidden @ weight (+ bias), with targets [N] and
        token_weights [N].  The gradients (None unless need_grad; dbias None without a bias) are those
        of the loss itself, computed in this same pass: chunk_size rows of logits at a time, so no
        [N, V] tensor is ever made.  sum(w) == 0 gives a zero loss and zero gradients."""
        N, C = hidden.shape
        V = weight.shape[1]
        h, ids, w = hidden.contiguous(), targets.contiguous(), token_weights.contiguous()
        total = w.sum()
        empty = total == 0.0
        scale = (1.0 - empty) / (total + empty)  # 1 / sum(w), or 0 when sum(w) == 0
        classes = hidden._arange(V).view(1, V)
        weight_t = weight.transpose(0, 1)
        loss: Optional["Tensor"] = None
        dhidden = hidden._new_empty((N, C)) if need_grad else None
        dweight: Optional["Tensor"] = None
        dbias: Optional["Tensor"] = None
        for n0 in range(0, N, chunk_size):
            n1 = min(N, n0 + chunk_size)
            rows = n1 - n0
            h_rows = _row_block(h, n0, n1)
            logits = h_rows @ weight
            if bias is not None:
                logits = logits + bias.view(1, V)
            m = logits.max(1)
            e = (logits - m).exp()
            s = e.sum(1)
            one_hot = _row_block(ids, n0, n1).view(rows, 1) == classes
            row_scale = _row_block(w, n0, n1).view(rows, 1) * scale
            part = ((s.log() + m - (logits * one_hot).sum(1)) * row_scale).sum(0)
            loss = part if loss is None else loss + part
            if dhidden is not None:
                dlogits = (e / s - one_hot) * row_scale
                hidden.backend.id_map(dlogits @ weight_t, out=_row_block(dhidden, n0, n1))
                part_w = h_rows.transpose(0, 1) @ dlogits
                dweight = part_w if dweight is None else dweight + part_w
                if bias is not None:
                    part_b = dlogits.sum(0).view(V)
                    dbias = part_b if dbias is None else dbias + part_b
        assert loss is not None, "fused_linear_cross_entropy_fw needs at least one row"
        return loss.view(1), dhidden, dweight, dbias

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
        """One AdamW update as torch.optim.AdamW computes it, written IN PLACE into param, exp_avg
        and exp_avg_sq (their storage is kept); step counts updates from 1, this one included."""
        m = exp_avg * beta1 + grad * (1.0 - beta1)
        v = exp_avg_sq * beta2 + grad * grad * (1.0 - beta2)
        denom = v**0.5 * (1.0 / math.sqrt(1.0 - beta2**step)) + eps
        new = param * (1.0 - lr * weight_decay) - m * (lr / (1.0 - beta1**step)) / denom
        copy = param.backend.id_map
        copy(m, out=exp_avg)
        copy(v, out=exp_avg_sq)
        copy(new, out=param)


def _row_block(t: "Tensor", start: int, stop: int) -> "Tensor":
    """Rows [start, stop) of a contiguous tensor as a view: every backend's storage is a 1-D array
    (numpy or torch) whose slices are views of it."""
    inner = t.size // t.shape[0]
    storage = t._tensor._storage[start * inner : stop * inner]
    return t._new(TensorData(storage, (stop - start,) + tuple(t.shape[1:])))


# ---- pure-Python backend ----------------------------------------------------------------------
def _out_for(a: "Tensor", shape: Tuple[int, ...], out: Optional["Tensor"]) -> "Tensor":
    return a._new_empty(shape) if out is None else out


class SimpleOps(TensorOps):
    """Reference CPU backend in plain Python loops: slow, obviously correct."""

    @staticmethod
    def storage_empty(size: int) -> np.ndarray:
        return np.empty(size, dtype=np.float32)

    @staticmethod
    def storage_from_numpy(arr: np.ndarray) -> np.ndarray:
        return np.array(arr, dtype=np.float32, copy=True).reshape(-1)

    @staticmethod
    def storage_to_numpy(storage: np.ndarray) -> np.ndarray:
        return storage

    @staticmethod
    def fill(out: "Tensor", value: float) -> None:
        out._tensor._storage[:] = value

    @staticmethod
    def arange(out: "Tensor") -> None:
        out._tensor._storage[:] = np.arange(out.size, dtype=np.float32)

    @staticmethod
    def uniform(out: "Tensor", seed: int) -> None:
        out._tensor._storage[:] = np.random.default_rng(seed).random(out.size, dtype=np.float32)

    @staticmethod
    def map(fn: Callable[[float], float]) -> Callable[..., "Tensor"]:
        def ret(a: "Tensor", out: Optional["Tensor"] = None) -> "Tensor":
            out = _out_for(a, a.shape, out)
            _simple_map(fn, out, a)
            return out

        return ret

    @staticmethod
    def map_scalar(fn: Callable[[float, float], float]) -> Callable[..., "Tensor"]:
        def ret(a: "Tensor", s: float) -> "Tensor":
            out = a._new_empty(a.shape)
            _simple_map(lambda x: fn(x, s), out, a)
            return out

        return ret

    @staticmethod
    def zip(fn: Callable[[float, float], float]) -> Callable[["Tensor", "Tensor"], "Tensor"]:
        def ret(a: "Tensor", b: "Tensor") -> "Tensor":
            _check_same_backend("zip", a, b)
            out = a._new_empty(shape_broadcast(a.shape, b.shape))
            o, x, y = out._tensor, a._tensor, b._tensor
            oi = np.zeros(o.dims, np.int64)
            ai = np.zeros(x.dims, np.int64)
            bi = np.zeros(y.dims, np.int64)
            for i in range(o.size):
                to_index(i, o.np_shape, oi)
                broadcast_index(oi, o.np_shape, x.np_shape, ai)
                broadcast_index(oi, o.np_shape, y.np_shape, bi)
                o._storage[index_to_position(oi, o.np_strides)] = fn(
                    float(x._storage[index_to_position(ai, x.np_strides)]),
                    float(y._storage[index_to_position(bi, y.np_strides)]),
                )
            return out

        return ret

    @staticmethod
    def reduce(fn: Callable[[float, float], float], start: float = 0.0) -> Callable[["Tensor", int], "Tensor"]:
        def ret(a: "Tensor", dim: int) -> "Tensor":
            shape = list(a.shape)
            shape[dim] = 1
            out = a._new_empty(tuple(shape))
            o, x = out._tensor, a._tensor
            oi = np.zeros(o.dims, np.int64)
            for i in range(o.size):
                to_index(i, o.np_shape, oi)
                acc = start
                pos = index_to_position(oi, x.np_strides)
                for j in range(a.shape[dim]):
                    acc = fn(acc, float(x._storage[pos + j * x.strides[dim]]))
                o._storage[index_to_position(oi, o.np_strides)] = acc
            return out

        return ret

    @staticmethod
    def matrix_multiply(a: "Tensor", b: "Tensor") -> "Tensor":
        _check_same_backend("matmul", a, b)
        batch = shape_broadcast(a.shape[:-2], b.shape[:-2])
        n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
        if b.shape[-2] != k:
            raise IndexingError(f"matmul shapes {a.shape} @ {b.shape}: inner sizes {k} and {b.shape[-2]} differ")
        out = a._new_empty(batch + (n, m))
        o, x, y = out._tensor, a._tensor, b._tensor
        oi = np.zeros(o.dims, np.int64)
        ai = np.zeros(x.dims, np.int64)
        bi = np.zeros(y.dims, np.int64)
        for i in range(o.size):
            to_index(i, o.np_shape, oi)
            broadcast_index(oi, o.np_shape, x.np_shape, ai)
            broadcast_index(oi, o.np_shape, y.np_shape, bi)
            acc = 0.0
            for j in range(k):
                ai[-1] = j
                bi[-2] = j
                acc += float(x._storage[index_to_position(ai, x.np_strides)]) * float(
                    y._storage[index_to_position(bi, y.np_strides)]
                )
            o._storage[index_to_position(oi, o.np_strides)] = acc
        return out


def _simple_map(fn: Callable[[float], float], out: "Tensor", a: "Tensor") -> None:
    o, x = out._tensor, a._tensor
    oi = np.zeros(o.dims, np.int64)
    ai = np.zeros(x.dims, np.int64)
    for i in range(o.size):
        to_index(i, o.np_shape, oi)
        broadcast_index(oi, o.np_shape, x.np_shape, ai)
        o._storage[index_to_position(oi, o.np_strides)] = fn(float(x._storage[index_to_position(ai, x.np_strides)]))


# ---- the table of ops a Tensor uses -----------------------------------------------------------
class TensorBackend:
    """The ops of one backend, built once per backend class (TensorBackend(FastOps) is cached)."""

    _cache: Dict[type, "TensorBackend"] = {}

    def __new__(cls, ops: Any) -> "TensorBackend":
        cached = cls._cache.get(ops)
        if cached is not None:
            return cached
        self = super().__new__(cls)
        self._build(ops)
        cls._cache[ops] = self
        return self

    def _build(self, ops: Any) -> None:
        self.ops = ops
        self.cuda = bool(ops.is_cuda)
        o = operators
        self.id_map = ops.map(o.id)
        self.neg_map = ops.map(o.neg)
        self.sigmoid_map = ops.map(o.sigmoid)
        self.relu_map = ops.map(o.relu)
        self.log_map = ops.map(o.log)
        self.exp_map = ops.map(o.exp)
        self.inv_map = ops.map(o.inv)
        self.tanh_map = ops.map(o.tanh)
        self.gelu_map = ops.map(o.gelu)

        self.add_zip = ops.zip(o.add)
        self.mul_zip = ops.zip(o.mul)
        self.lt_zip = ops.zip(o.lt)
        self.eq_zip = ops.zip(o.eq)
        self.is_close_zip = ops.zip(o.is_close)
        self.max_zip = ops.zip(o.max)
        self.pow_zip = ops.zip(o.pow)
        self.relu_back_zip = ops.zip(o.relu_back)
        self.log_back_zip = ops.zip(o.log_back)
        self.inv_back_zip = ops.zip(o.inv_back)
        self.sigmoid_back_zip = ops.zip(o.sigmoid_back)
        self.tanh_back_zip = ops.zip(o.tanh_back)
        self.gelu_back_zip = ops.zip(o.gelu_back)

        self.add_scalar = ops.map_scalar(o.add)
        self.mul_scalar = ops.map_scalar(o.mul)
        self.pow_scalar = ops.map_scalar(o.pow)
        self.lt_scalar = ops.map_scalar(o.lt)
        self.eq_scalar = ops.map_scalar(o.eq)
        self.max_scalar = ops.map_scalar(o.max)

        self.add_reduce = ops.reduce(o.add, 0.0)
        self.mul_reduce = ops.reduce(o.mul, 1.0)
        self.max_reduce = ops.reduce(o.max, -math.inf)
        self.matrix_multiply = ops.matrix_multiply

    def __repr__(self) -> str:
        return f"TensorBackend({self.ops.__name__})"


SimpleBackend = TensorBackend(SimpleOps)
