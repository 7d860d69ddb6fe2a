"""JSON layout of ``FastTokenizer`` (format ``lf-tokenize-action/fast``, version 1) and token-row plumbing.

``reconstruction_error`` (``{"max_abs": [D], "rms": [D], "chunks": n}``, written by
``fit``) is optional: files without it load with ``None``, and older
readers ignore it (it changes no encoding).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ._arrays import is_torch_tensor, to_numpy
from ._fast_recon import ReconstructionStats
from ._io import check_header

FORMAT = "lf-tokenize-action/fast"
VERSION = 1
_FIELDS = ("scale", "horizon", "min_coeff", "max_coeff", "low", "high", "normalize_mask", "bpe")


def fast_to_dict(tok: Any) -> dict[str, Any]:
    """The JSON-ready dict of a ``FastTokenizer``; ``bpe`` is the parsed ``Tokenizer.to_str()`` object."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "scale": tok.scale,
        "horizon": tok.horizon,
        "min_coeff": tok.min_coeff,
        "max_coeff": tok.max_coeff,
        "low": tok.low.tolist(),
        "high": tok.high.tolist(),
        "normalize_mask": tok.normalize_mask.tolist(),
        "bpe": json.loads(tok.bpe.to_str()),
        **({} if tok.reconstruction_error is None else {"reconstruction_error": tok.reconstruction_error.to_dict()}),
    }


def fast_kwargs_from_dict(d: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Constructor keyword arguments from a version 1 dict; ValueError naming ``where`` and the field."""
    check_header(d, fmt=FORMAT, version=VERSION, where=where)
    for field in _FIELDS:
        if field not in d:
            raise ValueError(f"{where}: missing field {field!r}")
    mask = d["normalize_mask"]
    if not isinstance(mask, list) or not all(isinstance(m, bool) for m in mask):
        raise ValueError(f"{where}: field 'normalize_mask' must be a list of booleans; got {mask!r}")
    try:
        bpe = Tokenizer.from_str(json.dumps(d["bpe"]))
    except Exception as err:  # tokenizers raises a plain Exception
        raise ValueError(f"{where}: field 'bpe' is not a valid tokenizers JSON: {err}") from err
    kwargs = {k: d[k] for k in ("scale", "horizon", "min_coeff", "max_coeff", "low", "high")}
    recon = d.get("reconstruction_error")
    if recon is not None:
        recon = ReconstructionStats.from_dict(recon, where=where, action_dim=len(mask))
    return {**kwargs, "bpe": bpe, "normalize_mask": np.array(mask, dtype=bool), "reconstruction_error": recon}


def token_rows(token_lists: Any) -> tuple[list[np.ndarray], Any]:
    """Token sequences as int64 numpy rows, and the torch device when the input held tensors."""
    device = None
    if is_torch_tensor(token_lists) or isinstance(token_lists, np.ndarray):
        arr, device = to_numpy(token_lists, name="token_lists")
        if arr.ndim != 2:
            raise ValueError(f"token_lists as an array must be 2-D (n, L); got shape {arr.shape}")
        token_lists = list(arr)
    rows = []
    for r, seq in enumerate(token_lists):
        arr, dev = to_numpy(seq, name=f"token_lists[{r}]")
        device = device if dev is None else dev
        if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"token_lists[{r}] must hold integer ids; got dtype {arr.dtype}")
        rows.append(arr.astype(np.int64).ravel())
    return rows, device
