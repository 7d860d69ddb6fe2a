"""lf-tokenize-action: continuous robot actions <-> discrete tokens.

- ``BinningTokenizer``: per-dimension normalization to [-1, 1] and N uniform bins
  (OpenVLA-style, arXiv:2406.09246).
- ``ActionVocab``: action bins <-> token ids reserved after a text vocabulary.
"""

from ._binning import BinningTokenizer
from ._vocab import ActionVocab

__all__ = ["ActionVocab", "BinningTokenizer"]
__version__ = "0.1.0"
