"""LeRobot dataset v3.0 layout: paths, default features, arrow types.

Follows huggingface/lerobot ``src/lerobot/datasets/utils.py`` (CODEBASE_VERSION
"v3.0"): ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``,
``meta/episodes/chunk-XXX/file-XXX.parquet`` and
``data/chunk-XXX/file-XXX.parquet``; several episodes per data file.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

CODEBASE_VERSION = "v3.0"
DEFAULT_CHUNK_SIZE = 1000  # max files per chunk folder
DEFAULT_DATA_FILE_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILE_SIZE_IN_MB = 500
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
CHUNK_FILE_PATTERN = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE_PATTERN + ".parquet"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE_PATTERN + ".parquet"

DEFAULT_FEATURES: dict[str, dict] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def is_scalar(ft: dict) -> bool:
    return list(ft["shape"]) == [1]


def arrow_type(ft: dict) -> pa.DataType:
    """Arrow type of one feature column, as HF ``datasets`` writes it for LeRobot."""
    dtype = ft["dtype"]
    if dtype == "image":
        return IMAGE_STRUCT
    if dtype in ("video", "string"):
        raise ValueError(f"feature dtype {dtype!r} is not written to the data parquet by this writer")
    value = pa.from_numpy_dtype(np.dtype(dtype))
    if is_scalar(ft):
        return value
    if len(ft["shape"]) != 1:
        raise ValueError(f"only 1-D non-image features are supported, got shape {ft['shape']}")
    return pa.list_(value, int(ft["shape"][0]))


def hf_features_metadata(features: dict[str, dict]) -> bytes:
    """The ``huggingface`` schema metadata that lets ``datasets`` decode the image column."""
    out = {}
    for key, ft in features.items():
        if ft["dtype"] == "image":
            out[key] = {"_type": "Image"}
        elif is_scalar(ft):
            out[key] = {"dtype": ft["dtype"], "_type": "Value"}
        else:
            out[key] = {
                "feature": {"dtype": ft["dtype"], "_type": "Value"},
                "length": int(ft["shape"][0]),
                "_type": "Sequence",
            }
    return json.dumps({"info": {"features": out}}).encode()


def task_column(table: pa.Table) -> str | None:
    """Name of the task-string column of a ``meta/tasks.parquet`` table, ``None`` when it has none.

    lerobot writes the tasks frame with the strings as its pandas index: named ``task`` (the v2.1 to v3.0
    conversion script, and this writer) or unnamed, stored as ``__index_level_0__`` (``LeRobotDataset``'s
    recording path, ``save_episode_tasks`` in lerobot 0.4).
    """
    if "task" in table.column_names:
        return "task"
    pandas_meta = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
    index = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str) and c in table.column_names]
    return index[0] if len(index) == 1 else None


def tasks_table(tasks: list[str]) -> pa.Table:
    """``meta/tasks.parquet`` as pandas writes LeRobot's frame: column ``task_index``, index ``task``."""
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
             "metadata": {"encoding": "UTF-8"}}
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())],
                       metadata={b"pandas": json.dumps(pandas_meta).encode()})
    return pa.table({"task_index": list(range(len(tasks))), "task": list(tasks)}, schema=schema)
