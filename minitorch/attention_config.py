"""AttentionConfig: how a transformer computes its attention and LayerNorms, resolved once.

attention "naive" materializes the scores [B, H, T, T]; "fused" runs minitorch.fused_attention_qkv,
which (on CUDA) never does.  activation "relu" puts relu(scores + masks) where the softmax was.
fused_softmax runs the naive path's softmax as Tensor.attn_softmax (one op that applies the masks
itself); fused_layernorm runs every LayerNorm1d as Tensor.layernorm.  The kernel choices and the
attention path compute the same function (up to float rounding); the activation is the model's.

The legality rule lives here alone: fused_softmax needs a separate softmax, which only the naive
path with the softmax activation has.  The programs' older flags map through from_flags, so
`--use-fused-kernel true` keeps meaning the fused LayerNorm, and the fused softmax where the path
has a separate one.

    config = AttentionConfig.from_flags(use_fused_kernel=True, attention="fused")
    model = minitorch.DecoderLM(..., config=config)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .fused.attention import check_activation

ATTENTIONS = ("naive", "fused")  # the attention path: scores materialized or not


@dataclass(frozen=True)
class AttentionConfig:
    """The attention path, its activation and the fused kernels; see the module docstring.  An
    illegal combination raises one ValueError naming it."""

    attention: str = "naive"
    activation: str = "softmax"
    fused_softmax: bool = False
    fused_layernorm: bool = False

    def __post_init__(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ValueError(f"AttentionConfig: attention must be one of {ATTENTIONS}, got {self.attention!r}")
        check_activation("AttentionConfig", self.activation)
        if self.fused_softmax and not self.separate_softmax:
            raise ValueError(
                f"AttentionConfig(attention={self.attention!r}, activation={self.activation!r}, fused_softmax=True): "
                f"only attention='naive' with activation='softmax' has a separate softmax to fuse"
            )

    @property
    def separate_softmax(self) -> bool:
        """Whether the attention takes a softmax of materialized scores (what fused_softmax fuses)."""
        return self.attention == "naive" and self.activation == "softmax"

    @property
    def decode_fused_softmax(self) -> bool:
        """Whether a decoding step with a KV cache, whose scores are always materialized, takes their
        softmax with Tensor.attn_softmax: on either fused setting (fused_softmax, attention 'fused')."""
        return self.activation == "softmax" and (self.fused_softmax or self.attention == "fused")

    @classmethod
    def from_flags(
        cls, use_fused_kernel: bool = False, attention: str = "naive", activation: str = "softmax"
    ) -> "AttentionConfig":
        """The configuration of the older flags: use_fused_kernel turns on the fused LayerNorm, and the
        fused softmax where the attention path has a separate softmax."""
        separate = attention == "naive" and activation == "softmax"
        return cls(attention, activation, fused_softmax=bool(use_fused_kernel) and separate,
                   fused_layernorm=bool(use_fused_kernel))  # fmt: skip


def resolve_attention_config(
    owner: str, config: Optional[AttentionConfig], use_fused_kernel: bool, attention: str, activation: str
) -> AttentionConfig:
    """config, or the older keywords mapped through from_flags; ValueError naming owner when both
    are given (the keywords differ from their defaults next to a config)."""
    if config is None:
        return AttentionConfig.from_flags(use_fused_kernel, attention, activation)
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"{owner}: config must be a minitorch.AttentionConfig, got {type(config).__name__}")
    if (use_fused_kernel, attention, activation) != (False, "naive", "softmax"):
        raise ValueError(
            f"{owner}: pass config= or the keywords use_fused_kernel/attention/activation, not both (got {config} "
            f"and use_fused_kernel={use_fused_kernel}, attention={attention!r}, activation={activation!r})"
        )
    return config
