"""Transformer modules against equivalent torch.nn constructions (CPU, float64, copied weights).

minitorch runs in float32 on FastOps; torch runs the same float32 numbers in float64, so every
difference is minitorch's rounding: measured at about 1e-6 of the largest reference value, checked
against the project-wide 1e-5 (minitorch_testing.TOL), far below what a wrong index or a missing
mask term gives.
"""

from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch

import minitorch
from minitorch import DecoderLM, FeedForward, MultiHeadAttention, TransformerLayer
from minitorch_testing import FAST, assert_close, mt, t64

def param(module: minitorch.Module, name: str) -> np.ndarray:
    return dict(module.named_parameters())[name].value.to_numpy()


def grad(module: minitorch.Module, name: str) -> np.ndarray:
    g = dict(module.named_parameters())[name].value.grad
    assert g is not None, f"parameter {name} got no gradient"
    return g.to_numpy()


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


def causal_bool(T: int) -> torch.Tensor:
    """torch attn_mask: True where a query may NOT attend (future keys)."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def right_padding(lengths: List[int], T: int) -> Tuple[np.ndarray, np.ndarray]:
    """(additive minitorch mask [B, T], torch key_padding_mask [B, T] True at padding)."""
    padded = np.arange(T)[None, :] >= np.array(lengths)[:, None]
    return np.where(padded, -1e9, 0.0).astype(np.float32), padded


# ---- weight copies: minitorch's parameters have torch's names and layouts -----------------------
def copy_linear(mod: minitorch.Module, prefix: str, lin: torch.nn.Linear) -> None:
    lin.weight.data = t64(param(mod, f"{prefix}.weight"))
    lin.bias.data = t64(param(mod, f"{prefix}.bias"))


def copy_layernorm(mod: minitorch.Module, prefix: str, ln: torch.nn.LayerNorm) -> None:
    ln.weight.data = t64(param(mod, f"{prefix}.weight"))
    ln.bias.data = t64(param(mod, f"{prefix}.bias"))


def copy_attention(mod: minitorch.Module, prefix: str, mha: torch.nn.MultiheadAttention) -> None:
    p = f"{prefix}." if prefix else ""
    mha.in_proj_weight.data = t64(param(mod, f"{p}qkv_projection.weight"))
    mha.in_proj_bias.data = t64(param(mod, f"{p}qkv_projection.bias"))
    copy_linear(mod, f"{p}out_projection", mha.out_proj)


def attention_grads(mha: torch.nn.MultiheadAttention, prefix: str) -> Dict[str, torch.Tensor]:
    p = f"{prefix}." if prefix else ""
    out = {f"{p}qkv_projection.weight": mha.in_proj_weight.grad, f"{p}qkv_projection.bias": mha.in_proj_bias.grad}
    out[f"{p}out_projection.weight"] = mha.out_proj.weight.grad
    out[f"{p}out_projection.bias"] = mha.out_proj.bias.grad
    return out


def torch_layer(C: int, H: int) -> torch.nn.TransformerEncoderLayer:
    return torch.nn.TransformerEncoderLayer(
        C, H, dim_feedforward=4 * C, dropout=0.0, activation=gelu_tanh, layer_norm_eps=1e-5,
        batch_first=True, norm_first=True, dtype=torch.float64,
    )


def copy_layer(mod: minitorch.Module, prefix: str, layer: torch.nn.TransformerEncoderLayer) -> None:
    p = f"{prefix}." if prefix else ""
    copy_layernorm(mod, f"{p}ln_1", layer.norm1)
    copy_attention(mod, f"{p}attention", layer.self_attn)
    copy_layernorm(mod, f"{p}ln_2", layer.norm2)
    copy_linear(mod, f"{p}ff.linear_in", layer.linear1)
    copy_linear(mod, f"{p}ff.linear_out", layer.linear2)


def layer_grads(layer: torch.nn.TransformerEncoderLayer, prefix: str) -> Dict[str, torch.Tensor]:
    p = f"{prefix}." if prefix else ""
    out = attention_grads(layer.self_attn, f"{p}attention")
    for name, ln in (("ln_1", layer.norm1), ("ln_2", layer.norm2)):
        out[f"{p}{name}.weight"], out[f"{p}{name}.bias"] = ln.weight.grad, ln.bias.grad
    for name, lin in (("ff.linear_in", layer.linear1), ("ff.linear_out", layer.linear2)):
        out[f"{p}{name}.weight"], out[f"{p}{name}.bias"] = lin.weight.grad, lin.bias.grad
    return out


def check_grads(mod: minitorch.Module, ref: Dict[str, torch.Tensor]) -> None:
    """Every parameter's gradient.  Errors are relative to the gradient's own scale, floored at 1%
    of the largest one: the key bias gets an exactly zero gradient (softmax ignores a constant
    shift of a row), where any float32 rounding would be an infinite relative error."""
    names = {n for n, _ in mod.named_parameters()}
    assert names == set(ref), f"parameters {sorted(names ^ set(ref))} not compared"
    floor = 1e-2 * max(float(g.abs().max()) for g in ref.values())
    for name, g in ref.items():
        assert_close(grad(mod, name), g, f"grad of {name}", floor=floor)


def run_both(mod: minitorch.Module, ref_fn, x: np.ndarray, mt_args=(), seed: int = 0):
    """Forward both with x (requires grad), backward (out * G).sum(); return (mt out, mt x, torch out, torch x)."""
    x_mt, x_t = mt(x, FAST, requires_grad=True), t64(x, requires_grad=True)
    out_mt = mod(x_mt, *mt_args)
    out_t = ref_fn(x_t)
    G = np.random.default_rng(seed + 1).standard_normal(out_t.shape).astype(np.float32)
    (out_mt * mt(G, FAST)).sum().backward()
    (out_t * t64(G)).sum().backward()
    return out_mt, x_mt, out_t, x_t


# ---- MultiHeadAttention ---------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("causal,padded", [(True, False), (False, False), (True, True), (False, True)])
def test_attention_matches_torch(causal: bool, padded: bool, fused: bool) -> None:
    B, T, C, H = 3, 6, 16, 4
    minitorch.manual_seed(1)
    mod = MultiHeadAttention(C, H, causal=causal, p_dropout=0.0, backend=FAST, use_fused_kernel=fused)
    ref = torch.nn.MultiheadAttention(C, H, dropout=0.0, batch_first=True, dtype=torch.float64)
    copy_attention(mod, "", ref)
    add_mask, key_padding = right_padding([6, 4, 2], T)
    attn_mask = causal_bool(T) if causal else None
    kpm = torch.tensor(key_padding) if padded else None

    def ref_fn(x):
        return ref(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False)[0]

    x = np.random.default_rng(2).standard_normal((B, T, C)).astype(np.float32)
    out_mt, x_mt, out_t, x_t = run_both(mod, ref_fn, x, (mt(add_mask, FAST),) if padded else ())
    assert_close(out_mt, out_t, "attention output")
    assert_close(x_mt.grad, x_t.grad, "grad of input")
    check_grads(mod, attention_grads(ref, ""))


def test_attention_padding_mask_hides_padded_keys() -> None:
    """Non-causal: what sits at padded positions never reaches real positions; -inf and -1e9 agree."""
    B, T, C, H = 2, 5, 8, 2
    for fused in (False, True):
        minitorch.manual_seed(3)
        mod = MultiHeadAttention(C, H, causal=False, p_dropout=0.0, backend=FAST, use_fused_kernel=fused)
        big, _ = right_padding([5, 3], T)
        inf = np.where(big < 0, -np.inf, 0.0).astype(np.float32)
        x = np.random.default_rng(4).standard_normal((B, T, C)).astype(np.float32)
        x2 = x.copy()
        x2[1, 3:] = 100.0
        out = mod(mt(x, FAST), mt(big, FAST)).to_numpy()
        out2 = mod(mt(x2, FAST), mt(big, FAST)).to_numpy()
        out_inf = mod(mt(x, FAST), mt(inf, FAST)).to_numpy()
        np.testing.assert_allclose(out2[1, :3], out[1, :3], rtol=0, atol=1e-5)
        np.testing.assert_allclose(out2[0], out[0], rtol=0, atol=0)
        np.testing.assert_allclose(out_inf[:, :3], out[:, :3], rtol=0, atol=1e-5)
        assert np.isfinite(out_inf).all()


def test_attention_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of n_head"):
        MultiHeadAttention(10, 3, backend=FAST)
    mod = MultiHeadAttention(8, 2, p_dropout=0.0, backend=FAST)
    with pytest.raises(minitorch.IndexingError, match=r"\[B, T, 8\]"):
        mod(mt(np.zeros((2, 3, 4)), FAST))
    with pytest.raises(minitorch.IndexingError, match="padding_mask"):
        mod(mt(np.zeros((2, 3, 8)), FAST), mt(np.zeros((2, 4)), FAST))


# ---- FeedForward and TransformerLayer ------------------------------------------------------------
def test_feedforward_matches_torch() -> None:
    B, T, C, M = 2, 5, 12, 20
    minitorch.manual_seed(5)
    mod = FeedForward(C, M, p_dropout=0.0, backend=FAST)
    lin_in = torch.nn.Linear(C, M, dtype=torch.float64)
    lin_out = torch.nn.Linear(M, C, dtype=torch.float64)
    copy_linear(mod, "linear_in", lin_in)
    copy_linear(mod, "linear_out", lin_out)
    ref = torch.nn.Sequential(lin_in, torch.nn.GELU(approximate="tanh"), lin_out, torch.nn.Dropout(0.0))
    x = np.random.default_rng(6).standard_normal((B, T, C)).astype(np.float32)
    out_mt, x_mt, out_t, x_t = run_both(mod, ref, x)
    assert_close(out_mt, out_t, "feed-forward output")
    assert_close(x_mt.grad, x_t.grad, "grad of input")
    check_grads(mod, {
        "linear_in.weight": lin_in.weight.grad, "linear_in.bias": lin_in.bias.grad,
        "linear_out.weight": lin_out.weight.grad, "linear_out.bias": lin_out.bias.grad,
    })


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_transformer_layer_matches_torch(fused: bool, padded: bool) -> None:
    B, T, C, H = 3, 5, 16, 2
    minitorch.manual_seed(7)
    mod = TransformerLayer(C, H, p_dropout=0.0, backend=FAST, use_fused_kernel=fused)
    ref = torch_layer(C, H)
    copy_layer(mod, "", ref)
    add_mask, key_padding = right_padding([5, 3, 1], T)
    kpm = torch.tensor(key_padding) if padded else None

    def ref_fn(x):
        return ref(x, src_mask=causal_bool(T), src_key_padding_mask=kpm)

    x = np.random.default_rng(8).standard_normal((B, T, C)).astype(np.float32)
    out_mt, x_mt, out_t, x_t = run_both(mod, ref_fn, x, (mt(add_mask, FAST),) if padded else ())
    assert_close(out_mt, out_t, "layer output")
    assert_close(x_mt.grad, x_t.grad, "grad of input")
    check_grads(mod, layer_grads(ref, ""))


def test_transformer_layer_layernorms_add_the_residual_gradient(taken_pending) -> None:
    """Without dropout each residual sum is in its block's last product (the Function's own input),
    which backward reaches before the LayerNorm reading the same stream: both LayerNorms are handed
    the residual's gradient to add (Context.take_pending), in place of two sums of the engine."""
    mod = TransformerLayer(16, 2, p_dropout=0.0, backend=FAST, use_fused_kernel=True)
    x = mt(np.random.default_rng(9).standard_normal((2, 5, 16)).astype(np.float32), FAST, requires_grad=True)
    mod(x).sum().backward()
    assert sum(t is not None for t in taken_pending) == 2


