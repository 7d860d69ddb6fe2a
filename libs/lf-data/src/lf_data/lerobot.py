"""LeRobot v3.0 datasets: writer, in-memory reader with action chunks, statistics.

Layout and field names follow huggingface/lerobot (``CODEBASE_VERSION = "v3.0"``);
see the package README for where this implementation differs.

For tools that write the files themselves (a benchmark's generator of large datasets): the layout's paths
(:data:`INFO_PATH`, :data:`DATA_PATH`, :data:`EPISODES_PATH`, :data:`TASKS_PATH`, :data:`STATS_PATH`) and sizes
(:data:`DEFAULT_CHUNK_SIZE`, :data:`DEFAULT_DATA_FILE_SIZE_IN_MB`, :data:`DEFAULT_VIDEO_FILE_SIZE_IN_MB`),
the columns every frame has (:data:`DEFAULT_FEATURES`), the image column's type (:data:`IMAGE_STRUCT`),
:func:`arrow_type`, :func:`hf_features_metadata` and :func:`tasks_table`.
"""

from ._lerobot_format import (
    CODEBASE_VERSION,
    DATA_PATH,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_DATA_FILE_SIZE_IN_MB,
    DEFAULT_FEATURES,
    DEFAULT_VIDEO_FILE_SIZE_IN_MB,
    EPISODES_PATH,
    IMAGE_STRUCT,
    INFO_PATH,
    STATS_PATH,
    TASKS_PATH,
    arrow_type,
    hf_features_metadata,
    tasks_table,
)
from ._lerobot_reader import DEFAULT_PRELOAD_MAX_BYTES, LeRobotDataset
from ._lerobot_writer import write_lerobot_v3
from ._stats import compute_stats

__all__ = ["CODEBASE_VERSION", "DEFAULT_PRELOAD_MAX_BYTES", "LeRobotDataset", "compute_stats", "write_lerobot_v3",
           "DATA_PATH", "DEFAULT_CHUNK_SIZE", "DEFAULT_FEATURES", "EPISODES_PATH", "IMAGE_STRUCT", "STATS_PATH",
           "TASKS_PATH", "INFO_PATH", "DEFAULT_DATA_FILE_SIZE_IN_MB", "DEFAULT_VIDEO_FILE_SIZE_IN_MB",
           "arrow_type", "hf_features_metadata", "tasks_table"]
