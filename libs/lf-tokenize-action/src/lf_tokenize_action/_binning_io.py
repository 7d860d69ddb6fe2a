"""JSON layout of ``BinningTokenizer`` (format ``lf-tokenize-action/binning``, versions 1 to 3).

Version 1 (0.1.0, still written for uniform bins): ``n_bins``, ``low``, ``high``,
``normalize_mask``. Version 2 (quantile bins only): the same plus
``binning: "quantile"`` and ``edges``, D lists of ``n_bins + 1`` floats in
normalized units. Writing version 2 only when needed keeps uniform files
readable by 0.1.0, while 0.1.0 refuses a quantile file instead of misreading it.
Version 3 (``layout="openvla"`` only): version 1's fields plus ``layout: "openvla"``,
so older readers refuse it rather than decode with the wrong edges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._io import check_header

FORMAT = "lf-tokenize-action/binning"
VERSIONS = (1, 2, 3)
BINNINGS = ("uniform", "quantile")
LAYOUTS = ("exact", "openvla")


def binning_to_dict(tok: Any) -> dict[str, Any]:
    """The JSON-ready dict of a ``BinningTokenizer`` (version 1 when uniform, 2 when quantile)."""
    d: dict[str, Any] = {
        "format": FORMAT,
        "version": 1,
        "n_bins": tok.n_bins,
        "low": tok.low.tolist(),
        "high": tok.high.tolist(),
        "normalize_mask": tok.normalize_mask.tolist(),
    }
    if tok.binning == "quantile":
        d.update(version=2, binning="quantile", edges=tok.bin_edges.tolist())
    if tok.layout == "openvla":
        d.update(version=3, layout="openvla")
    return d


def binning_kwargs_from_dict(d: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Constructor keyword arguments from a version 1, 2 or 3 dict; ValueError naming ``where`` and the field."""
    version = check_header(d, fmt=FORMAT, version=VERSIONS, where=where)
    extra = {1: (), 2: ("binning",), 3: ("layout",)}[version]
    for field in ("n_bins", "low", "high", "normalize_mask") + extra:
        if field not in d:
            raise ValueError(f"{where}: missing field {field!r}")
    mask = d["normalize_mask"]
    if not isinstance(mask, list) or not all(isinstance(m, bool) for m in mask):
        raise ValueError(f"{where}: field 'normalize_mask' must be a list of booleans; got {mask!r}")
    binning = d.get("binning", "uniform") if version == 2 else "uniform"
    if binning not in BINNINGS:
        raise ValueError(f"{where}: field 'binning' must be one of {list(BINNINGS)}; got {binning!r}")
    layout = d["layout"] if version == 3 else "exact"
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: field 'layout' must be one of {list(LAYOUTS)}; got {layout!r}")
    if binning == "quantile" and "edges" not in d:
        raise ValueError(f"{where}: missing field 'edges' (needed by binning='quantile')")
    return {
        "low": d["low"],
        "high": d["high"],
        "n_bins": d["n_bins"],
        "normalize_mask": np.array(mask, dtype=bool),
        "edges": d["edges"] if binning == "quantile" else None,
        "layout": layout,
    }
