"""minitorch.nn: layers, containers and losses with torch.nn's names.

    from minitorch import nn
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    loss = nn.functional.cross_entropy(model(x), y)      # or nn.cross_entropy, nn.mse_loss

Layers: Linear, Embedding, LayerNorm, Dropout, ReLU, GELU; containers: Module, ModuleList,
Sequential, Parameter.  Their parameters are named and shaped as torch.nn's, so
`model.load_state_dict(torch_model.state_dict())` loads a torch model of the same architecture.
`nn.functional` holds the functional ops; they are also reachable here (nn.cross_entropy, ...).
"""

from . import functional
from .functional import (
    cross_entropy,
    dropout,
    embedding,
    gelu,
    layer_norm,
    linear,
    log_softmax,
    logsoftmax,
    logsumexp,
    mse_loss,
    one_hot,
    relu,
    softmax,
    softmax_loss,
)

# The layers import nn.functional: loaded above, before them.
from ..module import Module, ModuleList, Parameter, Sequential  # noqa: E402
from ..modules_basic import GELU, Dropout, Embedding, LayerNorm, LayerNorm1d, Linear, ReLU  # noqa: E402

__all__ = [
    "functional", "cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear", "log_softmax", "logsoftmax",
    "logsumexp", "mse_loss", "one_hot", "relu", "softmax", "softmax_loss", "Module", "ModuleList", "Parameter",
    "Sequential", "GELU", "Dropout", "Embedding", "LayerNorm", "LayerNorm1d", "Linear", "ReLU",
]  # fmt: skip
