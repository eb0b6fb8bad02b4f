"""MultiHeadAttention's packed q/k/v projection (one Linear of width 3C) against the older form of
three separate Linears: the same function and gradients (torch float64 computing the separate form
from the same weights), state dicts and optimizer moments of the separate form loading into the
packed one, and the translation program's checkpoints of the older layout resuming."""

from typing import Dict, List

import numpy as np
import pytest
import torch

import minitorch
from minitorch import DecoderLM, MultiHeadAttention
from minitorch_testing import FAST, assert_close, mt, t64
from project.common.checkpoint import upgrade_moments

B, T, C, H = 2, 5, 12, 3
D = C // H


def separate_state(seed: int) -> Dict[str, np.ndarray]:
    """Random parameters of a MultiHeadAttention in the older layout (weights [in, out])."""
    rng = np.random.default_rng(seed)
    state = {}
    for name in ("q", "k", "v", "out"):
        state[f"{name}_projection.weights"] = rng.uniform(-0.5, 0.5, (C, C)).astype(np.float32)
        state[f"{name}_projection.bias"] = rng.uniform(-0.5, 0.5, C).astype(np.float32)
    return state


def separate_reference(state: Dict[str, torch.Tensor], x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The older form written out: three projections, heads, scaled scores, softmax, output projection."""

    def proj(name: str, inp: torch.Tensor) -> torch.Tensor:
        return inp @ state[f"{name}_projection.weights"] + state[f"{name}_projection.bias"]

    q, k, v = (proj(n, x).view(B, T, H, D).transpose(1, 2) for n in "qkv")
    scores = q @ k.transpose(-1, -2) / D**0.5
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), float("-inf"))
    attended = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, T, C)
    return proj("out", attended)


@pytest.mark.parametrize("path", ["naive", "naive+fused softmax", "fused"])
@pytest.mark.parametrize("causal", [True, False])
def test_packed_projection_computes_the_separate_form(path: str, causal: bool) -> None:
    mod = MultiHeadAttention(
        C, H, causal=causal, p_dropout=0.0, backend=FAST, use_fused_kernel=path == "naive+fused softmax",
        attention="fused" if path == "fused" else "naive",
    )  # fmt: skip
    state = separate_state(seed=3)
    mod.load_state_dict(state)
    ref_state = {name: t64(value, requires_grad=True) for name, value in state.items()}
    x = np.random.default_rng(4).standard_normal((B, T, C)).astype(np.float32)
    G = np.random.default_rng(5).standard_normal((B, T, C)).astype(np.float32)
    x_mt, x_ref = mt(x, FAST, requires_grad=True), t64(x, requires_grad=True)
    out = mod(x_mt)
    ref = separate_reference(ref_state, x_ref, causal)
    assert_close(out, ref, "attention output")
    (out * mt(G, FAST)).sum().backward()
    (ref * t64(G)).sum().backward()
    assert_close(x_mt.grad, x_ref.grad, "grad of x")
    params = dict(mod.named_parameters())
    floor = 1e-2 * max(float(t.grad.abs().max()) for t in ref_state.values())  # the key bias's gradient is 0
    for part, old in (("weight", "weights"), ("bias", "bias")):
        packed = params[f"qkv_projection.{part}"].value.grad.to_numpy()
        for i, n in enumerate("qkv"):
            third = packed[i * C : (i + 1) * C].T  # the older layout's [in, out] (a bias: itself)
            assert_close(third, ref_state[f"{n}_projection.{old}"].grad, f"grad of {n} {part}", floor=floor)


def test_state_of_the_separate_form_loads_packed() -> None:
    state = separate_state(seed=6)
    mod = MultiHeadAttention(C, H, p_dropout=0.0, backend=FAST)
    assert mod.load_state_dict({k: mt(v, FAST) for k, v in state.items()}) == ([], [])  # tensors too
    weight = mod.qkv_projection.weight.value.to_numpy()
    bias = mod.qkv_projection.bias.value.to_numpy()
    for i, n in enumerate("qkv"):
        np.testing.assert_array_equal(weight[i * C : (i + 1) * C].T, state[f"{n}_projection.weights"])
        np.testing.assert_array_equal(bias[i * C : (i + 1) * C], state[f"{n}_projection.bias"])
    current = mod.state_dict()
    assert list(mod.upgrade_state(current)) == list(current)  # the current layout passes through
    partial = {k: v for k, v in state.items() if not k.startswith("v_")}
    with pytest.raises(KeyError, match="v_projection"):
        mod.load_state_dict(partial)


def older_layout(names: List[str], values: List[np.ndarray]) -> Dict[str, np.ndarray]:
    """Per-parameter arrays of a DecoderLM (current names, in order) rewritten as the older layout
    would have saved them: `weights` for `weight` (a Linear's as [in, out]), and each qkv_projection
    entry as three separate ones, in the older order."""
    out = {}
    for name, value in zip(names, values):
        if name.endswith(".weight"):
            linear = value.ndim == 2 and "embeddings" not in name
            name, value = name[: -len("weight")] + "weights", value.T if linear else value
        if ".qkv_projection." not in name:
            out[name] = value
            continue
        for i, n in enumerate("qkv"):
            width = value.shape[-1] // 3
            out[name.replace("qkv_projection", f"{n}_projection")] = value[..., i * width : (i + 1) * width]
    return out


def test_optimizer_moments_of_the_separate_form_follow_their_parameters() -> None:
    """A translation checkpoint of the older layout: parameters and Adam moments keyed by the older
    positions; after loading, a step from it equals a step from the current layout's state."""
    minitorch.manual_seed(2)
    model = DecoderLM(19, C, H, 8, n_layers=2, p_dropout=0.0, backend=FAST)
    optimizer = minitorch.Adam(model.parameters(), lr=1e-2)
    ids = mt(np.random.default_rng(0).integers(0, 19, (B, T)), FAST)
    model(ids).sum().backward()
    optimizer.step()
    names = [n for n, _ in model.named_parameters()]
    saved = optimizer.state_dict()
    old_params = older_layout(names, [p.value.to_numpy() for _, p in model.named_parameters()])
    old_moments = {k: older_layout(names, [saved[k][i] for i in range(len(names))]) for k in ("m", "v")}
    old_names = list(old_params)
    old_state = {"t": saved["t"], **{k: {str(old_names.index(n)): a for n, a in old_moments[k].items()} for k in ("m", "v")}}

    fresh = DecoderLM(19, C, H, 8, n_layers=2, p_dropout=0.0, backend=FAST)
    fresh.load_state_dict(old_params)
    restored = minitorch.Adam(fresh.parameters(), lr=1e-2)
    restored.load_state_dict(upgrade_moments(fresh, old_names, old_state))
    for key in ("m", "v"):
        for i, moment in saved[key].items():
            np.testing.assert_array_equal(restored.state_dict()[key][i], moment)
    for mdl, opt in ((model, optimizer), (fresh, restored)):
        opt.zero_grad()
        mdl(ids).sum().backward()
        opt.step()
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        np.testing.assert_array_equal(a.value.to_numpy(), b.value.to_numpy(), err_msg=name)
