"""The family protocol: what the trainer needs from a model family, and nothing more.

A family turns one run config into

- the data: :meth:`Family.prepare` builds caches (rank 0 first, then the others
  load them), :attr:`Family.num_samples` training samples addressed by index;
- the model: :meth:`Family.build_model` (recipe / size / overrides, built on the
  meta device, materialized with lf-ir's deterministic init);
- batches: :meth:`Family.collate` of dataset indices (plus per-sample seeds for
  any randomness, so a sample draws the same noise however the step is split);
- the loss: :meth:`Family.loss_sum` returns the loss *summed* over the batch's
  target units and :meth:`Family.normalizer` counts those units, so the trainer
  divides by the global count over micro-batches and ranks;
- optionally :meth:`Family.evaluate` (held-out metrics, every rank), :meth:`Family.after_training` (what the
  run driver does on rank 0 once training ends, e.g. the VLA's closed-loop evaluation) and files for
  ``lf sample``;
- optionally context parallelism (:attr:`Family.context_parallel`): ``loss_sum`` and ``evaluate`` then take
  ``cp=`` (an ``lf_parallel.ContextParallel``) and return this cp rank's share of the loss, the shares of the
  cp ranks summing to the whole (:mod:`lf_orchestrator.families._context`).

Legend: batches are dicts of tensors, dim 0 = sample.
"""

from __future__ import annotations

import abc
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lf_orchestrator.families.recipes import build_model, recipe_config


def sample_seed(run_seed: int, step: int, index: int) -> int:
    """A 31-bit seed per (run seed, step, dataset index): the same sample draws the same noise at a step
    under any micro-batch split or data-parallel layout, and a resumed run draws it again."""
    return zlib.crc32(f"{run_seed}:{step}:{index}".encode()) & 0x7FFFFFFF


class Family(abc.ABC):
    """One model family under the trainer (see the module docstring)."""

    name: str = ""
    """Family name (``llm``, ``vlm``, ``video``)."""
    loss_label: str = "loss"
    """What ``train/loss`` is (for plots), e.g. ``"next-token cross-entropy"``."""
    context_parallel: bool = False
    """Whether ``loss_sum`` / ``evaluate`` take ``cp=`` and return this cp rank's share (plans with cp > 1)."""
    recompute_key_padding: frozenset[str] = frozenset()
    """Components whose transformer blocks take a (batch, seq) key-padding mask (a checkpointed block keeps it;
    ``memory.recompute = "auto"`` counts it)."""
    data_progress = None
    """``progress(done, total)`` of a data generation in :meth:`prepare` (rank 0), set by the trainer; or None."""
    host_keys: tuple[str, ...] = ()
    """Batch keys that stay on the host when a micro-batch moves to the device: small index tensors the model
    reads on the host (e.g. image grids), which on the GPU would cost a host-device sync at every read."""

    def to_device(self, batch: dict[str, torch.Tensor], device: torch.device,
                  non_blocking: bool = False) -> dict[str, torch.Tensor]:
        """``batch`` on ``device``, except the :attr:`host_keys`, which stay where they are."""
        return {k: v if k in self.host_keys else v.to(device, non_blocking=non_blocking) for k, v in batch.items()}

    def __init__(self, cfg, run_dir: Path, ctx):
        self.cfg, self.run_dir, self.ctx = cfg, Path(run_dir), ctx
        m = cfg.model
        self.recipe_cfg, self.graph = recipe_config(m.recipe, m.size, m.overrides)

    @abc.abstractmethod
    def prepare(self) -> None:
        """Build or load the data caches and whatever the run folder needs; idempotent."""

    @property
    @abc.abstractmethod
    def num_samples(self) -> int:
        """Training samples (indices ``0 .. num_samples - 1``)."""

    @property
    @abc.abstractmethod
    def seq_len(self) -> int:
        """Tokens per sample of the main component (for the plan search and throughput)."""

    def build_model(self, device: torch.device) -> nn.Module:
        """The lowered recipe model on ``device`` (seeded by ``run.seed``; fused ops per ``model.fused_ops``)."""
        return build_model(self.cfg.model.recipe, self.recipe_cfg, self.graph, device, self.cfg.run.seed,
                           fused_ops=self.cfg.model.fused_ops)

    @abc.abstractmethod
    def collate(self, indices: list[int], step: int) -> dict[str, torch.Tensor]:
        """The batch of the given training indices at optimizer step ``step`` (CPU tensors)."""

    @abc.abstractmethod
    def normalizer(self, batch: dict[str, torch.Tensor]) -> int:
        """Target units in ``batch`` (tokens with a label, or samples)."""

    @abc.abstractmethod
    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss summed over the target units as a float32 scalar, {metric: sum over the same units})."""

    pipeline_model = None
    """Pipeline parallel of a multi-component model: ``() -> model`` building the whole recipe model (with lf-ir's
    pipeline glue ``embed_inputs`` / ``trunk_blocks`` / ``trunk_head``) on the meta device; None: the one-trunk
    build from :attr:`graph` (token ids in, logits out: the llm family)."""

    def pipeline_inputs(self, batch: dict[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """(the first pipeline stage's inputs, the loss target) of a batch, each with the sample on dim 0.

        Raises:
            NotImplementedError: the family does not run under pipeline parallel (plans are refused before).
        """
        raise NotImplementedError(f"the {self.name} family has no pipeline-parallel inputs")

    def pipeline_loss_sum(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of a micro-batch, summed over its target units (float32 scalar): by default
        the cross-entropy of logits ``output`` (batch, seq, vocab) against labels ``target`` (batch, seq) int64,
        -100 ignored."""
        return F.cross_entropy(output.flatten(0, 1).float(), target.flatten(), reduction="sum", ignore_index=-100)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Held-out metrics (``eval/...``); none by default."""
        return {}

    def after_training(self, run_dir: Path, device: torch.device, console) -> None:
        """Called by the run driver on rank 0 after a run that was not preempted and whose summary is written
        (e.g. closed-loop evaluation from the saved checkpoint); nothing by default."""
        return None


class LossModule(nn.Module):
    """``forward(batch) = family.loss_sum(model, batch)``, so DDP / FSDP wrap the whole loss computation."""

    def __init__(self, model: nn.Module, family: Family):
        super().__init__()
        self.model = model
        self._family = [family]  # not a submodule
        self.cp = None
        """This rank's ``lf_parallel.ContextParallel`` under a cp > 1 plan (set by the trainer), else None."""

    def forward(self, batch: dict[str, torch.Tensor], evaluate: bool = False):
        """``loss_sum(model, batch)``; with ``evaluate`` the family's held-out metrics instead (run through the
        wrapper so FSDP gathers the root's parameters and DDP / TP hooks apply). Under context parallelism
        (``self.cp``) both get ``cp=`` and compute this rank's share."""
        family, kw = self._family[0], ({} if self.cp is None else {"cp": self.cp})
        if evaluate:
            return family.evaluate(self.model, **kw)
        return family.loss_sum(self.model, batch, **kw)
