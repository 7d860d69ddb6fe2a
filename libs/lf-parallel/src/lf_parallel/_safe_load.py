"""Reading checkpoint files without running code: DCP's ``.metadata``, its byte items and ``torch.load`` files.

A pickle names callables that the reader calls. DCP reads its ``.metadata`` with plain ``pickle.load`` and
the non-tensor items of its shards (``BYTE_IO``: optimizer hyper-parameters, Python scalars) with
``torch.load(weights_only=False)``, so a checkpoint folder someone else handed over could run any command.
This module closes both:

- :class:`SafeFileSystemReader`: a ``FileSystemReader`` whose ``read_metadata`` resolves only the classes a
  DCP ``Metadata`` is made of (``torch.distributed.checkpoint.metadata.*``, ``_StorageInfo``, ``torch.Size``,
  dtypes, layouts, memory formats, ``pathlib`` paths, ``collections.OrderedDict``) and refuses every other
  name before anything is called;
- :class:`SafeLoadPlanner`: DCP's ``DefaultLoadPlanner`` whose ``load_bytes`` uses
  ``torch.load(weights_only=True)``;
- :func:`safe_torch_load`: ``torch.load(weights_only=True)`` whose refusal names the file and the class.

Every refusal is an :class:`UnsafeCheckpointError` naming the file and the ``module.name`` it tried to load;
:func:`pickle_globals` lists the names a pickle refers to without resolving any (for those messages).
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

__all__ = ["SafeFileSystemReader", "SafeLoadPlanner", "UnsafeCheckpointError", "pickle_globals", "safe_torch_load"]

_TAMPERED = "this checkpoint was not written by lf or was tampered with"


class UnsafeCheckpointError(ValueError):
    """A checkpoint file whose pickle names a class or function lf does not load (nothing of it was run).

    Attributes:
        file: the refused file (a DCP shard for a byte item: the item's key is in the message).
        name: the ``module.name`` the pickle referred to (None for a ``.metadata`` refused for another reason:
            a persistent id, or an object that is not DCP ``Metadata``).
    """

    def __init__(self, message: str, *, file: str | os.PathLike | None = None, name: str | None = None):
        super().__init__(message)
        self.file, self.name = (None if file is None else str(file)), name


_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED: dict[tuple[str, str], Any] = {
    (_DCP_METADATA, n): getattr(torch.distributed.checkpoint.metadata, n)
    for n in ("Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
              "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
    if hasattr(torch.distributed.checkpoint.metadata, n)
}
_ALLOWED[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = \
    torch.distributed.checkpoint.filesystem._StorageInfo
_ALLOWED[("torch", "Size")] = torch.Size
_ALLOWED[("torch.serialization", "_get_layout")] = torch.serialization._get_layout  # a lookup: str -> layout
_ALLOWED[("collections", "OrderedDict")] = collections.OrderedDict
for _name, _value in vars(torch).items():
    if isinstance(_value, (torch.dtype, torch.layout, torch.memory_format)):
        _ALLOWED[("torch", _name)] = _value
for _module in ("pathlib", "pathlib._local"):  # StorageMeta.checkpoint_id; pathlib._local from Python 3.13
    for _name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"):
        _ALLOWED[(_module, _name)] = getattr(pathlib, _name)
del _name, _value, _module


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only :data:`_ALLOWED`; anything else raises before it is called."""

    def __init__(self, file, source: str):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle hook
        value = _ALLOWED.get((module, name))
        if value is None:
            raise UnsafeCheckpointError(f"{self.source}: refused to unpickle {module}.{name} (not a DCP metadata "
                                        f"class); {_TAMPERED}", file=self.source, name=f"{module}.{name}")
        return value

    def persistent_load(self, pid):  # noqa: D102 - pickle hook
        raise UnsafeCheckpointError(f"{self.source}: refused a persistent id in DCP metadata; {_TAMPERED}",
                                    file=self.source)


class SafeFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose ``.metadata`` is read by an allow-listed unpickler.

    Raises (from ``read_metadata``):
        UnsafeCheckpointError: the file names a class outside the DCP metadata classes (names file and class),
            or a shard path that leaves the folder (``../x``, ``/etc/x``).
        pickle.UnpicklingError, EOFError, ...: a truncated or garbled file (as ``pickle.load`` raises them).
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:  # noqa: D102 - FileSystemReader API
        rank = kwargs.get("rank")
        path = os.path.join(str(self.path), ".metadata" if rank is None else f"__{rank}.metadata")
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream, path).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpointError(f"{path}: holds a {type(metadata).__name__}, not DCP Metadata; {_TAMPERED}",
                                        file=path)
        for info in (metadata.storage_data or {}).values():  # shards are files of this folder, nowhere else
            rel = getattr(info, "relative_path", None)
            if not isinstance(rel, str) or rel in ("", ".", "..") or "/" in rel or "\\" in rel:
                raise UnsafeCheckpointError(f"{path}: refused shard path {rel!r} (not a file name inside the "
                                            f"checkpoint folder); {_TAMPERED}", file=path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


_GLOBAL_IN_TORCH_ERROR = re.compile(r"GLOBAL ([\w.]+)")


class _Stub:
    """What :class:`_Scanner` resolves every name to: calling, building or filling it does nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, item):  # noqa: D102
        pass

    def extend(self, items):  # noqa: D102
        pass


class _Scanner(pickle.Unpickler):
    def __init__(self, file):
        super().__init__(file)
        self.names: list[str] = []

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle hook
        self.names.append(f"{module}.{name}")
        return _Stub

    def persistent_load(self, pid):  # noqa: D102 - pickle hook
        return _Stub()


def pickle_globals(data: bytes) -> list[str]:
    """The ``module.name`` globals a pickle (or a ``torch.save`` zip archive's ``data.pkl``) refers to, in order.

    Nothing is resolved or called: every name stands for an inert stub. The scan stops at the first error
    (a truncated or garbled pickle) and returns the names seen until then.
    """
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                data = next((z.read(n) for n in z.namelist() if n.endswith("data.pkl")), b"")
        except (zipfile.BadZipFile, OSError, ValueError):
            return []
    scanner = _Scanner(io.BytesIO(data))
    try:
        scanner.load()
    except Exception:  # noqa: BLE001 - garbled pickles raise many types; the names seen so far still count
        pass
    return scanner.names


def _torch_allowed() -> set[str]:
    """The names ``torch.load(weights_only=True)`` resolves (its private table where this torch has it)."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        names = set(_get_allowed_globals())
    except (ImportError, AttributeError):
        names = set()
    safe = getattr(torch.serialization, "get_safe_globals", lambda: [])()
    names |= {f"{g.__module__}.{g.__qualname__}" for g in safe if hasattr(g, "__qualname__")}
    return names | {f"{m}.{n}" for m, n in _ALLOWED}


def _torch_refused(err: pickle.UnpicklingError, data: bytes, file: str, where: str,
                   what: str) -> UnsafeCheckpointError | None:
    """The refusal of ``torch.load(weights_only=True)`` naming ``where`` (the file, maybe an item in it) and the
    class, or None when the pickle names no refused class (garbage: the caller reports the file as damaged)."""
    if "Weights only load failed" not in str(err):
        return None
    found = _GLOBAL_IN_TORCH_ERROR.search(str(err))
    if found:
        name = found.group(1)
    else:  # an opcode torch's unpickler lacks (e.g. protocol 4 framing): name the first global the pickle holds
        allowed = _torch_allowed()
        name = next((g for g in pickle_globals(data) if g not in allowed), None)
    if name is None:
        return None
    return UnsafeCheckpointError(f"{where}: refused to unpickle {name} ({what}); {_TAMPERED}",
                                 file=file, name=name)


def _weights_only_load(data: bytes, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` of ``data``, without torch's warning about pickle protocols it may not
    support (a refusal follows, with its own message)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)


def safe_torch_load(path: str | os.PathLike, *, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``: tensors, containers and Python scalars only.

    Raises:
        UnsafeCheckpointError: the file names a class or function outside torch's weights-only set (the
            message names the file and the class).
        FileNotFoundError; pickle.UnpicklingError, RuntimeError, EOFError: a missing, truncated or garbled file.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        return _weights_only_load(data, map_location)
    except pickle.UnpicklingError as err:
        refused = _torch_refused(err, data, str(path), str(path), "not a tensor, container or scalar")
        if refused is not None:
            raise refused from None
        raise


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner whose non-tensor (``BYTE_IO``) items are read with ``weights_only=True``.

    Args:
        checkpoint_dir: the folder being loaded (named in errors).

    Raises (from ``load_bytes``):
        UnsafeCheckpointError: an item names a class outside torch's weights-only set (names the shard file,
            the item's key and the class).
    """

    def __init__(self, checkpoint_dir: str | os.PathLike, **kwargs: Any):
        super().__init__(**kwargs)
        self.checkpoint_dir = Path(checkpoint_dir)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:  # noqa: D102 - LoadPlanner API
        data = value.getvalue()
        try:
            obj = _weights_only_load(data)
        except pickle.UnpicklingError as err:
            info = (self.metadata.storage_data or {}).get(read_item.storage_index) if self.metadata else None
            shard = self.checkpoint_dir / getattr(info, "relative_path", "?")
            refused = _torch_refused(err, data, str(shard), f"{shard} (item {read_item.dest_index.fqn!r})",
                                     "a non-tensor DCP item may hold containers and scalars only")
            if refused is not None:
                raise refused from None
            raise
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
