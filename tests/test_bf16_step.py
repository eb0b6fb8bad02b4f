"""A bf16 training step (the programs' --dtype bf16: minitorch.autocast(bfloat16, low_activations=True),
float32 master weights and AdamW) on a tiny model, against the same computation rounded step by step
in NumPy (bfloat16 rounding by ml_dtypes, independent of minitorch's): embedding rows rounded to bf16,
each Linear's products of bf16 values summed in float32 with its bias and GELU in float32 and its
output rounded once, residual sums rounded, the loss in float32, every activation gradient rounded to
bf16, the weight gradients in float32, AdamW on the float32 masters and the working copies rewritten
from them.  Results that went through the same float32 sums are compared for equality; a float32 sum
taken in another order may move a value across a bf16 rounding boundary, so a few one-ulp flips are
allowed."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch
from minitorch_testing import FAST, rel_err

import minitorch
from minitorch import bfloat16, float32, nn
from minitorch.autocast import working_copy
from minitorch.fused.embedding import embedding
from minitorch.fused.linear import linear

V, C, M, ROWS = 11, 8, 16, 12
LINEARS = ("w1", "w2", "wh")  # [in, out] in the reference's products; the model holds them as torch's [out, in]
GELU_C = math.sqrt(2.0 / math.pi)


def bf(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), as float32."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x**3)))).astype(np.float32)


def gelu_back(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    x, d = x.astype(np.float64), d.astype(np.float64)
    t = np.tanh(GELU_C * (x + 0.044715 * x**3))
    return (d * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * x * x))).astype(np.float32)


def init(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {"emb": (V, C), "w1": (C, M), "b1": (M,), "w2": (M, C), "b2": (C,), "wh": (C, V), "bh": (V,)}
    params = {k: (rng.standard_normal(s) * (0.5 if k.startswith("b") else 1.0 / math.sqrt(s[0]))).astype(np.float32)
              for k, s in shapes.items()}  # fmt: skip
    ids = rng.integers(0, V, ROWS)
    targets = rng.integers(0, V, ROWS)
    return {"params": params, "ids": ids, "targets": targets}


def minitorch_step(case: dict, lr: float):
    """(activations, loss, gradients, updated parameters, their working copies) of one step."""
    params = {k: minitorch.Parameter(minitorch.tensor_from_numpy(v.T if k in LINEARS else v, backend=FAST, requires_grad=True))
              for k, v in case["params"].items()}  # fmt: skip
    p = {k: v.value for k, v in params.items()}
    ids = minitorch.tensor_from_numpy(case["ids"].astype(np.float32), backend=FAST)
    targets = minitorch.tensor_from_numpy(case["targets"].astype(np.float32), backend=FAST)
    with minitorch.autocast(bfloat16, low_activations=True):
        e = embedding(p["emb"], ids)
        h = linear(e, p["w1"], p["b1"], "gelu")
        y = linear(h, p["w2"], p["b2"])
        r = e + y
        logits = linear(r, p["wh"], p["bh"])
        loss = nn.cross_entropy(logits, targets)
    acts = {"e": e, "h": h, "y": y, "r": r, "logits": logits}
    assert all(t.dtype is bfloat16 for t in acts.values()) and loss.dtype is float32
    loss.backward()
    grads = {k: v.grad for k, v in p.items()}
    assert all(g.dtype is float32 for g in grads.values())
    minitorch.AdamW(list(params.values()), lr=lr, weight_decay=0.1).step()
    as_reference = lambda k, a: a.T if k in LINEARS else a  # noqa: E731
    copies = {k: working_copy(v) for k, v in p.items()}
    copies = {k: None if c is None else as_reference(k, minitorch.Tensor(c, backend=FAST).to_numpy()) for k, c in copies.items()}
    return (
        {k: t.to_numpy() for k, t in acts.items()}, loss.item(), {k: as_reference(k, g.to_numpy()) for k, g in grads.items()},
        {k: as_reference(k, v.to_numpy()) for k, v in p.items()}, copies,
    )  # fmt: skip


def reference_step(case: dict, lr: float):
    """The same step in NumPy, rounded where the bf16 computation rounds."""
    w = case["params"]
    low = {k: bf(v) for k, v in w.items()}  # the working copies
    e = bf(w["emb"][case["ids"]])
    pre1 = np.matmul(e, low["w1"]) + low["b1"]
    h, pre1_low = bf(gelu(pre1)), bf(pre1)
    y = bf(np.matmul(h, low["w2"]) + low["b2"])
    r = bf(e + y)
    logits = bf(np.matmul(r, low["wh"]) + low["bh"])
    t = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(t, torch.tensor(case["targets"]))
    loss.backward()
    dlogits = bf(t.grad.numpy().astype(np.float32))
    dr = bf(np.matmul(dlogits, low["wh"].T))
    dh = bf(np.matmul(dr, low["w2"].T))
    d1 = bf(gelu_back(pre1_low, dh))
    de = bf(dr + bf(np.matmul(d1, low["w1"].T)))
    grads = {
        "wh": np.matmul(r.T, dlogits), "bh": dlogits.sum(0, dtype=np.float32),
        "w2": np.matmul(h.T, dr), "b2": dr.sum(0, dtype=np.float32),
        "w1": np.matmul(e.T, d1), "b1": d1.sum(0, dtype=np.float32),
        "emb": np.zeros((V, C), np.float32),
    }  # fmt: skip
    np.add.at(grads["emb"], case["ids"], de)
    tensors = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}
    for k, v in tensors.items():
        v.grad = torch.tensor(grads[k])
    torch.optim.AdamW(list(tensors.values()), lr=lr, weight_decay=0.1).step()
    acts = {"e": e, "h": h, "y": y, "r": r, "logits": logits}
    return acts, loss.item(), grads, {k: v.detach().numpy() for k, v in tensors.items()}


def assert_bf16_equal(mine: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Equal bf16 values, but for a few (at most 2%) one-ulp flips."""
    assert np.array_equal(mine, bf(mine)), f"{what}: not bf16 values"
    differ = mine != ref
    ulp = np.abs(ref.view(np.int32) - mine.view(np.int32)) >> 16
    assert differ.mean() <= 0.02 and (ulp[differ] <= 1).all(), f"{what}: {differ.sum()} of {mine.size} differ:\n{mine}\n{ref}"


