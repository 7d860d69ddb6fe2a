"""Gradient accumulation that equals one large batch, over micro-batches and ranks.

The loss of a large batch is the mean over its target tokens:
``L = sum_i ce_i / N`` with ``N`` the target tokens of the whole global batch
(all micro-batches, all data-parallel ranks). Accumulating micro-batch losses
and averaging gradients across ranks reproduces ``grad L`` only if each
micro-batch contributes ``sum_{i in mb} ce_i / N`` times the factor the
gradient all-reduce divides by (``world_size`` for DDP / FSDP averaging).

The mean-of-means bug (HF ``transformers`` before 4.46, "Fixing gradient
accumulation", Oct 2024; also DDP with per-rank mean losses): dividing each
micro-batch by its *own* token count and then by the number of micro-batches
weights tokens of short micro-batches more than those of long ones, so the
accumulated gradient differs from the large batch's whenever token counts are
unequal (padding, packing, ignored labels). Here the divisor is always the
global count, taken once per optimizer step before the micro-batches run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["global_token_count", "token_normalized_loss"]


def token_normalized_loss(
    loss_sum: torch.Tensor, global_tokens: int | float | torch.Tensor, world_size: int = 1
) -> torch.Tensor:
    """The loss to backpropagate for one micro-batch: ``loss_sum * world_size / global_tokens``.

    Args:
        loss_sum: scalar, the *summed* per-token loss of this micro-batch
            (``cross_entropy(..., reduction="sum", ignore_index=-100)``).
        global_tokens: target tokens of the whole step, every micro-batch of
            every rank (:func:`global_token_count`), > 0.
        world_size: how many ranks the gradient all-reduce averages over (1
            without data parallelism; the DP world size under DDP / FSDP).

    Returns:
        A scalar in ``loss_sum``'s dtype. Summing these over all micro-batches
        and ranks, then averaging gradients over ranks, gives the gradient of
        the mean loss over all ``global_tokens`` tokens.

    Raises:
        ValueError: ``global_tokens`` <= 0, ``world_size`` < 1, or a non-scalar ``loss_sum``.

    Example:
        >>> ce = torch.tensor([2.0, 4.0, 6.0])  # three tokens in this micro-batch
        >>> token_normalized_loss(ce.sum(), global_tokens=4)  # a fourth token lives elsewhere
        tensor(3.)
    """
    if loss_sum.dim() != 0:
        raise ValueError(f"loss_sum must be a scalar (reduction='sum'), got shape {tuple(loss_sum.shape)}")
    if float(global_tokens) <= 0:
        raise ValueError(f"global_tokens must be > 0, got {global_tokens}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return loss_sum * (world_size / global_tokens)


def global_token_count(
    local_tokens: int | torch.Tensor, group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
) -> int:
    """Target tokens of one optimizer step summed over the ranks of ``group``.

    Args:
        local_tokens: this rank's target tokens over all its micro-batches of the step.
        group: the data-parallel group (default: the world); without an
            initialized process group the local count is returned.
        device: where the all-reduce buffer lives (``"cuda"`` for NCCL).

    Returns:
        The global count, a Python int (one all-reduce, one host sync).

    Example:
        >>> global_token_count(17)  # no process group: the local count
        17
    """
    count = torch.as_tensor(local_tokens, dtype=torch.int64, device=device).clone()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    return int(count.item())
