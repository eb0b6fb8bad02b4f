"""A state_dict saved from torch.nn loads by name into the minitorch module of the same architecture
and gives the same outputs: Linear, LayerNorm, Embedding, a Sequential of them, and the translation
model's shape (DecoderLM, mirrored below in torch with its parameter names); and a state dict of
minitorch's older layout (`weights`, Linear's [in, out]) still loads."""

from __future__ import annotations

import math

import numpy as np
import torch
from minitorch_testing import FAST, assert_close

import minitorch
from minitorch import DecoderLM, nn

torch.manual_seed(33)


def _same(ours: minitorch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert_close(ours, ref.detach().double(), what, tol=2e-5)


def _randomized(module: torch.nn.Module) -> torch.nn.Module:
    """module with every parameter drawn afresh (LayerNorm's ones and zeros would hide a swap)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return module


def test_linear_layernorm_embedding_load_torch_state_dicts(backend) -> None:
    x = torch.randn(2, 3, 5)
    ids = torch.tensor([[0, 7, 3], [9, 9, 1]])
    for ref, ours, inp in (
        (torch.nn.Linear(5, 4), nn.Linear(5, 4, backend=backend), x),
        (torch.nn.Linear(5, 4, bias=False), nn.Linear(5, 4, bias=False, backend=backend), x),
        (torch.nn.LayerNorm(5), nn.LayerNorm(5, backend=backend), x),
        (torch.nn.LayerNorm((3, 5)), nn.LayerNorm((3, 5), backend=backend), x),
        (torch.nn.Embedding(10, 4), nn.Embedding(10, 4, backend=backend), ids),
    ):
        ref = _randomized(ref)
        assert ours.load_state_dict(ref.state_dict()) == ([], [])
        out = ours(minitorch.tensor(inp.numpy(), backend=backend))
        _same(out, ref(inp), f"{type(ref).__name__} {ref.state_dict().keys()}")


def test_sequential_loads_a_torch_sequential(backend) -> None:
    ref = _randomized(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)))
    ours = nn.Sequential(nn.Linear(6, 8, backend=backend), nn.GELU(), nn.LayerNorm(8, backend=backend), nn.Linear(8, 3, backend=backend))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 6)
    _same(ours(minitorch.tensor(x.numpy(), backend=backend)), ref(x), "Sequential")


class TorchTranslationLM(torch.nn.Module):
    """DecoderLM's architecture in torch, under DecoderLM's parameter names: token and position
    embeddings, pre-LN layers (packed qkv attention, causal; GELU-tanh feed-forward), final
    LayerNorm, LM head."""

    def __init__(self, V: int, C: int, H: int, P: int, L: int):
        super().__init__()
        self.H = H
        self.token_embeddings = torch.nn.Embedding(V, C)
        self.position_embeddings = torch.nn.Embedding(P, C)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            layer = torch.nn.Module()
            layer.ln_1 = torch.nn.LayerNorm(C)
            layer.attention = torch.nn.Module()
            layer.attention.qkv_projection = torch.nn.Linear(C, 3 * C)
            layer.attention.out_projection = torch.nn.Linear(C, C)
            layer.ln_2 = torch.nn.LayerNorm(C)
            layer.ff = torch.nn.Module()
            layer.ff.linear_in, layer.ff.linear_out = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
            self.layers.append(layer)
        self.ln = torch.nn.LayerNorm(C)
        self.lm_head = torch.nn.Linear(C, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.token_embeddings(idx) + self.position_embeddings(torch.arange(T))
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        for layer in self.layers:
            q, k, v = layer.attention.qkv_projection(layer.ln_1(x)).view(B, T, 3, self.H, -1).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(future, float("-inf"))
            x = x + layer.attention.out_projection((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))
            x = x + layer.ff.linear_out(torch.nn.functional.gelu(layer.ff.linear_in(layer.ln_2(x)), approximate="tanh"))
        return self.lm_head(self.ln(x))


def test_the_translation_models_shape_loads_a_torch_state_dict() -> None:
    V, C, H, P, L = 23, 16, 4, 10, 2
    ref = _randomized(TorchTranslationLM(V, C, H, P, L))
    ours = DecoderLM(V, C, H, P, n_layers=L, p_dropout=0.0, backend=FAST)
    assert ours.load_state_dict(ref.state_dict()) == ([], [])
    assert list(ours.state_dict()) == list(ref.state_dict())
    idx = torch.tensor([[1, 5, 22, 0, 7], [3, 3, 9, 14, 2]])
    _same(ours(minitorch.tensor(idx.numpy(), backend=FAST)), ref(idx), "DecoderLM logits")


def test_a_state_of_the_older_layout_loads() -> None:
    """`weights` (Linear's [in, out], LayerNorm's and Embedding's as they are) from before the layout
    followed torch's: loaded into the new names and layout."""
    ref = _randomized(torch.nn.Sequential(torch.nn.Embedding(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3)))
    old = {
        "0.weights": ref[0].weight.detach().numpy(), "1.weights": ref[1].weight.detach().numpy(),
        "1.bias": ref[1].bias.detach().numpy(), "2.weights": ref[2].weight.detach().numpy().T,
        "2.bias": ref[2].bias.detach().numpy(),
    }  # fmt: skip
    ours = nn.Sequential(nn.Embedding(7, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    assert ours.load_state_dict(old) == ([], [])
    ids = torch.tensor([[0, 6, 2]])
    _same(ours(minitorch.tensor(ids.numpy())), ref(ids), "older layout")
    np.testing.assert_array_equal(ours[2].weight.value.to_numpy(), ref[2].weight.detach().numpy())