def test_bf16_training_step_equals_the_step_rounded_by_hand() -> None:
    case, lr = init(), 1e-2
    acts, loss, grads, params, copies = minitorch_step(case, lr)
    ref_acts, ref_loss, ref_grads, ref_params = reference_step(case, lr)
    for name, value in acts.items():
        assert_bf16_equal(value, ref_acts[name], name)
    assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss)
    for name, value in grads.items():
        same = np.mean(value == ref_grads[name])
        assert same >= 0.9 and rel_err(value, ref_grads[name]) < 1e-3, f"d{name}: {same:.0%} equal"
    assert copies.pop("emb") is None  # the table is read in float32, its rows rounded
    for name, value in params.items():
        np.testing.assert_allclose(value, ref_params[name], rtol=0, atol=1e-6, err_msg=name)
        if name in copies:
            np.testing.assert_array_equal(copies[name], bf(value), err_msg=f"working copy of {name} after the update")


def test_bf16_step_of_a_transformer_is_the_float32_step_within_bf16_error() -> None:
    """Every path of a small DecoderLM (fused and naive attention, fused LayerNorm) under --dtype bf16
    gives the float32 step's loss and gradients within bf16's error, and the gradients stay float32."""
    results = {}
    for dtype in ("fp32", "bf16"):
        for attention in ("naive", "fused"):
            minitorch.manual_seed(1)
            model = minitorch.DecoderLM(n_vocab=23, n_embd=16, n_head=2, n_positions=12, n_layers=2, p_dropout=0.0,
                                        backend=FAST, use_fused_kernel=True, attention=attention)  # fmt: skip
            ids = minitorch.tensor_from_numpy(np.random.default_rng(2).integers(0, 23, (3, 9)).astype(np.float32), backend=FAST)
            context = minitorch.autocast(bfloat16, low_activations=True) if dtype == "bf16" else minitorch.autocast(enabled=False)
            with context:
                logits = model(ids)
                loss = nn.cross_entropy(logits.view(27, 23), ids.view(27))
            assert logits.dtype is (bfloat16 if dtype == "bf16" else float32)
            loss.backward()
            assert {p.value.grad.dtype for p in model.parameters()} == {float32}
            results[dtype, attention] = (loss.item(), [p.value.grad.to_numpy() for p in model.parameters()])
    for attention in ("naive", "fused"):
        (loss32, grads32), (loss16, grads16) = results["fp32", attention], results["bf16", attention]
        assert abs(loss16 - loss32) < 2e-3 * abs(loss32)
        for g16, g32 in zip(grads16, grads32):
            assert rel_err(g16, g32) < 4e-2
