"""minitorch.save / minitorch.load: tensors, state dicts and nested containers in a NumPy .npz file.

The format (version 1) is a plain `.npz` archive (numpy.savez, no pickle anywhere, read back with
`numpy.load(path, allow_pickle=False)`, so loading a file never runs code):

- entry `__minitorch__`: a uint8 array holding UTF-8 JSON {"format": "minitorch", "version": 1,
  "tree": NODE} that describes the saved object;
- entries "0", "1", ...: the arrays, one per tensor or NumPy array in the tree.

A NODE is one of
  {"tensor": "<entry>", "requires_grad": bool}   a minitorch Tensor (float32, or bool for dtype bool)
  {"tensor": "<entry>", "requires_grad": bool,   a bfloat16, float16 or int64 Tensor (version 2): the
   "dtype": "bfloat16" | "float16" | "int64"}    entry holds its uint16 bit patterns (int64: its values)
  {"array": "<entry>"}                           a NumPy array (any dtype but object)
  {"dict": [["<key>", NODE], ...]}               a dict with str keys, in order
  {"list": [NODE, ...]} / {"tuple": [NODE, ...]} a list / tuple
  {"value": <JSON value>}                        an int, float, str, bool or None

So `np.load(path)` alone reads every array of a file, and a state dict saved here loads with
`model.load_state_dict(minitorch.load(path))`.  Version 2 only adds the "dtype" field: a file
without 16-bit or int64 tensors is written as version 1, so older readers load it, and a file with
them as version 2, which they refuse rather than read bit patterns as numbers (or int64 as float32).

Every file is written by `atomic_write`: into a temporary file beside the target, flushed and
fsynced, then renamed over it (and the directory fsynced), so a crash leaves either the old file or
the new one under the name, never a part of one.  Programs write their own formats through it too.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Union

import numpy as np

from .dtypes import dtype_named
from .tensor import Tensor
from .tensor_create import tensor_from_numpy
from .tensor_ops import TensorBackend

HEADER = "__minitorch__"
FORMAT = "minitorch"
VERSION = 1
VERSION_16BIT = 2  # a file with a bfloat16 or float16 tensor (the "dtype" field)
ZIP_MAGIC = b"PK\x03\x04"  # how every .npz archive starts
TEMP_SUFFIX = ".part"
PathLike = Union[str, "os.PathLike[str]"]


class LoadError(ValueError):
    """A file minitorch.load cannot read (foreign, damaged, another format version); the message names
    the file and the problem."""


def previous_path(path: PathLike) -> Path:
    """Where atomic_write(keep_previous=True) keeps the file it replaces: ckpt.npz -> ckpt.prev.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def atomic_write(path: PathLike, write: Callable[[IO[bytes]], None], keep_previous: bool = False) -> Path:
    """Create or replace `path` with the bytes `write(f)` writes to the binary file f; returns path.

    The bytes go to a temporary file in the same directory (named `.<name>.<random>.part`, made with
    the permissions open() would give), which is flushed, fsynced and renamed over path, and the
    directory is fsynced, so after a crash path holds the old file or the new one, complete.  On any
    error (write raising included) the temporary file is removed and the old file is untouched.
    keep_previous: the file being replaced stays as previous_path(path) (`<stem>.prev<suffix>`),
    made another name of it (a hard link, a copy where links fail) before the rename, so both names
    always hold a complete file.  Temporary files that a killed writer left beside path are removed
    first: one writer per path at a time is assumed."""
    path = Path(path)
    for name in (path.name, previous_path(path).name):
        for leftover in path.parent.glob(f".{glob.escape(name)}.*{TEMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)
    tmp = _temporary_name(path)
    try:
        # Mode 0o666 and O_EXCL: the umask applies as for open(), and nothing else is overwritten.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.is_file():
            _link_previous(path)
        os.replace(tmp, path)
        _fsync_directory(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _temporary_name(path: Path) -> Path:
    """A fresh name beside path for a file that becomes path by a rename."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")


def _link_previous(path: Path) -> None:
    """Make previous_path(path) another complete name of the current file, replacing it atomically."""
    prev = previous_path(path)
    tmp = _temporary_name(prev)
    try:
        try:
            os.link(path, tmp)
        except OSError:
            with open(path, "rb") as src, open(tmp, "xb") as dst:
                shutil.copyfileobj(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(tmp, prev)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_directory(directory: Path) -> None:
    """Make a rename in directory durable (skipped where directories cannot be opened or synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _encode(obj: Any, arrays: Dict[str, np.ndarray], where: str, wide: List[str]) -> Dict[str, Any]:
    """The NODE of obj; its arrays go into `arrays`, the names of its 16-bit and int64 tensors' dtypes into `wide`."""
    if isinstance(obj, Tensor):
        key = str(len(arrays))
        if obj.dtype.rounds or obj.dtype.is_integer:
            values = obj.to_numpy()
            arrays[key] = obj.dtype.encode(values) if obj.dtype.rounds else values
            wide.append(obj.dtype.name)
            return {"tensor": key, "requires_grad": obj.requires_grad, "dtype": obj.dtype.name}
        arrays[key] = obj.numpy()
        return {"tensor": key, "requires_grad": obj.requires_grad}
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


def save(obj: Any, path: PathLike, keep_previous: bool = False) -> None:
    """Write obj (a Tensor, a state dict, or nested dicts/lists/tuples of tensors, arrays and plain
    values) to path in the .npz format above, atomically (atomic_write; keep_previous keeps the file
    it replaces as `<stem>.prev<suffix>`); the path is used as given."""
    arrays: Dict[str, np.ndarray] = {}
    wide: List[str] = []
    tree = _encode(obj, arrays, "the object", wide)
    version = VERSION_16BIT if wide else VERSION
    header = json.dumps({"format": FORMAT, "version": version, "tree": tree}).encode("utf-8")
    atomic_write(
        path, lambda f: np.savez(f, **{HEADER: np.frombuffer(header, dtype=np.uint8)}, **arrays), keep_previous
    )


def _decode(node: Dict[str, Any], arrays: Dict[str, np.ndarray], backend: Optional[TensorBackend]) -> Any:
    if "tensor" in node:
        values = arrays[node["tensor"]]
        if "dtype" in node:
            dtype = dtype_named(node["dtype"])
            values = dtype.decode(values) if dtype.rounds else values
            return tensor_from_numpy(values, backend=backend, requires_grad=bool(node["requires_grad"]), dtype=dtype)
        return tensor_from_numpy(values, backend=backend, requires_grad=bool(node["requires_grad"]))
    if "array" in node:
        return arrays[node["array"]]
    if "dict" in node:
        return {k: _decode(v, arrays, backend) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, arrays, backend) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, arrays, backend) for v in node["tuple"])
    return node["value"]


def _read(path: PathLike) -> tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(the header's tree, every array) of a file written by save, each member read (so a damaged
    one fails here); LoadError naming the file for anything else."""
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC:
        what = "an empty file" if not head else "not a NumPy .npz archive"
        raise LoadError(f"{path} is not a file written by minitorch.save: {what}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if HEADER not in archive.files:
                raise LoadError(f"{path} is a .npz file without a {HEADER} entry: not written by minitorch.save")
            header = json.loads(archive[HEADER].tobytes().decode("utf-8"))
            arrays = {name: archive[name] for name in archive.files if name != HEADER}
    except LoadError:
        raise
    except ValueError as err:
        if "allow_pickle" in str(err):  # numpy's message would suggest allow_pickle=True: never here
            raise LoadError(f"{path} holds pickled Python objects: not written by minitorch.save, which never pickles") from None
        raise LoadError(f"{path} is truncated or damaged ({type(err).__name__}: {err})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
        raise LoadError(f"{path} is truncated or damaged ({type(err).__name__}: {err})") from None
    found = (header.get("format"), header.get("version")) if isinstance(header, dict) else (None, None)
    if found not in ((FORMAT, VERSION), (FORMAT, VERSION_16BIT)):
        raise LoadError(
            f"{path}: format {found[0]!r} version {found[1]!r}; "
            f"this minitorch reads {FORMAT!r} versions {VERSION} and {VERSION_16BIT}"
        )
    return header["tree"], arrays


def load(path: PathLike, backend: Optional[Union[str, TensorBackend]] = None) -> Any:
    """The object that `save` wrote to path, its tensors on backend (default: the CPU default).

    A missing file raises FileNotFoundError; any other file that `save` did not write, or a damaged
    one (empty, truncated, another format or version), raises LoadError naming the file."""
    tree, arrays = _read(path)
    return _decode(tree, arrays, backend)
