"""minitorch.save / minitorch.load: tensors, state dicts and nested containers in a NumPy .npz file.

The format (version 1, or 2 for a file holding a 16-bit tensor) is a plain `.npz` archive
(numpy.savez, no pickle anywhere, read back with `numpy.load(path, allow_pickle=False)`, so loading a
file never runs code):

- entry `__minitorch__`: a uint8 array holding UTF-8 JSON {"format": "minitorch", "version": 1 or 2,
  "tree": NODE} that describes the saved object;
- entries "0", "1", ...: the arrays, one per tensor or NumPy array in the tree.

A NODE is one of
  {"tensor": "<entry>", "requires_grad": bool}   a minitorch Tensor (float32, or bool for dtype bool)
  {"tensor": "<entry>", "requires_grad": bool,   a bfloat16 or float16 Tensor (version 2): the entry
   "dtype": "bfloat16" | "float16"}              holds its uint16 bit patterns
  {"array": "<entry>"}                           a NumPy array (any dtype but object)
  {"dict": [["<key>", NODE], ...]}               a dict with str keys, in order
  {"list": [NODE, ...]} / {"tuple": [NODE, ...]} a list / tuple
  {"value": <JSON value>}                        an int, float, str, bool or None

So `np.load(path)` alone reads every array of a file, and a state dict saved here loads with
`model.load_state_dict(minitorch.load(path))`.  Version 2 only adds the "dtype" field: a file
without 16-bit tensors is written as version 1, so older readers load it, and a file with them as
version 2, which they refuse rather than read bit patterns as numbers.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Union

import numpy as np

from .dtypes import dtype_named
from .tensor import Tensor
from .tensor_create import tensor_from_numpy
from .tensor_ops import TensorBackend

HEADER = "__minitorch__"
FORMAT = "minitorch"
VERSION = 1
VERSION_16BIT = 2  # a file with a bfloat16 or float16 tensor (the "dtype" field)
PathLike = Union[str, "os.PathLike[str]"]


def _encode(obj: Any, arrays: Dict[str, np.ndarray], where: str, wide: List[str]) -> Dict[str, Any]:
    """The NODE of obj; its arrays go into `arrays`, the names of its 16-bit tensors' dtypes into `wide`."""
    if isinstance(obj, Tensor):
        key = str(len(arrays))
        if obj.dtype.rounds:
            arrays[key] = obj.dtype.encode(obj.to_numpy())
            wide.append(obj.dtype.name)
            return {"tensor": key, "requires_grad": obj.requires_grad(), "dtype": obj.dtype.name}
        arrays[key] = obj.numpy()
        return {"tensor": key, "requires_grad": obj.requires_grad()}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O":
            raise TypeError(f"minitorch.save: {where} is a NumPy array of Python objects, which would need pickle")
        key = str(len(arrays))
        arrays[key] = obj
        return {"array": key}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"minitorch.save: {where} has a key {k!r} of type {type(k).__name__}; keys must be str")
            items.append([k, _encode(v, arrays, f"{where}[{k!r}]", wide)])
        return {"dict": items}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {kind: [_encode(v, arrays, f"{where}[{i}]", wide) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return {"value": obj.item()}
    raise TypeError(
        f"minitorch.save: {where} is a {type(obj).__name__}; it saves tensors, NumPy arrays, numbers, "
        f"strings, None, and dicts (str keys), lists and tuples of them"
    )


def save(obj: Any, path: PathLike) -> None:
    """Write obj (a Tensor, a state dict, or nested dicts/lists/tuples of tensors, arrays and plain
    values) to path in the .npz format above; the path is used as given."""
    arrays: Dict[str, np.ndarray] = {}
    wide: List[str] = []
    tree = _encode(obj, arrays, "the object", wide)
    version = VERSION_16BIT if wide else VERSION
    header = json.dumps({"format": FORMAT, "version": version, "tree": tree}).encode("utf-8")
    with open(path, "wb") as f:
        np.savez(f, **{HEADER: np.frombuffer(header, dtype=np.uint8)}, **arrays)


def _decode(node: Dict[str, Any], archive: Any, backend: Optional[TensorBackend]) -> Any:
    if "tensor" in node:
        values = archive[node["tensor"]]
        if "dtype" in node:
            dtype = dtype_named(node["dtype"])
            return tensor_from_numpy(dtype.decode(values), backend, bool(node["requires_grad"]), dtype)
        return tensor_from_numpy(values, backend=backend, requires_grad=bool(node["requires_grad"]))
    if "array" in node:
        return archive[node["array"]]
    if "dict" in node:
        return {k: _decode(v, archive, backend) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, archive, backend) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, archive, backend) for v in node["tuple"])
    return node["value"]


def load(path: PathLike, backend: Optional[Union[str, TensorBackend]] = None) -> Any:
    """The object that `save` wrote to path, its tensors on backend (default: the CPU default)."""
    with np.load(path, allow_pickle=False) as archive:
        if HEADER not in archive.files:
            raise ValueError(f"{path} is a .npz file without a {HEADER} entry: not written by minitorch.save")
        header = json.loads(archive[HEADER].tobytes().decode("utf-8"))
        if header.get("format") != FORMAT or header.get("version") not in (VERSION, VERSION_16BIT):
            raise ValueError(
                f"{path}: format {header.get('format')!r} version {header.get('version')!r}; "
                f"this minitorch reads {FORMAT!r} versions {VERSION} and {VERSION_16BIT}"
            )
        return _decode(header["tree"], archive, backend)
