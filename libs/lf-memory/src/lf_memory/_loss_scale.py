"""fp16 dynamic loss scaling with skipped-step counting, on ``torch.amp.GradScaler``.

Dynamic loss scaling (Micikevicius et al. 2018, "Mixed Precision Training",
arXiv 1710.03740): multiply the loss by a scale ``S`` so small fp16 gradients
do not flush to zero; before the optimizer step divide the gradients by ``S``;
if any is inf or NaN, skip the step and multiply ``S`` by ``backoff_factor``;
after ``growth_interval`` finite steps in a row multiply ``S`` by
``growth_factor``.

``torch.amp.GradScaler`` implements exactly this on CUDA and, since torch 2.3,
on CPU (checked with torch 2.13: inf gradients skip the step and halve the
scale), so this class is a thin wrapper that adds what the trainer logs: how
many steps were skipped, whether the last one was, and the current scale.
A skipped step is detected from the public API only: ``update()`` lowers the
scale exactly when the step found inf/NaN (``backoff_factor < 1``).

bf16 needs no loss scaling (its exponent range is fp32's); construct with
``enabled=False`` there and every method is a pass-through.

When ranks hold different gradients (ZeRO-2/3 shards, tensor- or pipeline-parallel
pieces), an inf in one rank's piece must skip the step on every rank, or some ranks
update and others do not and their scales drift apart. With ``process_group`` the
found-inf flags are summed over that group after unscaling (torch's
``ShardedGradScaler``, which does this on CUDA and CPU), so all its ranks skip together.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DynamicLossScaler"]


class DynamicLossScaler:
    """Loss scaler for fp16 training that counts skipped steps.

    Args:
        device: ``"cuda"`` or ``"cpu"``, where the gradients live.
        init_scale: starting scale ``S`` (default 2**16).
        growth_factor: ``S`` is multiplied by this after ``growth_interval``
            finite steps in a row (> 1).
        backoff_factor: ``S`` is multiplied by this when a step finds inf/NaN
            (in (0, 1)).
        growth_interval: finite steps in a row before growing ``S`` (>= 1).
        enabled: False makes every method a pass-through (bf16 / fp32).
        process_group: the ranks that must agree on skipping a step (e.g.
            ``torch.distributed.group.WORLD`` under any parallel plan); None: this
            process decides alone (one process, or identical DDP gradients).

    Raises:
        ValueError: a factor or interval out of range (names it and the value).

    Example:
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scaler = DynamicLossScaler("cpu", growth_interval=2)
        >>> with torch.autocast("cpu", dtype=torch.float16):
        ...     loss = model(torch.randn(8, 4)).float().square().mean()
        >>> scaler.scale(loss).backward()
        >>> scaler.step(opt)
        >>> scaler.update()  # True when the step was skipped
        False
        >>> scaler.log_fields()
        {'loss_scale': 65536.0, 'skipped_steps': 0}
    """

    def __init__(self, device: str = "cuda", *, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True,
                 process_group: Any = None) -> None:
        if not init_scale > 0:
            raise ValueError(f"DynamicLossScaler.init_scale must be > 0, got {init_scale}")
        if not growth_factor > 1:
            raise ValueError(f"DynamicLossScaler.growth_factor must be > 1, got {growth_factor}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"DynamicLossScaler.backoff_factor must be in (0, 1), got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"DynamicLossScaler.growth_interval must be an int >= 1, got {growth_interval!r}")
        options = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                       growth_interval=growth_interval, enabled=enabled)
        if process_group is not None:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self._scaler = ShardedGradScaler(device, process_group=process_group, **options)
        else:
            self._scaler = torch.amp.GradScaler(device, **options)
        self.skipped_steps = 0
        """Optimizer steps skipped so far because a gradient was inf or NaN."""
        self.last_step_skipped = False
        """Whether the step closed by the last :meth:`update` was skipped."""

    @property
    def enabled(self) -> bool:
        return self._scaler.is_enabled()

    def get_scale(self) -> float:
        """The current scale ``S`` (1.0 when disabled)."""
        return float(self._scaler.get_scale()) if self.enabled else 1.0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * S``; call ``backward`` on the result."""
        return self._scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients of ``optimizer``'s params by ``S`` now (before clipping); once per step."""
        self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale (unless done) and run ``optimizer.step()`` only if every gradient is finite."""
        self._scaler.step(optimizer)

    def update(self) -> bool:
        """Adjust ``S`` for the next step; returns True if this step was skipped (and counts it)."""
        before = self.get_scale()
        self._scaler.update()
        self.last_step_skipped = self.enabled and self.get_scale() < before
        self.skipped_steps += int(self.last_step_skipped)
        return self.last_step_skipped

    def log_fields(self) -> dict[str, float | int]:
        """``{"loss_scale": S, "skipped_steps": n}`` for the step logs."""
        return {"loss_scale": self.get_scale(), "skipped_steps": self.skipped_steps}

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's state plus ``skipped_steps``, for training checkpoints."""
        return {**self._scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        state = dict(state)
        self.skipped_steps = int(state.pop("skipped_steps", 0))
        self._scaler.load_state_dict(state)
