"""Batches for the flow-matching VLA (``model.recipe = "vla_flow"``): continuous, normalized action chunks.

Observations are encoded exactly as for the token VLA (uint8 image, padded
instruction ids, state standardized by the dataset mean/std). Actions are
standardized per dimension by the dataset's mean and std, ``(a - mean) / std``,
the normalization pi0 uses (openpi's z-score ``Normalize``; quantile bounds are
its choice for pi0-FAST's tokens), and decoded back with ``x * std + mean``.

Output of :meth:`FlowBatchEncoder.collate` for ``n`` samples (horizon ``H``, action dims ``A``):
``image`` uint8 (n, height, width, 3); ``instruction_ids`` int64 / ``instruction_mask`` bool
(n, max_instruction_len); ``state`` float32 (n, state_dim); ``actions`` float32 (n, H, A)
normalized; ``action_mask`` bool (n, H), True where the step is real (not past the episode end).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from lf_data import encode_instructions
from lf_orchestrator.checkpoint import write_text_atomic

STD_FLOOR = 1e-6
"""Standard deviations below this are taken as 1 (constant features)."""


def _std(values: Sequence[float]) -> np.ndarray:
    std = np.asarray(values, dtype=np.float32)
    return np.where(std < STD_FLOOR, 1.0, std).astype(np.float32)


class FlowBatchEncoder:
    """Encodes samples {image, state, actions, action_is_pad, task} into vla_flow tensors (module docstring).

    Args:
        instruction_tokenizer: word-level tokenizer of the instructions ([PAD] = 0).
        state_mean, state_std: (state_dim,) dataset statistics.
        action_mean, action_std: (action_dim,) dataset statistics.
        max_instruction_len: instruction tokens per sample.

    Raises:
        ValueError: mean and std of different shapes.
    """

    def __init__(self, instruction_tokenizer: Tokenizer, state_mean: Sequence[float], state_std: Sequence[float],
                 action_mean: Sequence[float], action_std: Sequence[float], *, max_instruction_len: int):
        self.instruction_tokenizer = instruction_tokenizer
        self.state_mean, self.state_std = np.asarray(state_mean, dtype=np.float32), _std(state_std)
        self.action_mean, self.action_std = np.asarray(action_mean, dtype=np.float32), _std(action_std)
        for name, mean, std in (("state", self.state_mean, self.state_std),
                                ("action", self.action_mean, self.action_std)):
            if mean.shape != std.shape or mean.ndim != 1:
                raise ValueError(f"{name}_mean {mean.shape} and {name}_std {std.shape} must be equal 1-D shapes")
        self.max_instruction_len = max_instruction_len
        self._instruction_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def text_vocab_size(self) -> int:
        return self.instruction_tokenizer.get_vocab_size()

    @property
    def action_dim(self) -> int:
        return int(self.action_mean.shape[0])

    def _instructions(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._instruction_cache]
        if missing:
            ids, mask = encode_instructions(self.instruction_tokenizer, missing, self.max_instruction_len)
            self._instruction_cache.update({t: (i, m) for t, i, m in zip(missing, ids, mask, strict=True)})
        ids = np.stack([self._instruction_cache[t][0] for t in texts])
        mask = np.stack([self._instruction_cache[t][1] for t in texts])
        return torch.from_numpy(ids).long(), torch.from_numpy(mask).bool()

    def observation(self, images: np.ndarray, states: np.ndarray, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Model inputs for acting: images uint8 (n, H, W, 3), states (n, state_dim), instruction texts.

        Raises:
            ValueError: states with another feature count than the statistics.
        """
        states = np.asarray(states, dtype=np.float32)
        if states.shape[-1] != self.state_mean.shape[0]:
            raise ValueError(f"state: expected {self.state_mean.shape[0]} features, got {states.shape[-1]}")
        ids, mask = self._instructions(texts)
        return {"image": torch.as_tensor(np.ascontiguousarray(images), dtype=torch.uint8),
                "instruction_ids": ids, "instruction_mask": mask,
                "state": torch.from_numpy((states - self.state_mean) / self.state_std)}

    def collate(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack and encode samples from ``LeRobotDataset`` into training tensors (module docstring)."""
        images = np.stack([np.asarray(s["image"]) for s in samples])
        states = np.stack([np.asarray(s["state"]) for s in samples])
        batch = self.observation(images, states, [s["task"] for s in samples])
        actions = np.stack([np.asarray(s["actions"], dtype=np.float32) for s in samples])  # (n, H, A)
        if actions.shape[-1] != self.action_dim:
            raise ValueError(f"actions: expected {self.action_dim} dimensions, got {actions.shape[-1]}")
        batch["actions"] = torch.from_numpy((actions - self.action_mean) / self.action_std)
        batch["action_mask"] = ~torch.from_numpy(np.stack([np.asarray(s["action_is_pad"]) for s in samples]))
        return batch

    def decode_actions(self, normalized: torch.Tensor) -> np.ndarray:
        """Normalized chunks (n, H, A) -> actions float64 (n, H, A) in action units."""
        x = normalized.detach().float().cpu().numpy().astype(np.float64)
        return x * self.action_std + self.action_mean

    def save(self, run_dir: Path) -> None:
        """Write ``instruction_tokenizer.json`` and ``normalization.json`` (state and action mean/std)."""
        run_dir = Path(run_dir)
        write_text_atomic(run_dir / "instruction_tokenizer.json", self.instruction_tokenizer.to_str())
        write_text_atomic(run_dir / "normalization.json", json.dumps({
            "state_mean": self.state_mean.tolist(), "state_std": self.state_std.tolist(),
            "action_mean": self.action_mean.tolist(), "action_std": self.action_std.tolist()}))

    @classmethod
    def load(cls, run_dir: Path, max_instruction_len: int) -> FlowBatchEncoder:
        """The encoder a run saved (FileNotFoundError naming the missing file, KeyError-free ValueError)."""
        run_dir = Path(run_dir)
        for name in ("instruction_tokenizer.json", "normalization.json"):
            if not (run_dir / name).is_file():
                raise FileNotFoundError(f"run folder {run_dir}: missing {name}")
        norm = json.loads((run_dir / "normalization.json").read_text())
        if "action_mean" not in norm:
            raise ValueError(f"run folder {run_dir}: normalization.json has no action statistics "
                             f"(a token-VLA run cannot be read as a vla_flow run)")
        return cls(Tokenizer.from_file(str(run_dir / "instruction_tokenizer.json")), norm["state_mean"],
                   norm["state_std"], norm["action_mean"], norm["action_std"], max_instruction_len=max_instruction_len)
