"""Prepare the next optimizer step's batches on a background thread while the current step trains.

A trainer's step has two halves: host work that draws sample indices from its
:class:`lf_data.ResumableSampler` and collates them (decoding, resizing, tokenizing,
patchifying: tens of milliseconds for a Qwen2-VL micro-batch of eight 448 px images), and
device work. Run in sequence, the GPU idles through the host half of every step. With
``data.prefetch = true`` :class:`StepPrefetcher` runs step ``s + 1``'s host half on one
worker thread while step ``s`` trains (the collate functions are PyTorch and NumPy calls
that release the GIL), into pinned memory on CUDA so the copy to the GPU can overlap too
(``non_blocking=True``).

The batches are the ones the sequential loop makes, bit for bit: indices are drawn in the
same order, and every random draw of a collate function comes from a generator seeded by
``(run.seed, step, sample)`` (never from the global RNG), so the thread that makes a batch
does not matter. What the prefetcher must keep right is the data position:

- a checkpoint stores :meth:`StepPrefetcher.sampler_state`, the position *before* the step
  drawn ahead, so a resume replays that step's samples instead of skipping them;
- a step asked for that is not the one drawn ahead (after a rollback to a checkpoint) throws
  the drawn batch away and rewinds the sampler to where that draw began (:meth:`discard`);
- nothing is drawn beyond ``train.steps``.

This is the double-buffered input pipeline of e.g. the PyTorch ``DataLoader`` with
``pin_memory`` and ``prefetch_factor``, kept to one step and one thread because the
collate functions close over the family's open dataset, tokenizer and caches.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

HostBatches = list[dict[str, torch.Tensor]]
"""One optimizer step's micro-batches on the host: ``grad_accum`` dicts of CPU tensors."""


def pin(batches: HostBatches) -> HostBatches:
    """``batches`` with every CPU tensor in page-locked memory (copies; a tensor already pinned is kept)."""
    return [{k: v if v.is_pinned() else v.pin_memory() for k, v in b.items()} for b in batches]


class StepPrefetcher:
    """One step of look-ahead over a trainer's host batches (see the module docstring).

    Args:
        make: ``make(step) -> HostBatches``: draws the step's indices from ``sampler`` and collates them.
            Called on the worker thread for steps drawn ahead, so it must touch nothing the training step uses.
        sampler: the sampler ``make`` draws from (``state_dict`` / ``load_state_dict``).
        reset_indices: called after the sampler is rewound (the trainer re-creates its index iterator).
        last_step: ``train.steps``: batches are made for steps ``0 .. last_step - 1`` only.
        enabled: False makes every step's batches on the calling thread when asked for (no look-ahead).
        pin_memory: pin the batches' tensors (CUDA runs), on the worker thread.
    """

    def __init__(self, make: Callable[[int], HostBatches], sampler, reset_indices: Callable[[], None], *,
                 last_step: int, enabled: bool, pin_memory: bool) -> None:
        self._make_fn, self._sampler, self._reset_indices = make, sampler, reset_indices
        self.last_step, self.enabled, self.pin_memory = last_step, enabled, pin_memory
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lf-prefetch") if enabled else None
        self._pending: tuple[int, dict, Future] | None = None
        """(step, sampler state before its draw, future of its batches)."""

    def _make(self, step: int) -> HostBatches:
        batches = self._make_fn(step)
        return pin(batches) if self.pin_memory else batches

    def batches(self, step: int) -> HostBatches:
        """The host batches of ``step`` (the trainer's finished-step count); starts drawing ``step + 1``'s.

        Raises:
            Whatever ``make`` raised for this step (on the worker thread or here).
        """
        if self._pending is not None and self._pending[0] == step:
            future, self._pending = self._pending[2], None
            result = future.result()
        else:
            self.discard()
            result = self._make(step)
        if self._pool is not None and step + 1 < self.last_step:
            self._pending = (step + 1, self._sampler.state_dict(), self._pool.submit(self._make, step + 1))
        return result

    def sampler_state(self) -> dict:
        """The sampler position of the next step not yet handed out: what a checkpoint stores."""
        return self._pending[1] if self._pending is not None else self._sampler.state_dict()

    def discard(self) -> None:
        """Drop the step drawn ahead, if any: wait for its thread, rewind the sampler to before its draw."""
        if self._pending is None:
            return
        _, state, future = self._pending
        self._pending = None
        future.exception()  # wait; its error, if any, belongs to a step that will be drawn again
        self._sampler.load_state_dict(state)
        self._reset_indices()

    def close(self) -> None:
        """Discard any step drawn ahead and stop the worker thread."""
        self.discard()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def make_prefetcher(trainer, host_micro_batch: Callable[[int], dict[str, torch.Tensor]]) -> StepPrefetcher:
    """The :class:`StepPrefetcher` of a trainer (``cfg``, ``plan``, ``ctx``, ``sampler``, ``_indices``):
    ``host_micro_batch(step)`` draws one micro-batch's indices from ``trainer._indices`` and collates them on the
    host; a step is ``plan.grad_accum`` of them. Look-ahead per ``data.prefetch``, pinned on CUDA."""

    def make(step: int) -> HostBatches:
        return [host_micro_batch(step) for _ in range(trainer.plan.grad_accum)]

    def reset_indices() -> None:
        trainer._indices = iter(trainer.sampler)

    return StepPrefetcher(make, trainer.sampler, reset_indices, last_step=trainer.cfg.train.steps,
                          enabled=trainer.cfg.data.prefetch, pin_memory=trainer.ctx.device.type == "cuda")


def sampler_state(trainer) -> dict:
    """The trainer's data position for a checkpoint: before any step its prefetcher drew ahead."""
    prefetcher = getattr(trainer, "prefetcher", None)
    return prefetcher.sampler_state() if prefetcher is not None else trainer.sampler.state_dict()
