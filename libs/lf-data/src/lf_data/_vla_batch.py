"""Turn robot samples into the token tensors a VLA trains on.

One :class:`VLABatchEncoder` holds everything that maps raw modalities to model
inputs: the instruction tokenizer (HF ``tokenizers``), the action tokenizer and
vocabulary mapping (lf-tokenize-action) and the state normalization. The same
object is saved in the run folder and reused for closed-loop evaluation, so
training and acting encode identically.

Output of :meth:`VLABatchEncoder.collate` for ``n`` samples (horizon ``H``,
action dims ``A``, ``T = H * A`` action tokens):

- ``image`` uint8 (n, height, width, 3)
- ``instruction_ids`` int64 (n, max_instruction_len), ``instruction_mask`` bool
- ``state`` float32 (n, state_dim), (state - mean) / std
- ``action_in_ids`` int64 (n, T - 1): action tokens shifted right (teacher forcing)
- ``labels`` int64 (n, T): action token ids, ``IGNORE_INDEX`` where the step is padding
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from lf_data.text import encode_instructions
from lf_tokenize_action import ActionVocab, BinningTokenizer

IGNORE_INDEX = -100
"""Label value that the loss ignores (PyTorch's cross_entropy default)."""


class VLABatchEncoder:
    """Encodes samples {image, state, actions, action_is_pad, task} into VLA tensors.

    Args:
        instruction_tokenizer: word-level tokenizer of the instructions ([PAD] = 0).
        action_tokenizer: fitted binning tokenizer, action_dim = A.
        state_mean, state_std: float arrays (state_dim,) from dataset statistics;
            std below 1e-6 is treated as 1 (constant features).
        max_instruction_len: instruction tokens per sample.
    """

    def __init__(self, instruction_tokenizer: Tokenizer, action_tokenizer: BinningTokenizer,
                 state_mean: Sequence[float], state_std: Sequence[float], *,
                 max_instruction_len: int):
        self.instruction_tokenizer = instruction_tokenizer
        self.action_tokenizer = action_tokenizer
        self.vocab = ActionVocab(instruction_tokenizer.get_vocab_size(), action_tokenizer.n_bins)
        self.state_mean = np.asarray(state_mean, dtype=np.float32)
        std = np.asarray(state_std, dtype=np.float32)
        self.state_std = np.where(std < 1e-6, 1.0, std).astype(np.float32)
        if self.state_mean.shape != self.state_std.shape:
            raise ValueError(f"state_mean {self.state_mean.shape} and state_std "
                             f"{self.state_std.shape} differ in shape")
        self.max_instruction_len = max_instruction_len
        self._instruction_cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def text_vocab_size(self) -> int:
        return self.vocab.offset

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """(…, state_dim) float -> float32 standardized by the dataset statistics."""
        state = np.asarray(state, dtype=np.float32)
        if state.shape[-1] != self.state_mean.shape[0]:
            raise ValueError(f"state: expected {self.state_mean.shape[0]} features, got "
                             f"{state.shape[-1]}")
        return (state - self.state_mean) / self.state_std

    def instructions(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Instruction ids (n, max_instruction_len) int64 and mask bool, cached per text."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._instruction_cache]
        if missing:
            ids, mask = encode_instructions(self.instruction_tokenizer, missing,
                                            self.max_instruction_len)
            for t, i, m in zip(missing, ids, mask, strict=True):
                self._instruction_cache[t] = (i, m)
        ids = np.stack([self._instruction_cache[t][0] for t in texts])
        mask = np.stack([self._instruction_cache[t][1] for t in texts])
        return torch.from_numpy(ids).long(), torch.from_numpy(mask).bool()

    def observation(self, images: np.ndarray, states: np.ndarray,
                    texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Model inputs for acting: images uint8 (n, H, W, 3), states (n, state_dim)."""
        ids, mask = self.instructions(texts)
        return {"image": torch.as_tensor(np.ascontiguousarray(images), dtype=torch.uint8),
                "instruction_ids": ids, "instruction_mask": mask,
                "state": torch.from_numpy(self.normalize_state(states))}

    def collate(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack and encode samples from ``LeRobotDataset`` into training tensors."""
        images = np.stack([np.asarray(s["image"]) for s in samples])
        states = np.stack([np.asarray(s["state"]) for s in samples])
        batch = self.observation(images, states, [s["task"] for s in samples])
        actions = np.stack([np.asarray(s["actions"]) for s in samples])  # (n, H, A)
        is_pad = np.stack([np.asarray(s["action_is_pad"]) for s in samples])  # (n, H)
        tokens = torch.from_numpy(self.vocab.to_token_ids(self.action_tokenizer.encode(actions)))
        tokens = tokens.reshape(len(samples), -1).long()  # (n, H*A), time-major
        labels = tokens.clone()
        pad = torch.from_numpy(np.repeat(is_pad, actions.shape[-1], axis=1))
        labels[pad] = IGNORE_INDEX
        batch["action_in_ids"] = tokens[:, :-1]
        batch["labels"] = labels
        return batch

    def decode_actions(self, token_ids: torch.Tensor) -> np.ndarray:
        """Generated action tokens (n, H*A) -> actions float64 (n, H, A) in action units."""
        bins = self.vocab.to_bins(token_ids.cpu().numpy())
        n, a = bins.shape[0], self.action_tokenizer.action_dim
        return self.action_tokenizer.decode(bins.reshape(n, -1, a))
