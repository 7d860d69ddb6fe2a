"""LoongForge data: Meta-World demos, LeRobot v2.1/v3.0 (video), RLDS/OXE and RLBench readers, packing, balancing.

Names are imported on first use (PEP 562), so ``import lf_data`` stays light and
data-generation worker processes do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.5.1"

_WHERE = {
    "TextStream": "_text_readers",
    "iter_text_file": "_text_readers",
    "load_tokenizer": "_text_readers",
    "ImageTextStream": "_image_text",
    "decode_image": "_image_text",
    "ChatTemplate": "_chat_template",
    "parse_conversation": "_chat_template",
    "qwen2_vl_image_tokens": "_chat_template",
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
    "LeRobotStream": "_lerobot_stream",
    "delta_indices": "_lerobot_stream",
    "detect_format": "_lerobot_meta",
    "load_lerobot_meta": "_lerobot_meta",
    "LeRobotMeta": "_lerobot_meta",
    "EpisodeMeta": "_lerobot_meta",
    "read_video_frames": "_video",
    "count_frames": "_video",
    "write_video": "_video",
    "VideoInfo": "_video",
    "write_lerobot_video": "_lerobot_video_writer",
    "PackedBatch": "_packing",
    "pack_sequences": "_packing",
    "iter_packed": "_packing",
    "packed_attention_mask": "_packing",
    "packing_efficiency": "_packing",
    "balance_by_cost": "_balance",
    "sample_costs": "_balance",
    "row_costs": "_balance",
    "cost_coefficients": "_balance",
    "imbalance": "_balance",
    "inspect_dataset": "_inspect",
    "convert_dataset": "_inspect",
    "check_action_stats": "_inspect_checks",
    "quantile_problems": "_inspect_checks",
}

__all__ = [
    "ChatTemplate",
    "CODEBASE_VERSION",
    "DataError",
    "EpisodeMeta",
    "IGNORE_INDEX",
    "ImageTextStream",
    "LeRobotDataset",
    "LeRobotMeta",
    "LeRobotStream",
    "METAWORLD_INSTRUCTIONS",
    "MetaWorldEnv",
    "PackedBatch",
    "ResumableSampler",
    "RLBenchDataset",
    "RLDSDataset",
    "TextStream",
    "VideoInfo",
    "VLABatchEncoder",
    "balance_by_cost",
    "build_instruction_tokenizer",
    "check_action_stats",
    "compute_stats",
    "convert_dataset",
    "cost_coefficients",
    "count_frames",
    "decode_image",
    "delta_indices",
    "detect_format",
    "encode_instructions",
    "generate_metaworld",
    "imbalance",
    "inspect_dataset",
    "iter_packed",
    "iter_text_file",
    "iter_tfrecord",
    "load_lerobot_meta",
    "load_tokenizer",
    "metaworld_episode_seed",
    "pack_sequences",
    "packed_attention_mask",
    "packing_efficiency",
    "parse_conversation",
    "parse_example",
    "quantile_problems",
    "qwen2_vl_image_tokens",
    "read_video_frames",
    "row_costs",
    "sample_costs",
    "write_lerobot_v3",
    "write_lerobot_video",
    "write_video",
]

if TYPE_CHECKING:
    from ._balance import balance_by_cost, cost_coefficients, imbalance, row_costs, sample_costs
    from ._chat_template import ChatTemplate, parse_conversation, qwen2_vl_image_tokens
    from ._errors import DataError
    from ._image_text import ImageTextStream, decode_image
    from ._inspect import convert_dataset, inspect_dataset
    from ._inspect_checks import check_action_stats, quantile_problems
    from ._lerobot_meta import EpisodeMeta, LeRobotMeta, detect_format, load_lerobot_meta
    from ._lerobot_stream import LeRobotStream, delta_indices
    from ._lerobot_video_writer import write_lerobot_video
    from ._packing import PackedBatch, iter_packed, pack_sequences, packed_attention_mask, packing_efficiency
    from ._text_readers import TextStream, iter_text_file, load_tokenizer
    from ._video import VideoInfo, count_frames, read_video_frames, write_video
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