# ---- DecoderLM ------------------------------------------------------------------------------------
class TorchDecoderLM(torch.nn.Module):
    """The torch.nn construction DecoderLM is meant to equal (dropout 0)."""

    def __init__(self, V: int, C: int, H: int, P: int, L: int):
        super().__init__()
        self.tok = torch.nn.Embedding(V, C, dtype=torch.float64)
        self.pos = torch.nn.Embedding(P, C, dtype=torch.float64)
        self.layers = torch.nn.ModuleList([torch_layer(C, H) for _ in range(L)])
        self.ln = torch.nn.LayerNorm(C, eps=1e-5, dtype=torch.float64)
        self.head = torch.nn.Linear(C, V, dtype=torch.float64)

    def forward(self, idx: torch.Tensor, key_padding: Optional[torch.Tensor] = None) -> torch.Tensor:
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T))
        for layer in self.layers:
            x = layer(x, src_mask=causal_bool(T), src_key_padding_mask=key_padding)
        return self.head(self.ln(x))

    def copy_from(self, mod: DecoderLM) -> None:
        self.tok.weight.data = t64(param(mod, "token_embeddings.weight"))
        self.pos.weight.data = t64(param(mod, "position_embeddings.weight"))
        for i, layer in enumerate(self.layers):
            copy_layer(mod, f"layers.{i}", layer)
        copy_layernorm(mod, "ln", self.ln)
        copy_linear(mod, "lm_head", self.head)

    def grads(self) -> Dict[str, torch.Tensor]:
        out = {"token_embeddings.weight": self.tok.weight.grad, "position_embeddings.weight": self.pos.weight.grad}
        for i, layer in enumerate(self.layers):
            out.update(layer_grads(layer, f"layers.{i}"))
        out.update({"ln.weight": self.ln.weight.grad, "ln.bias": self.ln.bias.grad})
        out.update({"lm_head.weight": self.head.weight.grad, "lm_head.bias": self.head.bias.grad})
        return out


