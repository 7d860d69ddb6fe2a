"""An allow-listed unpickler for RLBench's ``low_dim_obs.pkl`` (no rlbench install, no arbitrary code).

``pickle`` runs whatever callable a file names; :class:`SafeUnpickler` only
resolves the names below and refuses every other one with a :class:`DataError`
naming it, before anything is called:

- ``rlbench.demo.Demo`` and ``rlbench.backend.observation.Observation`` resolve
  to the plain stand-in classes of this module (attributes restored from the
  pickled ``__dict__``; no RLBench code runs);
- numpy array and scalar reconstruction: ``numpy[._]core.multiarray._reconstruct``
  / ``scalar``, ``numpy[._]core.numeric._frombuffer`` (protocol 5),
  ``numpy.ndarray``, ``numpy.dtype``;
- ``copyreg._reconstructor`` (protocols 0-1) for the stand-ins only, ``builtins.object`` (its base
  argument), ``_codecs.encode`` (how protocols 0-2 store bytes), ``builtins.bytes`` with no argument (how
  they store ``b""``), ``builtins.set`` / ``frozenset`` (how they store sets).

Python 2 names (``__builtin__``, ``copy_reg``, ...), which protocols 0-2 write, are mapped first as
``pickle.Unpickler.find_class`` maps them with ``fix_imports`` (``_compat_pickle.NAME_MAPPING`` /
``IMPORT_MAPPING``), then checked against the list: ``__builtin__.eval`` is refused as ``builtins.eval``.

Object-dtype arrays restore their items through this same unpickler.
``numpy.ndarray`` resolves to a non-callable token that only ``_reconstruct``
accepts: calling ``ndarray(shape, object, buffer=...)`` would build an object
array from raw bytes (pointers). ``ndarray.__setstate__``, ``scalar`` and
``_frombuffer`` refuse object dtypes with raw bytes themselves.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import pickle
from pathlib import Path

import numpy as np

from ._errors import DataError, is_lfs_pointer

__all__ = ["Demo", "Observation", "SafeUnpickler", "safe_load"]


class Demo:
    """Stand-in for ``rlbench.demo.Demo``: ``_observations``, ``random_seed``, ``num_reset_attempts``."""

    _observations: list

    def __len__(self) -> int:
        return len(self._observations)

    def __getitem__(self, i: int):
        return self._observations[i]


class Observation:
    """Stand-in for ``rlbench.backend.observation.Observation`` (``joint_positions``,
    ``gripper_open``, ``gripper_pose``, ``misc``, ...: whatever the pickle holds)."""


def _numpy(module: str, name: str):
    mod = {"multiarray": np._core.multiarray if hasattr(np, "_core") else np.core.multiarray,
           "numeric": np._core.numeric if hasattr(np, "_core") else np.core.numeric}[module]
    return getattr(mod, name)


_STAND_INS = (Demo, Observation)


class _NDArrayToken:
    """What ``numpy.ndarray`` resolves to: not callable, so a pickle cannot call
    ``ndarray(shape, object, buffer=...)`` (an object array of pointers read from the file);
    :func:`_reconstruct` swaps it for the real class."""


_NDARRAY = _NDArrayToken()


def _reconstruct(subtype, shape, dtype):
    if subtype is not _NDARRAY:
        raise pickle.UnpicklingError(f"numpy _reconstruct refused for subtype {subtype!r}")
    return _numpy("multiarray", "_reconstruct")(np.ndarray, shape, dtype)


def _reconstructor(cls, base, state):
    if cls not in _STAND_INS or base is not object or state is not None:
        raise pickle.UnpicklingError(f"copyreg._reconstructor refused for {cls!r} / {base!r}")
    return object.__new__(cls)


def _empty_bytes(*args):
    """``bytes()`` as protocols 0-2 write ``b""``; any argument (``bytes(10**12)``) is refused."""
    if args:
        raise pickle.UnpicklingError(f"builtins.bytes refused for arguments {args!r:.60}")
    return b""


_ALLOWED = {
    ("rlbench.demo", "Demo"): lambda: Demo,
    ("rlbench.backend.observation", "Observation"): lambda: Observation,
    ("numpy", "ndarray"): lambda: _NDARRAY,
    ("numpy", "dtype"): lambda: np.dtype,
    ("copyreg", "_reconstructor"): lambda: _reconstructor,
    ("builtins", "object"): lambda: object,
    ("builtins", "bytes"): lambda: _empty_bytes,
    ("builtins", "set"): lambda: set,
    ("builtins", "frozenset"): lambda: frozenset,
    ("_codecs", "encode"): lambda: codecs.encode,
}
for _core in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_core}.multiarray", "_reconstruct")] = lambda: _reconstruct
    _ALLOWED[(f"{_core}.multiarray", "scalar")] = lambda: _numpy("multiarray", "scalar")
    _ALLOWED[(f"{_core}.numeric", "_frombuffer")] = lambda: _numpy("numeric", "_frombuffer")
del _core


def _python3_name(module: str, name: str) -> tuple[str, str]:
    """The Python 3 name of a Python 2 one, as ``pickle.Unpickler.find_class`` maps it (``fix_imports``)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


class SafeUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` resolves only the allow-listed names."""

    def __init__(self, file, *, source: str | Path = "<pickle>") -> None:
        super().__init__(file)
        self.source = str(source)

    def find_class(self, module: str, name: str):  # noqa: D102 - pickle hook
        py3 = _python3_name(module, name)
        make = _ALLOWED.get(py3)
        if make is None:
            alias = "" if py3 == (module, name) else f" (Python 3: {py3[0]}.{py3[1]})"
            raise DataError(f"{self.source}: pickle refers to {module}.{name}{alias}, which is not allowed (only "
                            "RLBench Demo/Observation and numpy arrays are); refusing to load it",
                            file=self.source, field=f"{module}.{name}", reason="forbidden_class")
        return make()


def safe_load(path: str | Path, *, episode: object = None):
    """Unpickle ``path`` with :class:`SafeUnpickler`.

    Raises:
        DataError: forbidden class (``reason="forbidden_class"``), Git LFS
            pointer (``"lfs_pointer"``), truncated or corrupt pickle (``"invalid"``).
        FileNotFoundError: ``path`` is missing.
    """
    path = Path(path)
    where = "" if episode is None else f" (episode {episode}, field {path.name!r})"
    if is_lfs_pointer(path):
        raise DataError(f"{path}: is a Git LFS pointer file, not a pickle (run 'git lfs pull'){where}", file=path,
                        episode=episode, field=path.name, reason="lfs_pointer")
    try:
        return SafeUnpickler(io.BytesIO(path.read_bytes()), source=path).load()
    except DataError as e:
        e.episode = episode
        e.args = (f"{e}{where}",)
        raise
    except Exception as e:  # corrupt pickles raise many types (EOFError, UnpicklingError, ValueError...)
        raise DataError(f"{path}: cannot unpickle ({type(e).__name__}: {e}){where}", file=path, episode=episode,
                        field=path.name, reason="invalid") from e

