"""The parallel plan: degrees of every parallelism, the batch split, and per-component overrides.

A :class:`Plan` is what the auto-tuner returns and what a config may pin. The
processes of a job form a grid ``pp x dp_replicate x dp_shard x cp x tp``
(``dp = dp_replicate * dp_shard``); :func:`lf_parallel.build_mesh` turns the
non-pipeline part into a named ``DeviceMesh``. Batches split as

    global_batch = dp * micro_batch * grad_accum

Validation (:mod:`lf_parallel._plan_check`) fails before launch, naming the
constraint that broke and a valid nearby plan. :func:`parse_plan` reads the
command-line form ``"tp=2,pp=2,dp=2,zero=3,vision.tp=1"``.
"""

from __future__ import annotations

import difflib
import typing
from typing import Literal

import msgspec

PPSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"]
CPKind = Literal["ring", "ulysses", "ring+ulysses"]
Precision = Literal["fp32", "bf16", "fp16"]


class PlanError(ValueError):
    """A plan that cannot run; the message says which constraint broke and a valid plan."""


class ComponentPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Overrides for one IR component (e.g. a VLM's vision encoder); None keeps the plan's value."""

    tp: int | None = None
    """Tensor-parallel degree of this component: 1 (replicated over the tp mesh dim) or the plan's tp."""
    sp: bool | None = None
    """Sequence parallel for this component (needs its tp > 1)."""


class Plan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A hybrid parallel plan (data, ZeRO, tensor + sequence, pipeline, context parallel).

    Example:
        >>> Plan(dp=2, tp=2, zero_stage=3, micro_batch=4).describe()
        'dp=2 zero_stage=3 tp=2 micro_batch=4 grad_accum=1 (global batch 8)'
    """

    dp: int = 1
    """Data-parallel degree: model replicas that each see a different slice of the batch."""
    dp_replicate: int = 1
    """With ZeRO-2/3: replica groups of the sharded model (HSDP, ``dp_shard = dp / dp_replicate``);
    1 shards over all of ``dp``. Must be 1 with ZeRO-0/1 (every dp rank holds the parameters)."""
    zero_stage: int = 0
    """0: DDP; 1: sharded optimizer state; 2: + sharded gradients; 3: + sharded parameters."""
    tp: int = 1
    """Tensor-parallel degree (Megatron-LM, arXiv 1909.08053)."""
    sp: bool = False
    """Sequence parallel with TP: norms and residuals split along the sequence (arXiv 2205.05198)."""
    pp: int = 1
    """Pipeline-parallel stages per model replica."""
    pp_schedule: PPSchedule = "1f1b"
    """Pipeline schedule."""
    pp_virtual_stages: int = 1
    """Stages per pipeline rank (interleaved schedules; 1 otherwise)."""
    cp: int = 1
    """Context-parallel degree: the sequence of one sample split over ranks."""
    cp_kind: CPKind = "ring"
    """Context-parallel attention: ring (KV passing), ulysses (all-to-all heads) or both."""
    micro_batch: int = 1
    """Samples per data-parallel rank per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (the pipeline's micro-batches when pp > 1)."""
    precision: Precision = "fp32"
    """Parameter/compute dtype under ZeRO-2/3 (``MixedPrecisionPolicy``); reductions stay fp32."""
    components: dict[str, ComponentPlan] = {}
    """Per-component overrides by IR component name, e.g. ``{"vision": ComponentPlan(tp=1)}``."""

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.grad_accum

    @property
    def dp_shard(self) -> int:
        """Size of the FSDP sharding dim (ZeRO-2/3: ``dp / dp_replicate``; 1 for ZeRO-0/1, whose ranks
        all hold the parameters: ZeRO-1 shards only optimizer state, over all ``dp`` ranks)."""
        return self.dp // max(self.dp_replicate, 1) if self.zero_stage >= 2 else 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def component_tp(self, name: str) -> int:
        """Tensor-parallel degree of component ``name``."""
        override = self.components.get(name)
        return self.tp if override is None or override.tp is None else override.tp

    def component_sp(self, name: str) -> bool:
        """Whether component ``name`` runs sequence parallel."""
        override = self.components.get(name)
        sp = self.sp if override is None or override.sp is None else override.sp
        return sp and self.component_tp(name) > 1

    def describe(self) -> str:
        """One line with the degrees that differ from the defaults, e.g.
        ``dp=2 micro_batch=16 grad_accum=2 (global batch 64)``."""
        parts = [f"dp={self.dp}"]
        defaults = Plan()
        for key in ("dp_replicate", "zero_stage", "tp", "sp", "pp", "pp_schedule", "pp_virtual_stages",
                    "cp", "cp_kind", "precision"):
            value = getattr(self, key)
            if key == "pp_schedule" and self.pp == 1 or key == "cp_kind" and self.cp == 1:
                continue
            if value != getattr(defaults, key):
                parts.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
        for comp, override in sorted(self.components.items()):
            parts += [f"{comp}.{k}={getattr(override, k)}" for k in ("tp", "sp") if getattr(override, k) is not None]
        parts += [f"micro_batch={self.micro_batch}", f"grad_accum={self.grad_accum}"]
        return " ".join(parts) + f" (global batch {self.global_batch})"


_ALIASES = {"zero": "zero_stage", "schedule": "pp_schedule", "vpp": "pp_virtual_stages", "mb": "micro_batch"}
_CHOICES = {"pp_schedule": typing.get_args(PPSchedule), "cp_kind": typing.get_args(CPKind),
            "precision": typing.get_args(Precision)}
"""The accepted values of :class:`Plan`'s enum fields, for parse_plan's errors."""
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def parse_plan(text: str, **defaults) -> Plan:
    """A plan from ``"key=value,..."`` (e.g. ``"tp=2,sp=1,dp=2,zero=3,vision.tp=1"``).

    Keys are :class:`Plan` fields (aliases: ``zero``, ``schedule``, ``vpp``, ``mb``),
    ``dp_shard`` (sets ``dp = dp_replicate * dp_shard``), or ``<component>.tp`` /
    ``<component>.sp`` overrides. ``defaults`` are field values the string may override.

    Raises:
        PlanError: naming the key that is unknown, repeated or has a bad value.
    """
    fields: dict = dict(defaults)
    comps: dict[str, dict] = {}
    dp_shard = None
    seen: set[str] = set()
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not raw:
            raise PlanError(f"plan {text!r}: item {item!r} is not key=value")
        if key in seen:
            raise PlanError(f"plan {text!r}: key {key!r} given twice")
        seen.add(key)
        if "." in key:
            comp, _, sub = key.partition(".")
            if sub not in ("tp", "sp"):
                raise PlanError(f"plan {text!r}: unknown component key {key!r}; expected {comp}.tp or {comp}.sp")
            comps.setdefault(comp, {})[sub] = _value(text, key, raw, bool if sub == "sp" else int)
            continue
        key = _ALIASES.get(key, key)
        if key == "dp_shard":
            dp_shard = _value(text, key, raw, int)
            continue
        if key not in Plan.__struct_fields__ or key == "components":
            known = sorted({*Plan.__struct_fields__, "dp_shard", *_ALIASES} - {"components"})
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PlanError(f"plan {text!r}: unknown key {key!r}{hint}; expected one of {known}")
        kind = {"sp": bool, "pp_schedule": str, "cp_kind": str, "precision": str}.get(key, int)
        fields[key] = _value(text, key, raw, kind)
    if dp_shard is not None:
        if "dp" in seen:
            raise PlanError(f"plan {text!r}: give dp or dp_shard, not both")
        fields["dp"] = dp_shard * fields.get("dp_replicate", 1)
    if comps:
        fields["components"] = {c: ComponentPlan(**v) for c, v in comps.items()}
    for key, choices in _CHOICES.items():  # enum fields: name the key and list what it takes
        if key in fields and fields[key] not in choices:
            raise PlanError(f"plan {text!r}: {key}: expected one of {', '.join(map(repr, choices))}, "
                            f"got {fields[key]!r}")
    try:
        return msgspec.convert(fields, Plan)
    except msgspec.ValidationError as err:
        raise PlanError(f"plan {text!r}: {err}") from None


def _value(text: str, key: str, raw: str, kind: type):
    if kind is bool:
        if raw.lower() not in _BOOL:
            raise PlanError(f"plan {text!r}: {key} must be true/false, got {raw!r}")
        return _BOOL[raw.lower()]
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise PlanError(f"plan {text!r}: {key} must be an integer, got {raw!r}") from None
    return raw


def choose_plan(*, world_size: int, global_batch: int, max_micro_batch: int) -> Plan:
    """The data-parallel plan with the largest micro-batch <= ``max_micro_batch``.

    Raises:
        PlanError: if ``global_batch`` is not divisible by ``world_size``.
    """
    if world_size < 1 or global_batch < 1 or max_micro_batch < 1:
        raise PlanError(f"world_size, global_batch and max_micro_batch must be >= 1, got "
                        f"{world_size}, {global_batch}, {max_micro_batch}")
    if global_batch % world_size:
        lower = global_batch - global_batch % world_size or world_size
        raise PlanError(f"train.global_batch={global_batch} is not divisible by the "
                        f"{world_size} data-parallel processes; use {lower} or "
                        f"{lower + world_size}")
    per_rank = global_batch // world_size
    accum = next(a for a in range(1, per_rank + 1)
                 if per_rank % a == 0 and per_rank // a <= max_micro_batch)
    return Plan(dp=world_size, micro_batch=per_rank // accum, grad_accum=accum)


from lf_parallel._plan_check import check_plan  # noqa: E402  (re-exported; it needs Plan defined above)

__all__ = ["CPKind", "ComponentPlan", "PPSchedule", "Plan", "PlanError", "Precision", "check_plan", "choose_plan",
           "parse_plan"]
