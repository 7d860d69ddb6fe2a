"""DynamicLossScaler with ``process_group``: ranks holding different gradient shards skip together.

Oracle: the single process. One process holding the whole gradient skips the step and halves its scale
when any element is inf; two gloo processes each holding half of that gradient (as ZeRO-2/3, tensor or
pipeline parallel leave them), with the inf in rank 0's half only, must both do the same: skip, leave
their parameters bitwise unchanged, and end with the single process's scale. Without a process group
rank 1 finds no inf and updates while rank 0 skips (what an fp16 ZeRO-3 run did).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lf_memory import DynamicLossScaler


def _half_step(rank: int, process_group) -> dict:
    """One step of SGD on this rank's half of a 4-element parameter; the inf lands in rank 0's half."""
    param = torch.nn.Parameter(torch.arange(2.0) + 2 * rank)
    opt = torch.optim.SGD([param], lr=0.1)
    scaler = DynamicLossScaler("cpu", process_group=process_group)
    scaler.scale(param.square().sum()).backward()
    if rank == 0:
        param.grad[0] = float("inf")
    before = param.detach().clone()
    scaler.unscale_(opt)
    scaler.step(opt)
    skipped = scaler.update()
    return {"skipped": skipped, "unchanged": torch.equal(before, param.detach()), "scale": scaler.get_scale()}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        got = {"agreed": _half_step(rank, dist.group.WORLD), "alone": _half_step(rank, None)}
        Path(f"{out}.{rank}").write_text(json.dumps(got))  # a file per rank: all_gather_object needs numpy
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shards_skip_together_like_one_process():
    """Both ranks skip, keep their parameters and halve the scale, as one process holding the whole gradient."""
    param = torch.nn.Parameter(torch.arange(4.0))
    scaler = DynamicLossScaler("cpu")
    opt = torch.optim.SGD([param], lr=0.1)
    scaler.scale(param.square().sum()).backward()
    param.grad[0] = float("inf")
    scaler.step(opt)
    ref = {"skipped": scaler.update(), "scale": scaler.get_scale()}
    assert ref == {"skipped": True, "scale": 2.0**15}

    with tempfile.TemporaryDirectory(prefix="lf-loss-scale-") as tmp:
        out = str(Path(tmp) / "out.json")
        mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, start_method="spawn")
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    for r in ranks:
        assert r["agreed"] == {"skipped": True, "unchanged": True, "scale": ref["scale"]}
    # the failure the option prevents: each rank alone disagrees
    assert [r["alone"]["skipped"] for r in ranks] == [True, False]
