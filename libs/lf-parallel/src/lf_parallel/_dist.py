"""Process-group setup from the launcher's environment (torchrun).

One :class:`DistContext` is created per process and passed explicitly to
whatever needs it; nothing reads global process-group state behind the
caller's back. gloo is used on the CPU, NCCL on CUDA devices.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    """Global rank, 0..world_size-1."""
    world_size: int
    """Number of processes."""
    local_rank: int
    """Rank on this node (selects the GPU)."""
    device: torch.device
    """Device this process computes on."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> this process's CUDA device when available, else CPU.

    Raises:
        ValueError: ``"cuda"`` requested without a CUDA device, or an unknown name.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("run.device='cuda' but torch sees no CUDA device")
        return torch.device("cuda", local_rank)
    if requested == "cpu":
        return torch.device("cpu")
    raise ValueError(f"run.device must be 'auto', 'cuda' or 'cpu', got {requested!r}")


def init_distributed(device: str = "auto", *, timeout_s: float = 600.0) -> DistContext:
    """Join the process group that torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK).

    A single process (no WORLD_SIZE, or WORLD_SIZE=1) gets a context without a
    process group.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local)
    if world > 1 and not dist.is_initialized():
        import datetime

        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _restart_store(timeout)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", timeout=timeout,
                                **({"store": store, "rank": rank, "world_size": world} if store else {}))
    return DistContext(rank=rank, world_size=world, local_rank=local, device=dev)


def _restart_store(timeout):
    """After a torchelastic restart: the agent's store with keys prefixed by the attempt, else None.

    torchrun keeps one agent TCPStore across restarts and workers join it without a per-attempt prefix
    (torch 2.13 ``rendezvous._create_c10d_store``), so a restarted gloo group could read the listening
    addresses of the killed attempt's ranks and fail with "Connection refused" in ``connectFullMesh``.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"lf/attempt_{attempt}", store)


def shutdown(ctx: DistContext) -> None:
    """Destroy the process group if this context created one."""
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()
