"""The ``vla`` and ``vla_flow`` families: a vision-language-action policy trained on robot demonstrations.

Data: a LeRobot dataset (``data.source = "lerobot"``) or Meta-World expert demonstrations generated on rank 0
(``data.source = "metaworld"``, :mod:`lf_orchestrator.families._metaworld`); one sample = one frame with its
next ``data.action_horizon`` actions. The batch encoder (:mod:`.assembly`: instruction tokenizer, state / action
normalization and, for ``vla``, the binning or FAST action tokenizer) is fitted on the training data by a fresh
run and written to the run folder; a resumed run and every other rank read it back, so all ranks and every
later evaluation encode alike. The recipe config follows from the run config and the fitted encoder (vocabulary
sizes, state and action dimensions), so :attr:`VLAFamily.graph` exists only after :meth:`VLAFamily.prepare`.

Loss: the recipe model's own ``training_loss`` (``vla``: action-token cross-entropy summed over target tokens,
with the correct tokens as ``token_accuracy``; ``vla_flow``: squared velocity error summed over the real action
values, noise drawn per sample from ``sample_seed`` so any micro-batch split draws the same). Evaluation: closed
loop in Meta-World after training (:meth:`VLAFamily.after_training`, rank 0, :mod:`.evaluate`).
"""

from __future__ import annotations

import torch
from torch import nn

from lf_ir.recipes.vla_flow import sample_seeds
from lf_orchestrator.families._metaworld import open_dataset
from lf_orchestrator.families.base import Family
from lf_orchestrator.families.vla import assembly

_LOSS_LABELS = {"vla": "action-token cross-entropy", "vla_flow": "flow-matching loss (normalized actions)"}


class VLAFamily(Family):
    """A VLA recipe (``vla`` or ``vla_flow``) on robot demonstrations (see the module docstring)."""

    name = "vla"

    def __init__(self, cfg, run_dir, ctx):  # the recipe config needs the fitted encoder: set by prepare()
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        self.loss_label = _LOSS_LABELS[cfg.model.recipe]
        self.recipe_cfg = self.graph = self.dataset = self.encoder = None

    def prepare(self) -> None:
        """Open (rank 0: generate first) the dataset; load the run folder's encoder or fit and write it (rank 0 of
        a fresh run, which runs this before the other ranks); derive the recipe config and graph, and write
        ``model.json``."""
        self.dataset = open_dataset(self.cfg, self.ctx.is_main, action_horizon=self.cfg.data.action_horizon,
                                    progress=self.data_progress)
        if (self.run_dir / "normalization.json").is_file():  # resumed, or written by rank 0 for this run
            self.encoder = assembly.load_encoder(self.cfg, self.run_dir)
        else:
            self.encoder = assembly.build_encoder(self.cfg, self.dataset)
            if self.ctx.is_main:
                assembly.save_encoder(self.encoder, self.run_dir)
        self.recipe_cfg = assembly.model_config(self.cfg, self.encoder)
        self.graph = assembly.build_graph(self.recipe_cfg)
        if self.ctx.is_main:
            assembly.save_model_spec(self.recipe_cfg, self.graph, self.run_dir)

    @property
    def num_samples(self) -> int:
        return len(self.dataset)

    @property
    def seq_len(self) -> int:
        """Tokens per sample of the backbone (image patches, instruction, state, action tokens)."""
        return int(self.recipe_cfg.seq_len)

    recompute_key_padding = frozenset({"backbone"})  # the instruction padding mask

    def build_model(self, device: torch.device) -> nn.Module:
        return assembly.build_model(self.recipe_cfg, device, self.cfg.run.seed, fused_ops=self.cfg.model.fused_ops)

    def collate(self, indices: list[int], step: int) -> dict[str, torch.Tensor]:
        """The encoder's batch of the frames ``indices`` with ``sample_seed`` (n,) int64 per (run seed, step,
        index): flow noise is the same under any micro-batch split or data-parallel layout."""
        batch = self.encoder.collate([self.dataset[i] for i in indices])
        batch["sample_seed"] = sample_seeds(self.cfg.run.seed, step, indices)
        return batch

    def to_device(self, batch, device, non_blocking: bool = False):
        """The batch on ``device`` with its images resized to the model's side (:func:`.assembly.fit_images`)."""
        moved = super().to_device(batch, device, non_blocking)
        return assembly.fit_images(moved, self.recipe_cfg.image_size)

    def normalizer(self, batch: dict[str, torch.Tensor]) -> int:
        """Target units: action tokens with a label (``vla``), real action values (``vla_flow``)."""
        if "labels" in batch:
            return int((batch["labels"] != -100).sum())
        return int(batch["action_mask"].sum()) * int(self.recipe_cfg.action_dim)

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        return model.training_loss(batch)

    @property
    def pipeline_model(self):
        """``() -> model`` on the meta device for the multimodal pipeline (stage 0 runs the encoders), for a recipe
        whose :class:`lf_ir.RecipeSpec` sets ``pipeline`` (``vla``); else None (such plans are refused before)."""
        from lf_ir import recipe_spec

        spec = recipe_spec(self.cfg.model.recipe)
        return (lambda: spec.build_model(self.recipe_cfg, self.graph)) if spec.pipeline else None

    def pipeline_inputs(self, batch):
        """``((image, instruction_ids, instruction_mask, state, action_in_ids), labels)`` of the token VLA."""
        return ((batch["image"], batch["instruction_ids"], batch["instruction_mask"], batch["state"],
                 batch["action_in_ids"]), batch["labels"])

    def after_training(self, run_dir, device: torch.device, console) -> None:
        """Closed-loop success in Meta-World (``eval.at_end``, Meta-World data), printed as a table; rank 0."""
        if not (self.cfg.eval.at_end and self.cfg.data.source == "metaworld"):
            return
        from lf_orchestrator.families.vla.evaluate import evaluate_run
        from lf_orchestrator.families.vla.report import print_eval
        from lf_orchestrator.progress import LineReporter

        console.print("evaluating closed-loop in Meta-World ...")
        print_eval(evaluate_run(run_dir, device=device, report=LineReporter(console)))
