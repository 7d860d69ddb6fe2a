"""DCP checkpoints are read without running code from the folder: planted pickles are refused by name.

Oracle: a marker file that the planted pickle's ``__reduce__`` (``os.system("touch <marker>")``) creates when
anything unpickles it the ordinary way (checked first with plain ``pickle.loads`` / ``torch.load(weights_only=
False)``, so the payload is known to work); after lf's readers refuse it the marker must not exist, and the
error must name the file and ``posix.system`` / ``nt.system``. Legitimate checkpoints (AdamW state with byte
items, bf16 and int64 tensors; FSDP2 and TP DTensor shards over 2 gloo processes) load back bit for bit through
the same readers.
"""

from __future__ import annotations

import io
import os
import pickle
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from lf_parallel import (
    SafeFileSystemReader,
    UnsafeCheckpointError,
    load_checkpoint,
    pickle_globals,
    read_full_tensors,
    safe_torch_load,
    save_checkpoint,
)

SYSTEM = r"(posix|nt)\.system"


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _payload(marker, protocol: int) -> bytes:
    """A pickle that runs ``touch marker`` when loaded; proven here on a scratch marker."""
    probe = f"{marker}.probe"
    pickle.loads(pickle.dumps(_Evil(probe), protocol=protocol))
    assert os.path.exists(probe), "the planted payload must run under plain pickle"
    os.remove(probe)
    return pickle.dumps(_Evil(marker), protocol=protocol)


def _torch_payload(marker) -> bytes:
    """A ``torch.save`` archive whose object runs ``touch marker`` under ``torch.load(weights_only=False)``."""
    buf = io.BytesIO()
    torch.save(_Evil(f"{marker}.probe"), buf)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert os.path.exists(f"{marker}.probe"), "the planted payload must run under weights_only=False"
    os.remove(f"{marker}.probe")
    buf = io.BytesIO()
    torch.save(_Evil(marker), buf)
    return buf.getvalue()


