"""The device mesh of a plan: named dims ``pp, dp_replicate, dp_shard, cp, tp`` (outermost first).

Built with ``torch.distributed.device_mesh.init_device_mesh``; every name is
always present (size 1 when the plan does not use it) so code slices by name
without asking the plan. Ranks are laid out row-major, tp innermost, so a
tensor-parallel group is the most tightly connected ranks (one NVLink domain),
as in torchtitan's ``ParallelDims``.

- ZeRO-0/1 (DDP): ``dp_replicate = dp``, ``dp_shard = 1``;
- ZeRO-2/3 (FSDP2): ``dp_shard = dp / dp_replicate``; ``dp_replicate > 1`` is HSDP.

Pipeline stages are formed over the ``pp`` dim by :mod:`lf_parallel._stages`'
users; everything else here works on one pipeline stage's sub-mesh.
"""

from __future__ import annotations

import warnings

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from lf_parallel._plan import Plan

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""Mesh dim names, outermost first."""
FLATTENED_SLICE_WARNING = "Slicing a flattened dim from root mesh will be deprecated"
"""The start of torch's UserWarning (2.11 to 2.13) when a root mesh is sliced by a flattened dim's name, as
:func:`dp_mesh` does under context parallel; it is filtered there alone (once per rank, it buried `lf parallel
check`'s table)."""


def mesh_shape(plan: Plan) -> dict[str, int]:
    """Mesh dim name -> size for ``plan`` (product = ``plan.world_size``)."""
    replicate = plan.dp_replicate if plan.zero_stage >= 2 else plan.dp
    return {"pp": plan.pp, "dp_replicate": replicate, "dp_shard": plan.dp_shard, "cp": plan.cp, "tp": plan.tp}


def build_mesh(plan: Plan, device_type: str = "cpu") -> DeviceMesh:
    """The 5-D named ``DeviceMesh`` of ``plan`` over the initialized default process group.

    Args:
        plan: a checked plan (``plan.world_size`` must equal the process group's size).
        device_type: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL).

    Raises:
        RuntimeError: from ``init_device_mesh`` when the sizes do not match the world size.

    Example (inside a 4-process job)::

        mesh = build_mesh(Plan(dp=2, tp=2, zero_stage=3))
        mesh["tp"].size()                       # 2
        dp_mesh(mesh, plan).mesh_dim_names      # ('dp_replicate', 'dp_shard')
    """
    shape = mesh_shape(plan)
    return init_device_mesh(device_type, tuple(shape[d] for d in MESH_DIMS), mesh_dim_names=MESH_DIMS)


def dp_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The data-parallel sub-mesh: ``(dp_replicate, dp_shard)`` (2-D; HSDP when both > 1).

    Context-parallel ranks see different tokens of the same samples, so their
    gradients are reduced like data-parallel ones: with ``cp > 1`` the sharding dim
    is ``dp_shard x cp`` flattened to ``dp_shard_cp``.
    """
    if plan.cp > 1:
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        with warnings.catch_warnings():  # torch >= 2.11 warns on every rank; the slice is still supported
            warnings.filterwarnings("ignore", message=FLATTENED_SLICE_WARNING, category=UserWarning)
            return mesh["dp_replicate", "dp_shard_cp"]
    return mesh["dp_replicate", "dp_shard"]


def flat_dp_group(mesh: DeviceMesh, plan: Plan):
    """The process group over all data-parallel (and context-parallel) ranks, for DDP and ZeRO-1."""
    names = ("dp_replicate", "dp_shard", "cp")
    sub = mesh[names]
    return sub._flatten("dp_cp").get_group()
