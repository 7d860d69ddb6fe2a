"""Shared helpers of the pipeline and context-parallel tests: one spawned gloo world runs many cases.

Spawning processes is the slow part on a 2-core machine, so each test module spawns
one world (a module-scoped fixture), every rank runs all of the module's cases in
turn and saves what the assertions need to ``out_dir``; the tests then read the
files and compare with the single-process oracle computed in the test process.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, body: Callable[[int, int, str], None], out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        body(rank, world, out_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(body: Callable[[int, int, str], None], world: int, out_dir: str) -> None:
    """Run ``body(rank, world, out_dir)`` in ``world`` spawned gloo processes; raises if one fails."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)
    mp.start_processes(_entry, args=(world, free_port(), body, out_dir), nprocs=world, start_method="spawn")


def rel_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, what: str, floor: float = 0.0) -> None:
    """``max|a - e| <= rtol * max(max|e|, floor)``: relative to the tensor's scale (near-zero entries do not
    dominate), and not below ``floor`` (for tensors far smaller than the sums that produced them)."""
    err = (actual.double() - expected.double()).abs().max().item()
    scale = max(expected.double().abs().max().item(), floor)
    assert err <= rtol * max(scale, 1e-12), f"{what}: max abs error {err:.3g} vs scale {scale:.3g} (rtol {rtol})"
