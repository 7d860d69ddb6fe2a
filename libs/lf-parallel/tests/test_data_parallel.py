"""Data parallel on CPU processes (gloo). Oracle: the single-process run on the full batch.

Two processes each take half of a batch; with the loss normalized by the global token
count (lf_parallel.global_sum) the averaged DDP gradients equal the single-process
gradient of the whole batch, and parameters after three AdamW steps agree within float32
round-off (1e-5 relative: the two runs sum in a different order).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from lf_parallel import apply_data_parallel, global_sum, init_distributed, shutdown, unwrap


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 5))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 6, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    y[[1, 6]] = -100  # ignored targets: unequal token counts per rank
    return x, y


def _train(model, ctx, x, y, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens = global_sum(torch.tensor(float((y != -100).sum())), ctx)
        loss = nn.functional.cross_entropy(model(x), y, reduction="sum", ignore_index=-100)
        (loss / (tokens / ctx.world_size)).backward()
        opt.step()
        opt.zero_grad()
    return unwrap(model)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = init_distributed("cpu")
    x, y = _data()
    shard = slice(rank * 4, rank * 4 + 4)
    model = _train(apply_data_parallel(_model(), ctx), ctx, x[shard], y[shard])
    if rank == 0:
        torch.save(model.state_dict(), out)
    shutdown(ctx)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_equals_single_process(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    out = str(tmp_path / "ddp.pt")
    mp.start_processes(_worker, args=(2, _free_port(), out), nprocs=2, start_method="spawn")
    ddp_state = torch.load(out, weights_only=True)

    ctx = init_distributed("cpu")
    assert not ctx.distributed
    x, y = _data()
    single = _train(_model(), ctx, x, y).state_dict()
    for key, value in single.items():
        torch.testing.assert_close(ddp_state[key], value, rtol=1e-5, atol=1e-6)
    # and training moved the weights (the comparison is not between two untouched inits)
    assert not torch.allclose(single["0.weight"], _model().state_dict()["0.weight"])


def test_resolve_device_errors():
    from lf_parallel import resolve_device

    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="run.device must be 'auto', 'cuda' or 'cpu', got 'tpu'"):
        resolve_device("tpu")
