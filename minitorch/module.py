"""Module and Parameter: a tree of layers holding trainable tensors; ModuleList and Sequential."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .autodiff import no_grad
from .tensor_create import tensor_from_numpy


class LoadResult(NamedTuple):
    """What Module.load_state_dict did not match: names the module has and the state lacks, and the reverse."""

    missing_keys: List[str]
    unexpected_keys: List[str]


class Parameter:
    """A trainable value held by a Module; `update` swaps in a new tensor and keeps it trainable,
    with the grad-ready hooks registered through the Parameter."""

    def __init__(self, x: Any, name: Optional[str] = None):
        self.value = x
        self.name = name
        self.grad_ready_hooks: List[Callable[[Any], None]] = []
        if hasattr(x, "requires_grad_"):
            self.value.requires_grad_(True)
            if self.name:
                self.value.name = self.name

    def update(self, x: Any) -> None:
        """Replace the value (e.g. after an optimizer step)."""
        previous, self.value = self.value, x
        if hasattr(x, "requires_grad_"):
            self.value.requires_grad_(True)
            if self.name:
                self.value.name = self.name
            if x is not previous:
                for hook in self.grad_ready_hooks:
                    x.register_grad_ready_hook(hook)

    def register_grad_ready_hook(self, hook: Callable[[Any], None]) -> None:
        """hook(tensor) after each backward pass has finished this parameter's gradient
        (Tensor.register_grad_ready_hook), on its value now and on every value `update` sets."""
        self.value.register_grad_ready_hook(hook)
        self.grad_ready_hooks.append(hook)

    def remove_grad_ready_hook(self, hook: Callable[[Any], None]) -> None:
        """Undo register_grad_ready_hook(hook)."""
        self.value.remove_grad_ready_hook(hook)
        self.grad_ready_hooks.remove(hook)

    def __repr__(self) -> str:
        return repr(self.value)


class Module:
    """Base class of layers.  Attributes that are Modules or Parameters are registered
    automatically; `training` switches dropout and similar behaviour."""

    _modules: Dict[str, "Module"]
    _parameters: Dict[str, Parameter]
    training: bool

    def __init__(self) -> None:
        self.__dict__["_modules"] = {}
        self.__dict__["_parameters"] = {}
        self.__dict__["training"] = True

    def modules(self) -> List["Module"]:
        """The direct children."""
        return list(self.__dict__["_modules"].values())

    def children(self) -> List["Module"]:
        return self.modules()

    def train(self, mode: bool = True) -> "Module":
        """Training mode (mode=False: evaluation) for this module and every descendant; returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode) takes a bool, got {type(mode).__name__} {mode!r}")
        self.__dict__["training"] = mode
        for m in self.modules():
            m.train(mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode for this module and every descendant; returns self."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop every parameter's gradient."""
        for p in self.parameters():
            p.value.zero_grad_()

    def named_parameters(self) -> List[Tuple[str, Parameter]]:
        """Every parameter of the tree with a dotted name ("layers.0.ln.weight")."""
        out = list(self.__dict__["_parameters"].items())
        for name, m in self.__dict__["_modules"].items():
            out.extend((f"{name}.{n}", p) for n, p in m.named_parameters())
        return out

    def parameters(self) -> List[Parameter]:
        return [p for _, p in self.named_parameters()]

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Parameter values by dotted name, as float32 NumPy copies (unlike torch's tensors, they do not
        alias the parameters, pickle anywhere, and `minitorch.save` writes them)."""
        return {name: p.value.to_numpy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> LoadResult:
        """Copy values (NumPy arrays or tensors, by dotted name) into the parameters, in place.

        strict=True (torch's default) raises KeyError when names are missing or unexpected; with
        strict=False those are skipped.  Returns (missing_keys, unexpected_keys).  A shape that
        differs raises ValueError.  Entries of an older parameter layout are first rewritten into
        the current one (upgrade_state)."""
        state = self.upgrade_state(state)
        own = dict(self.named_parameters())
        result = LoadResult(sorted(set(own) - set(state)), sorted(set(state) - set(own)))
        if strict and (result.missing_keys or result.unexpected_keys):
            raise KeyError(f"state dict mismatch: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
        for name, p in own.items():
            if name not in state:
                continue
            value = state[name]
            arr = value.to_numpy() if hasattr(value, "to_numpy") else np.asarray(value, dtype=np.float32)
            if tuple(arr.shape) != tuple(p.value.shape):
                raise ValueError(f"parameter {name}: saved shape {tuple(arr.shape)} differs from {p.value.shape}")
            with no_grad():
                p.value.copy_(tensor_from_numpy(arr, backend=p.value.backend))
        return result

    def upgrade_state(self, state: Mapping[str, Any]) -> Dict[str, Any]:
        """A copy of state (arrays or tensors by dotted name, in the shapes of the parameters they
        belong to: values, gradients or optimizer moments) in which entries of an older layout of a
        module's parameters are rewritten into the current layout.  Modules whose layout changed
        override `_upgrade_entries`; the rest pass state through."""
        out = dict(state)
        self._upgrade_tree(out, "")
        return out

    def _upgrade_tree(self, state: Dict[str, Any], prefix: str) -> None:
        self._upgrade_entries(state, prefix)
        for name, m in self.__dict__["_modules"].items():
            m._upgrade_tree(state, f"{prefix}{name}.")

    def _upgrade_entries(self, state: Dict[str, Any], prefix: str) -> None:
        """Rewrite, in place, this module's entries (names starting with prefix) of an older layout."""

    def to(self, backend: Any) -> "Module":
        """Move every parameter to a backend (a TensorBackend, or "cpu" / "cuda"), in place; returns self.
        Parameters become new leaves there (gradients are dropped)."""
        for p in self.parameters():
            p.update(p.value.to(backend).detach())
        return self

    def __setattr__(self, key: str, val: Any) -> None:
        if isinstance(val, Parameter):
            self.__dict__["_parameters"][key] = val
        elif isinstance(val, Module):
            self.__dict__["_modules"][key] = val
        else:
            super().__setattr__(key, val)

    def __getattr__(self, key: str) -> Any:
        if key in self.__dict__["_parameters"]:
            return self.__dict__["_parameters"][key]
        if key in self.__dict__["_modules"]:
            return self.__dict__["_modules"][key]
        raise AttributeError(f"{type(self).__name__} has no attribute {key!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        """What this module's repr shows besides its children (its sizes); layers override it."""
        return ""

    def __repr__(self) -> str:
        """torch's form: Name(extra_repr) for a leaf, the children one per line otherwise."""
        children = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.__dict__["_modules"].items()]
        extra = self.extra_repr()
        if not children:
            return f"{type(self).__name__}({extra})"
        lines = (extra.split("\n") if extra else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules registered under their positions ("0", "1", ...)."""

    def __init__(self, modules: Sequence[Module] = ()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> None:
        self.__dict__["_modules"][str(len(self))] = m

    def __len__(self) -> int:
        return len(self.__dict__["_modules"])

    def __iter__(self) -> Iterator[Module]:
        return iter(self.__dict__["_modules"].values())

    def __getitem__(self, i: int) -> Module:
        return self.__dict__["_modules"][str(i if i >= 0 else len(self) + i)]


class Sequential(Module):
    """Modules applied one after the other, as torch.nn.Sequential: Sequential(a, b, c) registers
    them as "0", "1", "2"; Sequential(OrderedDict(name=module, ...)) under their names."""

    def __init__(self, *modules: Union[Module, "OrderedDict[str, Module]"]):
        super().__init__()
        named = list(modules[0].items()) if len(modules) == 1 and isinstance(modules[0], OrderedDict) else list(enumerate(modules))
        for name, m in named:
            if not isinstance(m, Module):
                raise TypeError(f"Sequential takes minitorch Modules, got {type(m).__name__} at {name!r}")
            self.__dict__["_modules"][str(name)] = m

    def forward(self, x: Any) -> Any:
        for m in self.__dict__["_modules"].values():
            x = m(x)
        return x

    def __len__(self) -> int:
        return len(self.__dict__["_modules"])

    def __iter__(self) -> Iterator[Module]:
        return iter(self.__dict__["_modules"].values())

    def __getitem__(self, i: int) -> Module:
        return list(self.__dict__["_modules"].values())[i]
