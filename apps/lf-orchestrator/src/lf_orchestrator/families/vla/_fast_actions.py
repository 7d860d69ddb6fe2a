"""FAST action tokens for the token VLA (``action_tokenizer.kind = "fast"``), trained and decoded as pi0-FAST does.

pi0-FAST: Pertsch et al. 2025, "FAST: Efficient Action Tokenization for Vision-Language-Action Models",
arXiv:2501.09747 (sec. 4, 5); the tokenizer is :class:`lf_tokenize_action.FastTokenizer`.

Fitting (fresh runs): the action chunk ``(H, A)`` of every training sample (what the trainer will see, steps past
an episode's end included) is normalized with the bounds binning uses (``action_tokenizer.bounds`` of
``meta/stats.json``), DCT'd, scaled by ``action_tokenizer.scale``, rounded and BPE-trained to
``action_tokenizer.vocab_size`` ids. ``max_action_tokens`` ``M`` is the longest encoding of those chunks, or the
config's value, which no training chunk may exceed (ConfigError naming the field and how many exceed it: a
truncated FAST sequence decodes to nothing, and dropping samples would change the data order).

Vocabulary (:class:`lf_tokenize_action.ActionVocab` over ``V + 1`` action ids after the ``T`` text ids): FAST
id ``k`` is model id ``T + k``; the end-of-action token (EOS) is ``T + V``, the last action id. The ``vla``
recipe gets ``n_action_bins = V + 1`` and ``action_tokens = M + 1``.

Targets of :meth:`FastBatchEncoder.collate`, for a chunk with FAST ids ``t_1 .. t_L`` (``L <= M``), as model ids:

- ``labels`` int64 (n, M + 1): ``t_1 .. t_L, EOS`` then ``IGNORE_INDEX`` (-100): the loss covers real tokens
  and EOS only;
- ``action_in_ids`` int64 (n, M): the labels shifted right (teacher forcing) with EOS in the padding; the
  padding positions only feed positions whose labels are ignored (causal attention).

A FAST token mixes all steps of its chunk (DCT), so steps past the episode end (the dataset repeats the last
action) cannot be masked per step as binning does: the repeated action is the target there (LeRobot / openpi).

Decoding (:meth:`FastBatchEncoder.decode_actions`): the ids before a row's first EOS are FAST-decoded; a row
that does not give a valid chunk (no EOS within ``M + 1`` tokens, BPE pieces that do not make ``H * A``
coefficients) becomes a chunk of zero actions in action units (no motion for Meta-World's end-effector deltas),
and is counted in ``decode_counts``. openpi's pi0-FAST instead decodes zeros in normalized space (the middle of
the action bounds), which is not a neutral action when the bounds are asymmetric (e.g. a gripper in [0, 1]).

Run folder: ``action_tokenizer.json`` (the FastTokenizer JSON) and ``action_tokens.json`` (format
``lf-orchestrator/fast-actions`` version 1: ``max_action_tokens``), both written atomically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from lf_data import IGNORE_INDEX, LeRobotDataset, VLABatchEncoder
from lf_orchestrator.checkpoint import write_text_atomic
from lf_orchestrator.config import Config, ConfigError
from lf_tokenize_action import ActionVocab, BinningTokenizer, FastTokenizer

LAYOUT_FILE = "action_tokens.json"
"""Run-folder file with the FAST target layout (``max_action_tokens``)."""
LAYOUT_FORMAT, LAYOUT_VERSION = "lf-orchestrator/fast-actions", 1


class FastBatchEncoder(VLABatchEncoder):
    """:class:`lf_data.VLABatchEncoder` with FAST action tokens and an end-of-action token (module docstring).

    Observations (image, instruction, state) are encoded as for binning; ``collate`` gives ``action_in_ids``
    (n, M) and ``labels`` (n, M + 1) with ``M = max_action_tokens``.

    Args:
        instruction_tokenizer: word-level tokenizer of the instructions ([PAD] = 0).
        action_tokenizer: fitted FAST tokenizer (``horizon`` H, ``action_dim`` A, ``vocab_size`` V).
        state_mean, state_std: float (state_dim,) dataset statistics.
        max_instruction_len: instruction tokens per sample.
        max_action_tokens: ``M`` >= 1, FAST tokens per chunk before EOS.

    Raises:
        ValueError: ``max_action_tokens < 1`` or mismatched state statistics.
    """

    def __init__(self, instruction_tokenizer: Tokenizer, action_tokenizer: FastTokenizer,
                 state_mean: Sequence[float], state_std: Sequence[float], *, max_instruction_len: int,
                 max_action_tokens: int):
        if isinstance(max_action_tokens, bool) or not isinstance(max_action_tokens, int) or max_action_tokens < 1:
            raise ValueError(f"action_tokenizer.max_action_tokens: expected an integer >= 1, got {max_action_tokens!r}")
        fast = action_tokenizer
        # A binning tokenizer with FAST's bounds: the parent's normalization API (used by the BC baseline).
        bounds = BinningTokenizer(fast.low, fast.high, normalize_mask=fast.normalize_mask)
        super().__init__(instruction_tokenizer, bounds, state_mean, state_std,
                         max_instruction_len=max_instruction_len)
        self.action_bounds = bounds
        """Normalization to [-1, 1] with the tokenizer's bounds (``normalize`` / ``unnormalize``)."""
        self.action_tokenizer = fast
        self.vocab = ActionVocab(instruction_tokenizer.get_vocab_size(), fast.vocab_size + 1)
        self.max_action_tokens = max_action_tokens
        self.eos_id = self.vocab.offset + fast.vocab_size
        """Model id of the end-of-action token (the last action id)."""
        self.decode_counts = {"chunks": 0, "invalid": 0}
        """Chunks decoded by :meth:`decode_actions` and how many of them fell back to zero actions."""

    def action_targets(self, actions: Any) -> dict[str, torch.Tensor]:
        """``action_in_ids`` int64 (n, M) and ``labels`` int64 (n, M + 1) of chunks (n, H, A) in action units.

        Raises:
            ValueError: a chunk encodes to more than ``max_action_tokens`` FAST tokens (names the field).
        """
        tokens = self.action_tokenizer.encode(actions)
        m, n = self.max_action_tokens, len(tokens)
        labels = np.full((n, m + 1), IGNORE_INDEX, dtype=np.int64)
        inputs = np.full((n, m + 1), self.eos_id, dtype=np.int64)
        for r, seq in enumerate(tokens):
            if len(seq) > m:
                raise ValueError(f"action_tokenizer.max_action_tokens: chunk {r} of the batch encodes to {len(seq)} "
                                 f"FAST tokens, more than max_action_tokens={m} fixed when the run was fitted")
            ids = self.vocab.to_token_ids(np.asarray(seq, dtype=np.int64)) if seq else np.zeros(0, np.int64)
            labels[r, :len(seq)] = inputs[r, :len(seq)] = ids
            labels[r, len(seq)] = self.eos_id
        return {"action_in_ids": torch.from_numpy(inputs[:, :m]), "labels": torch.from_numpy(labels)}

    def collate(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        """Stack and encode samples from ``LeRobotDataset`` into training tensors (module docstring)."""
        images = np.stack([np.asarray(s["image"]) for s in samples])
        states = np.stack([np.asarray(s["state"]) for s in samples])
        batch = self.observation(images, states, [s["task"] for s in samples])
        batch.update(self.action_targets(np.stack([np.asarray(s["actions"]) for s in samples])))
        return batch

    def decode_actions(self, token_ids: torch.Tensor) -> np.ndarray:
        """Generated ids (n, <= M + 1) -> actions float64 (n, H, A) in action units; invalid rows are zeros.

        A row's ids before its first EOS are FAST-decoded; a row without EOS, or whose ids do not decode to
        ``H * A`` coefficients, gives zero actions and counts in ``decode_counts["invalid"]``.
        """
        ids = token_ids.detach().cpu().numpy().astype(np.int64)
        rows = []
        for row in ids:
            ends = np.flatnonzero(row == self.eos_id)
            rows.append(row[:ends[0]] - self.vocab.offset if ends.size else np.zeros(0, np.int64))
        actions, failed = self.action_tokenizer.decode(rows, on_error="mask")
        actions[failed] = 0.0
        self.decode_counts["chunks"] += len(rows)
        self.decode_counts["invalid"] += int(failed.sum())
        return actions

    def save_layout(self, run_dir: Path) -> None:
        """Write ``action_tokens.json`` (``max_action_tokens``) into ``run_dir`` atomically."""
        write_text_atomic(Path(run_dir) / LAYOUT_FILE, json.dumps(
            {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "max_action_tokens": self.max_action_tokens,
             "eos_id": self.eos_id}))


def training_chunks(dataset: LeRobotDataset) -> np.ndarray:
    """Every sample's action chunk float64 (len(dataset), H, A), as the trainer draws them (padding included)."""
    return np.stack([np.asarray(dataset[i]["actions"], dtype=np.float64) for i in range(len(dataset))])


def fit_fast_encoder(cfg: Config, dataset: LeRobotDataset, instruction_tokenizer: Tokenizer,
                     action_stats: Mapping[str, Sequence[float]], state_mean: Sequence[float],
                     state_std: Sequence[float]) -> FastBatchEncoder:
    """Fit FAST on ``dataset``'s training chunks and fix ``max_action_tokens`` (module docstring).

    Raises:
        ConfigError: the scale needs more ids than ``action_tokenizer.vocab_size``, or training chunks encode
            longer than a set ``action_tokenizer.max_action_tokens`` (how many, and the longest).
    """
    tok = cfg.action_tokenizer
    chunks = training_chunks(dataset)
    try:
        fast = FastTokenizer.fit(chunks, scale=tok.scale, vocab_size=tok.vocab_size, stats=action_stats,
                                 bounds=tok.bounds)
    except ValueError as err:
        raise ConfigError(f"action_tokenizer.vocab_size / action_tokenizer.scale: {err}") from None
    lengths = np.array([len(seq) for seq in fast.encode(chunks)])
    longest = int(lengths.max())
    limit = tok.max_action_tokens or longest
    over = int((lengths > limit).sum())
    if over:
        raise ConfigError(f"action_tokenizer.max_action_tokens: {over} of {len(lengths)} training chunks encode to "
                          f"more than {limit} FAST tokens (the longest: {longest}); raise it, or set 0 to take "
                          "the longest")
    return FastBatchEncoder(instruction_tokenizer, fast, state_mean, state_std,
                            max_instruction_len=cfg.data.max_instruction_len, max_action_tokens=limit)


def load_fast_encoder(cfg: Config, run_dir: Path, instruction_tokenizer: Tokenizer,
                      state_mean: Sequence[float], state_std: Sequence[float]) -> FastBatchEncoder:
    """The FAST encoder a run saved, checked against ``cfg``.

    Raises:
        FileNotFoundError: ``action_tokens.json`` is missing.
        ValueError: a file of another format (e.g. a binning ``action_tokenizer.json``), or a tokenizer / layout
            that does not match the config (``data.action_horizon``, ``action_tokenizer.max_action_tokens``),
            or an ``eos_id`` that the run folder's tokenizers do not reproduce; the message names the file and
            the field.
    """
    run_dir = Path(run_dir)
    path = run_dir / LAYOUT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"run folder {run_dir}: missing {LAYOUT_FILE}")
    fast = FastTokenizer.load(run_dir / "action_tokenizer.json")
    layout = json.loads(path.read_text())
    if not isinstance(layout, dict) or layout.get("format") != LAYOUT_FORMAT \
            or layout.get("version") != LAYOUT_VERSION:
        raise ValueError(f"{path}: expected format {LAYOUT_FORMAT!r} version {LAYOUT_VERSION}, got "
                         f"{layout.get('format') if isinstance(layout, dict) else layout!r}")
    m = layout.get("max_action_tokens")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"{path}: field 'max_action_tokens' must be an integer >= 1, got {m!r}")
    if cfg.action_tokenizer.max_action_tokens not in (0, m):
        raise ValueError(f"{path}: max_action_tokens={m} but the config sets action_tokenizer.max_action_tokens="
                         f"{cfg.action_tokenizer.max_action_tokens}")
    if fast.horizon != cfg.data.action_horizon:
        raise ValueError(f"{run_dir / 'action_tokenizer.json'}: horizon={fast.horizon} but the config sets "
                         f"data.action_horizon={cfg.data.action_horizon}")
    enc = FastBatchEncoder(instruction_tokenizer, fast, state_mean, state_std,
                           max_instruction_len=cfg.data.max_instruction_len, max_action_tokens=m)
    saved_eos = layout.get("eos_id")
    if saved_eos != enc.eos_id:  # the model's vocabulary was laid out around the saved id
        raise ValueError(f"{path}: field 'eos_id' is {saved_eos!r} but the run folder's instruction and action "
                         f"tokenizers give {enc.eos_id} (instruction vocab {instruction_tokenizer.get_vocab_size()}"
                         f" + FAST vocab {fast.vocab_size}); the tokenizer files do not belong to this checkpoint")
    return enc
