"""LeRobot v3.0 datasets: writer, in-memory reader with action chunks, statistics.

Layout and field names follow huggingface/lerobot (``CODEBASE_VERSION = "v3.0"``);
see the package README for where this implementation differs.
"""

from ._lerobot_format import CODEBASE_VERSION
from ._lerobot_reader import DEFAULT_PRELOAD_MAX_BYTES, LeRobotDataset
from ._lerobot_writer import write_lerobot_v3
from ._stats import compute_stats

__all__ = ["CODEBASE_VERSION", "DEFAULT_PRELOAD_MAX_BYTES", "LeRobotDataset", "compute_stats", "write_lerobot_v3"]
