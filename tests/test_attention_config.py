"""minitorch.AttentionConfig: the mapping of the older flags, the one legality check, and the
transformer modules taking config= (or the older keywords, mapped the same way) with the same result."""

from __future__ import annotations

import re

import numpy as np
import pytest
from minitorch_testing import FAST

import minitorch
from minitorch import AttentionConfig, DecoderLM, MultiHeadAttention, TransformerLayer

FLAGS = {
    # (use_fused_kernel, attention, activation): (fused_softmax, fused_layernorm, decode_fused_softmax)
    (False, "naive", "softmax"): (False, False, False),
    (True, "naive", "softmax"): (True, True, True),
    (True, "naive", "relu"): (False, True, False),
    (True, "fused", "softmax"): (False, True, True),
    (False, "fused", "softmax"): (False, False, True),
    (True, "fused", "relu"): (False, True, False),
}


@pytest.mark.parametrize("flags", FLAGS, ids=[f"{u}-{a}-{b}" for u, a, b in FLAGS])
def test_from_flags_keeps_what_use_fused_kernel_means(flags) -> None:
    config = AttentionConfig.from_flags(*flags)
    assert (config.attention, config.activation) == flags[1:]
    assert (config.fused_softmax, config.fused_layernorm, config.decode_fused_softmax) == FLAGS[flags]


@pytest.mark.parametrize("attention,activation", [("fused", "softmax"), ("naive", "relu"), ("fused", "relu")])
def test_a_fused_softmax_without_a_separate_softmax_is_one_error_naming_the_combination(attention, activation) -> None:
    combination = f"AttentionConfig(attention='{attention}', activation='{activation}', fused_softmax=True)"
    with pytest.raises(ValueError, match=f"^{re.escape(combination)}: only attention='naive'"):
        AttentionConfig(attention, activation, fused_softmax=True)


def test_unknown_settings_and_frozen() -> None:
    with pytest.raises(ValueError, match=r"attention must be one of \('naive', 'fused'\), got 'flash'"):
        AttentionConfig(attention="flash")
    with pytest.raises(ValueError, match="activation must be one of .* got 'gelu'"):
        AttentionConfig.from_flags(activation="gelu")
    with pytest.raises(AttributeError):
        AttentionConfig().attention = "fused"  # frozen


def test_modules_take_config_or_the_older_keywords() -> None:
    config = AttentionConfig(fused_softmax=True, fused_layernorm=True)
    assert MultiHeadAttention(8, 2, backend=FAST, config=config).attention_config is config
    assert MultiHeadAttention(8, 2, backend=FAST, use_fused_kernel=True).attention_config == config
    layer = TransformerLayer(8, 2, backend=FAST, use_fused_kernel=True, attention="fused")
    assert layer.attention_config == AttentionConfig("fused", fused_layernorm=True)
    assert layer.ln_1.use_fused_kernel and layer.ln_2.use_fused_kernel
    assert layer.attention.attention_config is layer.attention_config
    model = DecoderLM(11, 8, 2, 6, n_layers=2, backend=FAST, config=AttentionConfig("fused", "relu", fused_layernorm=True))
    assert model.ln.use_fused_kernel and all(layer.attention_config is model.attention_config for layer in model.layers)
    with pytest.raises(ValueError, match=r"DecoderLM: pass config= or the keywords use_fused_kernel/attention/activation"):
        DecoderLM(11, 8, 2, 6, backend=FAST, config=config, attention="fused")
    with pytest.raises(TypeError, match="config must be a minitorch.AttentionConfig, got dict"):
        TransformerLayer(8, 2, backend=FAST, config={"attention": "fused"})


@pytest.mark.parametrize("flags", FLAGS, ids=[f"{u}-{a}-{b}" for u, a, b in FLAGS])
def test_a_model_built_from_config_computes_what_the_flags_compute(flags) -> None:
    ids = minitorch.tensor([[1.0, 4.0, 2.0, 7.0], [3.0, 0.0, 5.0, 5.0]], backend=FAST)
    mask = minitorch.tensor([[0.0, 0.0, 0.0, 0.0], [-1e9, 0.0, 0.0, 0.0]], backend=FAST)
    outputs = []
    for options in ({"use_fused_kernel": flags[0], "attention": flags[1], "activation": flags[2]},
                    {"config": AttentionConfig.from_flags(*flags)}):  # fmt: skip
        minitorch.manual_seed(5)
        model = DecoderLM(11, 8, 2, 6, n_layers=2, p_dropout=0.0, backend=FAST, **options)
        outputs.append(model(ids, mask).to_numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
