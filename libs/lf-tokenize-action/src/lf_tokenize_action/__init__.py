"""lf-tokenize-action: continuous robot actions <-> discrete tokens.

- ``BinningTokenizer``: per-dimension normalization to [-1, 1] (q01/q99, min/max or
  mean +- k*std) and N uniform or quantile bins (OpenVLA-style, arXiv:2406.09246).
- ``FastTokenizer``: DCT + scale-and-round + BPE over action chunks (FAST,
  arXiv:2501.09747).
- ``ActionVocab``: action bins / FAST tokens <-> token ids reserved after a text vocabulary.
- ``ActionDecodeError``: a token sequence that does not decode to a chunk.
- ``CoefficientRangeError`` / ``ReconstructionToleranceError``: FAST ``fit`` refusals
  (coefficients beyond the character alphabet; reconstruction error over the tolerance).
- ``ReconstructionStats``: FAST's per-dimension reconstruction error on its fitting data.
"""

from ._binning import BinningTokenizer
from ._errors import ActionDecodeError, CoefficientRangeError, ReconstructionToleranceError
from ._fast import FastTokenizer
from ._fast_recon import ReconstructionStats
from ._vocab import ActionVocab

__all__ = [
    "ActionDecodeError",
    "ActionVocab",
    "BinningTokenizer",
    "CoefficientRangeError",
    "FastTokenizer",
    "ReconstructionStats",
    "ReconstructionToleranceError",
]
__version__ = "0.4.0"
