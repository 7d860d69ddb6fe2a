"""The one trainer of `lf run`, for every family: :class:`Trainer` (build -> plan -> parallelize -> optimizer ->
steps), its fit loop (:mod:`.fit`), the pipeline-parallel step (:mod:`._pipeline_step`), the training state it
checkpoints (:mod:`.state`) and the run driver (:mod:`.run`: run folder, plan.json, progress, summary)."""

from lf_orchestrator.train.trainer import Trainer, prepare_family

__all__ = ["Trainer", "prepare_family"]