def _trained(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)).to(torch.bfloat16)
    model.register_buffer("count", torch.arange(3) + seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    model(torch.randn(3, 4, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    return model, opt


def _plant_byte_item(ckpt, data: bytes) -> tuple[str, str]:
    """Point the first non-tensor (BYTE_IO) item of ``ckpt`` at ``data`` appended to its shard; returns
    (shard file name, item key). The rewritten ``.metadata`` itself is a legitimate one."""
    meta = SafeFileSystemReader(str(ckpt)).read_metadata()
    key = next(k for k, v in meta.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata))
    index = next(i for i in meta.storage_data if i.fqn == key)
    info = meta.storage_data[index]
    shard = ckpt / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(data)
    meta.storage_data[index] = _StorageInfo(info.relative_path, offset, len(data),
                                            getattr(info, "transform_descriptors", None))
    meta.storage_meta = None
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    return info.relative_path, key


def test_legitimate_checkpoint_loads_bit_for_bit_through_the_safe_readers(tmp_path):
    """Oracle: the saved model and optimizer state (tensors and AdamW's byte items: lr, betas)."""
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "ok", model, opt)
    fresh, fresh_opt = _trained(1)
    fresh_opt.param_groups[0].update(lr=0.5, betas=(0.1, 0.2))
    load_checkpoint(dst, fresh, fresh_opt)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert fresh_opt.param_groups[0]["lr"] == 1e-2 and tuple(fresh_opt.param_groups[0]["betas"]) == (0.8, 0.95)
    for pa, pb in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(fresh_opt.state[pb]["exp_avg_sq"], opt.state[pa]["exp_avg_sq"])
    full = read_full_tensors(dst, prefix="model.")
    assert all(torch.equal(full[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_malicious_metadata_is_refused_by_name(tmp_path, protocol):
    """Oracle: the marker (absent) and the message (file, class). Protocol 0/2 name it with GLOBAL, 4 with
    STACK_GLOBAL."""
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "ckpt", model, opt)
    marker = tmp_path / "pwned"
    (dst / ".metadata").write_bytes(_payload(marker, protocol))
    for load in (lambda: load_checkpoint(dst, model, opt), lambda: read_full_tensors(dst)):
        with pytest.raises(UnsafeCheckpointError, match=rf"ckpt/\.metadata: refused to unpickle {SYSTEM} "
                                                        r"\(not a DCP metadata class\); this checkpoint was not "
                                                        r"written by lf or was tampered with") as err:
            load()
        assert err.value.file == str(dst / ".metadata") and err.value.name.endswith(".system")
        assert not marker.exists()


@pytest.mark.parametrize("kind", ["torch.save", "pickle protocol 4"])
def test_malicious_byte_item_in_a_shard_is_refused_by_name(tmp_path, kind):
    """Oracle: the marker (absent) and the message (shard file, item key, class): a non-tensor DCP item is
    read with ``weights_only=True`` (DCP's own planner reads it with ``weights_only=False``)."""
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "ckpt", model, opt)
    marker = tmp_path / "pwned"
    data = _torch_payload(marker) if kind == "torch.save" else _payload(marker, 4)
    shard, key = _plant_byte_item(dst, data)
    with pytest.raises(UnsafeCheckpointError, match=rf"ckpt/{shard} \(item '{key}'\): refused to unpickle "
                                                    rf"{SYSTEM} \(a non-tensor DCP item") as err:
        load_checkpoint(dst, *_trained(1))
    assert err.value.file == str(dst / shard)
    assert not marker.exists()


def test_metadata_of_another_type_or_with_persistent_ids_is_refused(tmp_path):
    """Oracle: the message names the file; a list (allowed opcodes only) is not DCP Metadata."""
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "ckpt", model, opt)
    (dst / ".metadata").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: holds a list, not DCP Metadata"):
        read_full_tensors(dst)
    (dst / ".metadata").write_bytes(b"\x80\x02X\x01\x00\x00\x00xQ.")  # BINPERSID of "x"
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata: refused a persistent id"):
        read_full_tensors(dst)


@pytest.mark.parametrize("rel", ["../outside.distcp", "/etc/passwd"])
def test_shard_paths_outside_the_folder_are_refused(tmp_path, rel):
    """Oracle: the message names .metadata and the path; DCP would read a shard at any path it is given."""
    model, opt = _trained(0)
    dst = save_checkpoint(tmp_path / "ckpt", model, opt)
    meta = SafeFileSystemReader(str(dst)).read_metadata()
    index = next(iter(meta.storage_data))
    info = meta.storage_data[index]
    meta.storage_data[index] = _StorageInfo(rel, info.offset, info.length, getattr(info, "transform_descriptors", None))
    (dst / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(UnsafeCheckpointError, match=rf"ckpt/\.metadata: refused shard path '{rel}'"):
        load_checkpoint(dst, model, opt)


def test_safe_torch_load_and_pickle_globals_name_the_class_without_running_it(tmp_path):
    """Oracle: the marker (absent); the names as the pickle spells them."""
    marker = tmp_path / "pwned"
    for name, data in (("a.pt", _torch_payload(marker)), ("b.pt", _payload(marker, 4)),
                       ("c.pt", _payload(marker, 0))):
        (tmp_path / name).write_bytes(data)
        assert pickle_globals(data)[0] in ("posix.system", "nt.system")
        with pytest.raises(UnsafeCheckpointError, match=rf"{name}: refused to unpickle {SYSTEM}"):
            safe_torch_load(tmp_path / name)
    assert not marker.exists()
    torch.save({"step": 3, "rng": torch.arange(4)}, tmp_path / "ok.pt")
    assert safe_torch_load(tmp_path / "ok.pt")["step"] == 3


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded_worker(rank: int, port: int, root: str, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = {}
    try:
        for plan in ("fsdp", "tp"):
            models = []
            for seed in (0, 1):
                torch.manual_seed(seed)
                m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
                if plan == "tp":
                    parallelize_module(m, init_device_mesh("cpu", (2,)), {"0": ColwiseParallel(),
                                                                          "2": RowwiseParallel()})
                else:
                    fully_shard(m)
                opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
                m(torch.randn(2, 4)).sum().backward()
                opt.step()
                models.append((m, opt))
            dst = save_checkpoint(os.path.join(root, plan), *models[0])
            load_checkpoint(dst, *models[1])
            same = all(torch.equal(a.full_tensor(), b.full_tensor())
                       for a, b in zip(models[0][0].parameters(), models[1][0].parameters(), strict=True))
            dist.barrier()
            if rank == 0:
                _plant_byte_item(dst, _torch_payload(os.path.join(root, f"pwned-{plan}")))
            dist.barrier()
            try:
                load_checkpoint(dst, *models[1])
                refused = None
            except UnsafeCheckpointError as err:
                refused = str(err)
            results[plan] = (same, refused)
    finally:
        dist.destroy_process_group()
    queue.put((rank, results))


def test_sharded_dtensor_checkpoints_load_and_refuse_on_every_rank(tmp_path):
    """Oracle: FSDP2 and TP checkpoints (DTensor shards, 2 gloo processes) load back equal to the saved
    parameters through the safe readers; a planted byte item is refused on both ranks, by name, and the
    marker is absent."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_sharded_worker, args=(r, port, str(tmp_path), queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict(queue.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for rank in (0, 1):
        for plan in ("fsdp", "tp"):
            same, refused = out[rank][plan]
            assert same, (rank, plan)
            assert refused is not None and f"{plan}/__" in refused and "posix.system" in refused, (rank, plan)
            assert not (tmp_path / f"pwned-{plan}").exists()