def small_lm(fused: bool, seed: int = 9, p_dropout: float = 0.0) -> DecoderLM:
    minitorch.manual_seed(seed)
    return DecoderLM(23, 16, 2, 10, n_layers=2, p_dropout=p_dropout, backend=FAST, use_fused_kernel=fused)


def lm_backward(model: DecoderLM, ids: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
    logits = model(mt(ids, FAST), None if mask is None else mt(mask, FAST))
    G = np.random.default_rng(10).standard_normal(logits.shape).astype(np.float32)
    (logits * mt(G, FAST)).sum().backward()
    return logits.to_numpy()


@pytest.mark.parametrize("fused", [False, True])
def test_decoder_lm_matches_torch(fused: bool) -> None:
    model = small_lm(fused)
    ref = TorchDecoderLM(23, 16, 2, 10, 2)
    ref.copy_from(model)
    ids = np.random.default_rng(11).integers(0, 23, (3, 7))
    add_mask, key_padding = right_padding([7, 5, 2], 7)
    logits = lm_backward(model, ids, add_mask)
    ref_logits = ref(torch.tensor(ids), torch.tensor(key_padding))
    ref_logits.backward(t64(np.random.default_rng(10).standard_normal(ref_logits.shape)))
    assert logits.shape == (3, 7, 23)
    assert_close(logits, ref_logits, "logits")
    check_grads(model, ref.grads())


def test_fused_and_unfused_paths_agree() -> None:
    unfused, fused = small_lm(False), small_lm(True, seed=99)
    fused.load_state_dict(unfused.state_dict())
    ids = np.random.default_rng(12).integers(0, 23, (2, 9))
    out_unfused, out_fused = lm_backward(unfused, ids), lm_backward(fused, ids)
    np.testing.assert_allclose(out_fused, out_unfused, rtol=0, atol=1e-5)
    for name, _ in unfused.named_parameters():
        np.testing.assert_allclose(grad(fused, name), grad(unfused, name), rtol=0, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("fused", [False, True])
def test_causal_lm_never_sees_the_future(fused: bool) -> None:
    model = small_lm(fused)
    ids = np.random.default_rng(13).integers(0, 23, (2, 8))
    changed = ids.copy()
    changed[:, 5] = (changed[:, 5] + 1) % 23
    before, after = model(mt(ids, FAST)).to_numpy(), model(mt(changed, FAST)).to_numpy()
    np.testing.assert_array_equal(after[:, :5], before[:, :5])
    assert np.abs(after[:, 5:] - before[:, 5:]).max() > 1e-4


def test_lm_padding_mask_and_right_padding() -> None:
    """With right padding, a row's real positions give the same logits whatever pads it and
    whether or not a padding mask is passed; decoding relies on this."""
    model = small_lm(True)
    ids = np.random.default_rng(14).integers(0, 23, (2, 6))
    mask, _ = right_padding([6, 3], 6)
    plain = model(mt(ids, FAST)).to_numpy()
    masked = model(mt(ids, FAST), mt(mask, FAST)).to_numpy()
    alone = model(mt(ids[1:, :3], FAST)).to_numpy()
    np.testing.assert_allclose(masked[:, :3], plain[:, :3], rtol=0, atol=1e-5)
    np.testing.assert_allclose(masked[0], plain[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(plain[1, :3], alone[0], rtol=0, atol=1e-5)


def test_lm_dropout_train_and_eval() -> None:
    model = small_lm(False, p_dropout=0.5)
    ids = np.random.default_rng(15).integers(0, 23, (2, 6))
    first, second = model(mt(ids, FAST)).to_numpy(), model(mt(ids, FAST)).to_numpy()
    assert np.abs(first - second).max() > 1e-3, "dropout should differ between training calls"
    model.eval()
    no_dropout = small_lm(False, p_dropout=0.0)
    no_dropout.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(model(mt(ids, FAST)).to_numpy(), no_dropout(mt(ids, FAST)).to_numpy())


def test_lm_structure_and_errors() -> None:
    model = small_lm(False)
    assert len(model.layers) == 2
    names = [n for n, _ in model.named_parameters()]
    assert "layers.1.attention.qkv_projection.weight" in names and "lm_head.weight" in names
    assert model.hidden_states(mt(np.zeros((1, 4)), FAST)).shape == (1, 4, 16)
    with pytest.raises(ValueError, match="n_positions 10"):
        model(mt(np.zeros((1, 11)), FAST))
    with pytest.raises(minitorch.IndexingError, match=r"\[B, T\]"):
        model(mt(np.zeros((4,)), FAST))
