"""What the keys of a parallel plan mean, for the footers of `lf plan` and `lf memory`.

A plan prints as ``dp=64 dp_replicate=32 zero_stage=3 tp=2 micro_batch=1 grad_accum=4`` (``Plan.describe``);
keys at their defaults are left out. These lines say what each degree is, in lf-parallel's terms
(:class:`lf_parallel.Plan`): ``dp`` is the whole data-parallel degree, ``dp_replicate x dp_shard``.
"""

from __future__ import annotations

import re

ZERO_STAGES = {
    0: "no sharding: every data-parallel rank holds the full parameters, gradients and optimizer state, as DDP",
    1: "optimizer state sharded over the data-parallel ranks; parameters and gradients whole on each",
    2: "optimizer state and gradients sharded over the data-parallel ranks; parameters whole on each",
    3: "parameters, gradients and optimizer state all sharded over the data-parallel ranks, as FSDP",
}
"""ZeRO stage -> what each data-parallel rank holds (Rajbhandari et al., arXiv 1910.02054)."""

PLAN_KEYS = {
    "dp": "data-parallel degree, in total: ranks that each train on a different slice of the batch; "
          "dp = dp_replicate x dp_shard",
    "dp_replicate": "HSDP replicas: groups that each hold one copy of the sharded model, sharded (FSDP / ZeRO-2/3) "
                    "over dp_shard = dp / dp_replicate ranks; left out = 1, one group sharded over all of dp",
    "zero_stage": "ZeRO stage; left out = 0, " + ZERO_STAGES[0] + "; 1 shards the optimizer state over dp, "
                  "2 + the gradients, 3 + the parameters (FSDP)",
    "tp": "tensor-parallel degree: each layer's weight matrices split over tp ranks (Megatron-LM)",
    "sp": "sequence parallel with tp: norms and residuals split along the sequence",
    "pp": "pipeline-parallel stages: the layers split over pp ranks",
    "pp_schedule": "pipeline schedule (gpipe, 1f1b, interleaved_1f1b, zero_bubble)",
    "pp_virtual_stages": "pipeline stages per pp rank (interleaved schedules)",
    "cp": "context-parallel degree: each sample's sequence split over cp ranks",
    "cp_kind": "context-parallel attention: ring (k/v passed around the ranks) or ulysses (all-to-all to heads)",
    "micro_batch": "samples per data-parallel rank per forward / backward",
    "grad_accum": "micro-batches per optimizer step",
}
"""Plan key -> its meaning, in :meth:`lf_parallel.Plan.describe`'s order."""


def _values(plan: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", plan.split(" (global batch")[0]))


def plan_legend(plans: list[str]) -> list[str]:
    """``key: meaning`` lines for the keys that the described ``plans`` (``Plan.describe()`` strings) use, in
    :data:`PLAN_KEYS` order, ``zero_stage`` always (left out, it is 0); the first plan with ``dp_replicate``
    gets its split worked out (``dp=64 dp_replicate=32: 32 HSDP replicas x 2-way sharding = 64-way data
    parallel``)."""
    used = {"zero_stage"}.union(*(_values(p) for p in plans))
    lines = [f"{key}: {meaning}" for key, meaning in PLAN_KEYS.items() if key in used]
    for plan in plans:
        v = _values(plan)
        if "dp_replicate" in v:
            dp, rep = int(v["dp"]), int(v["dp_replicate"])
            lines.append(f"e.g. dp={dp} dp_replicate={rep}: {rep} HSDP replicas x {dp // rep}-way sharding "
                         f"(ZeRO-{v.get('zero_stage', '0')}) = {dp}-way data parallel")
            break
    return lines


def zero_stage_line(zero_stage: int) -> str:
    """``ZeRO stage 0 (no sharding: every data-parallel rank holds ...)``."""
    return f"ZeRO stage {zero_stage} ({ZERO_STAGES[zero_stage]})"
