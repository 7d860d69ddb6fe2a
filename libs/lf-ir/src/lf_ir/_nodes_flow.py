"""Loss-head nodes of generative objectives: flow matching (rectified flow).

Torch-free; the lowering (the loss computation) lives in :mod:`lf_ir.flow`.
"""

from __future__ import annotations

from typing import Literal

from lf_ir import _bytes
from lf_ir._base import _Node


class FlowMatchingLoss(_Node, frozen=True, kw_only=True, tag="flow_matching_loss"):
    """Flow-matching loss head: velocity prediction (batch, ..., dim) -> scalar, no parameters.

    Per sample, the mean squared error between the predicted velocity and the
    rectified-flow target ``noise - x0`` (Lipman et al. 2022, arXiv 2210.02747; Liu
    et al. 2022, arXiv 2209.03003; the SD3 / Wan convention ``x_t = (1 - sigma) x0 +
    sigma noise``, Esser et al. 2024, arXiv 2403.03206), optionally weighted per sample
    by ``weighting`` of sigma, then averaged over the batch; float32 math.
    Element-wise only, so it counts 0 FLOPs.

    Example:
        >>> FlowMatchingLoss(name="loss", dim=64).param_shapes()
        {}
    """

    dim: int
    """Features per token of the prediction (e.g. channels times patch volume)."""
    weighting: Literal["none", "sigma_sqrt", "cosmap"] = "none"
    """Per-sample weight of sigma (SD3's schemes, see :func:`lf_ir.flow.loss_weight`)."""

    def __post_init__(self) -> None:
        self._positive(dim=self.dim)
        if self.weighting not in ("none", "sigma_sqrt", "cosmap"):
            self._fail(f"weighting must be 'none', 'sigma_sqrt' or 'cosmap', got {self.weighting!r}")

    @property
    def in_dim(self) -> int:
        return self.dim

    @property
    def out_dim(self) -> int:
        return 1

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {}

    def forward_flops(self, batch: int, seq: int) -> int:
        return 0

    def forward_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """Read the prediction, x0 and noise, write the target and the float32 error, read it to square and
        reduce (``seq`` tokens of ``dim`` features per sample)."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        elems = batch * seq * self.dim
        return 3 * elems * dtype_bytes + elems * 4 * 5

    def saved_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """The float32 error ``pred - (noise - x0)`` (T*dim*4, kept by the square), plus the float32 per-sample
        weights (batch*4) when ``weighting`` is not ``"none"``."""
        _bytes.check_sizes(self, batch, seq, dtype_bytes)
        return batch * seq * self.dim * 4 + (batch * 4 if self.weighting != "none" else 0)
