"""LoongForge data: Meta-World demos, LeRobot v3.0, RLDS/Open X-Embodiment and RLBench readers, tokenizer, sampler.

Names are imported on first use (PEP 562), so ``import lf_data`` stays light and
data-generation worker processes do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.2.0"

_WHERE = {
    "CODEBASE_VERSION": "lerobot",
    "LeRobotDataset": "lerobot",
    "compute_stats": "lerobot",
    "write_lerobot_v3": "lerobot",
    "METAWORLD_INSTRUCTIONS": "metaworld",
    "MetaWorldEnv": "metaworld",
    "generate_metaworld": "metaworld",
    "metaworld_episode_seed": "metaworld",
    "ResumableSampler": "sampler",
    "build_instruction_tokenizer": "text",
    "encode_instructions": "text",
    "VLABatchEncoder": "_vla_batch",
    "IGNORE_INDEX": "_vla_batch",
    "DataError": "_errors",
    "RLDSDataset": "rlds",
    "iter_tfrecord": "rlds",
    "parse_example": "rlds",
    "RLBenchDataset": "rlbench",
}

__all__ = [
    "CODEBASE_VERSION",
    "DataError",
    "IGNORE_INDEX",
    "RLBenchDataset",
    "RLDSDataset",
    "VLABatchEncoder",
    "METAWORLD_INSTRUCTIONS",
    "LeRobotDataset",
    "MetaWorldEnv",
    "ResumableSampler",
    "build_instruction_tokenizer",
    "compute_stats",
    "encode_instructions",
    "generate_metaworld",
    "iter_tfrecord",
    "metaworld_episode_seed",
    "parse_example",
    "write_lerobot_v3",
]

if TYPE_CHECKING:
    from ._errors import DataError
    from ._vla_batch import IGNORE_INDEX, VLABatchEncoder
    from .lerobot import CODEBASE_VERSION, LeRobotDataset, compute_stats, write_lerobot_v3
    from .metaworld import METAWORLD_INSTRUCTIONS, MetaWorldEnv, generate_metaworld, metaworld_episode_seed
    from .rlbench import RLBenchDataset
    from .rlds import RLDSDataset, iter_tfrecord, parse_example
    from .sampler import ResumableSampler
    from .text import build_instruction_tokenizer, encode_instructions


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lf_data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
