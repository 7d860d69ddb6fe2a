"""TFDS metadata of an RLDS dataset: ``features.json``, ``dataset_info.json``, shard paths.

TFDS (tensorflow/datasets ``core/features``) stores an RLDS episode as one
``tf.train.Example``: the nested ``FeaturesDict`` is flattened with ``/``
(``steps/observation/image``, ``steps/action/world_vector``,
``episode_metadata/file_path``) and the ``steps`` ``Dataset`` feature (a
``Sequence``) stacks each step feature along a new first axis, flattened into
one list: ``Tensor`` floats -> ``float_list`` (float64 too, stored as float32),
ints and bools -> ``int64_list``, strings / ``Text`` / encoded ``Image`` ->
``bytes_list`` with one entry per step. Tensors with ``encoding`` other than
``"none"`` (``"bytes"``, ``"zlib"``) are not supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._errors import DataError

__all__ = ["FeatureSpec", "flatten_features", "load_json", "shard_paths", "decode_steps"]

DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


@dataclass(frozen=True)
class FeatureSpec:
    """One leaf feature: ``kind`` in tensor/image/text, per-step ``shape``, numpy ``dtype`` name."""

    kind: str
    shape: tuple[int, ...]
    dtype: str
    encoding: str = "none"
    image_format: str | None = None


def load_json(path: Path) -> dict:
    """Parse a JSON metadata file; errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"RLDS dataset file missing: {path}")
    head = path.read_bytes()
    if head.startswith(b"version https://git-lfs.github.com/spec/v1"):
        raise DataError(f"{path}: is a Git LFS pointer file, not JSON", file=path, reason="lfs_pointer")
    try:
        return json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e


def _shape(node: dict) -> tuple[int, ...]:
    return tuple(int(d) for d in node.get("shape", {}).get("dimensions", []))


def flatten_features(node: dict, prefix: str = "", *, where: str = "features.json") -> dict[str, FeatureSpec]:
    """``{"steps/observation/image": FeatureSpec, ...}`` from a TFDS feature JSON node.

    Leaves inside ``steps`` keep their per-step shape. Nested sequences inside
    steps (ragged in TFDS) are left out: the reader never needs them.
    """
    out: dict[str, FeatureSpec] = {}
    if "featuresDict" in node:
        for key, child in node["featuresDict"].get("features", {}).items():
            out.update(flatten_features(child, f"{prefix}{key}/", where=where))
    elif "sequence" in node:
        if prefix.startswith("steps/") and prefix != "steps/":
            return out
        out.update(flatten_features(node["sequence"]["feature"], prefix, where=where))
    elif "image" in node:
        img = node["image"]
        out[prefix[:-1]] = FeatureSpec("image", _shape(img), img.get("dtype", "uint8"),
                                       image_format=img.get("encodingFormat"))
    elif "text" in node:
        out[prefix[:-1]] = FeatureSpec("text", (), "string")
    elif "tensor" in node:
        t = node["tensor"]
        out[prefix[:-1]] = FeatureSpec("tensor", _shape(t), t.get("dtype", "float32"), t.get("encoding", "none"))
    else:
        raise ValueError(f"{where}: feature {prefix[:-1]!r} has an unknown kind (keys {sorted(node)})")
    return out


def shard_paths(root: Path, info: dict, split: str) -> list[tuple[Path, int]]:
    """``[(shard path, declared number of episodes)]`` of ``split`` from ``dataset_info.json``."""
    splits = {s.get("name"): s for s in info.get("splits", [])}
    if split not in splits:
        raise ValueError(f"{root / 'dataset_info.json'}: split {split!r} not found (splits: {sorted(splits)})")
    entry = splits[split]
    lengths = [int(x) for x in entry.get("shardLengths", [])]
    template = entry.get("filepathTemplate") or DEFAULT_TEMPLATE
    name, fmt, n = info.get("name", ""), info.get("fileFormat") or "tfrecord", len(lengths)
    if fmt != "tfrecord":
        raise ValueError(f"{root / 'dataset_info.json'}: fileFormat {fmt!r} is not supported (only 'tfrecord')")
    out = []
    for i, length in enumerate(lengths):
        rel = (template.replace("{DATASET}", name).replace("{SPLIT}", split).replace("{FILEFORMAT}", fmt)
               .replace("{SHARD_X_OF_Y}", f"{i:05d}-of-{n:05d}").replace("{SHARD_INDEX}", f"{i:05d}")
               .replace("{NUM_SHARDS}", f"{n:05d}"))
        out.append((root / rel, length))
    return out


def decode_steps(values, spec: FeatureSpec, num_steps: int, *, key: str, file: Path, episode: int) -> object:
    """Per-step values of one flattened feature: ndarray ``(T, *shape)`` or list of ``T`` bytes."""

    def bad(msg: str) -> DataError:
        return DataError(f"{file}: episode {episode} field {key!r}: {msg}", file=file, episode=episode,
                         field=key, reason="invalid")

    if spec.kind in ("image", "text") or spec.dtype == "string":
        if not isinstance(values, list) or len(values) != num_steps:
            n = len(values) if isinstance(values, list) else f"non-bytes ({type(values).__name__})"
            raise bad(f"expected {num_steps} byte strings (one per step), got {n}")
        return values
    if spec.encoding != "none":
        raise bad(f"Tensor encoding {spec.encoding!r} is not supported (only 'none')")
    if isinstance(values, list):
        if values:
            raise bad("expected a float or int64 list, got bytes")
        values = np.zeros(0, np.float32)
    arr = values
    per_step = int(np.prod(spec.shape)) if spec.shape else 1
    if arr.size != num_steps * per_step:
        raise bad(f"holds {arr.size} values, expected {num_steps} steps x {per_step} = {num_steps * per_step}")
    arr = arr.reshape((num_steps, *spec.shape))
    if spec.dtype == "bool":
        return arr.astype(bool)
    if spec.dtype.startswith("float"):
        return arr.astype(np.float32)
    return arr.astype(np.dtype(spec.dtype))
