"""RLBench stored demonstrations without rlbench: allow-listed unpickler, depth and mask decoding.

See the package README for the layout and the state/action convention.
"""

from ._errors import DataError
from ._rlbench import DEPTH_SCALE, RLBenchDataset, decode_depth, decode_mask
from ._safe_pickle import SafeUnpickler, safe_load

__all__ = ["DEPTH_SCALE", "DataError", "RLBenchDataset", "SafeUnpickler", "decode_depth", "decode_mask", "safe_load"]
