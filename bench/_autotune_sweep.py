"""Which plans ``bench/autotune_check.py`` measures, how long that takes, and the sweep's summary.

A sweep space (``--sweep``) bounds the tuner's own ranking (``search_plans`` over every plan it considers, memory
pruning included) to a few ZeRO stages, recompute modes and micro-batches:

- ``tiny``: ZeRO 0 / 3, recompute ``full``, micro-batch 1 (2 GPUs, llama3: 4 plans);
- ``small``: ZeRO 0 / 3, recompute ``none`` / ``full``, micro-batch 1 (2 GPUs, llama3: 8-10 plans);
- ``medium``: ZeRO 0-3, recompute ``none`` / ``selective`` / ``full``, micro-batch 1 / 2.

On one GPU only ZeRO-0 is kept (the other stages are the same plan there). Pipeline plans are not measured
(the check runs one module per rank), nor cp plans of a model without a context-parallel loss; such plans are
listed with the reason. ``--exhaustive`` measures every remaining plan; otherwise the ``--top`` first.
"""

from __future__ import annotations

import statistics

SWEEPS = {
    "tiny": {"zero": (0, 3), "recompute": ("full",), "micro_batch": (1,)},
    "small": {"zero": (0, 3), "recompute": ("none", "full"), "micro_batch": (1,)},
    "medium": {"zero": (0, 1, 2, 3), "recompute": ("none", "selective", "full"), "micro_batch": (1, 2)},
}
"""``--sweep`` -> the ZeRO stages, recompute modes and micro-batches measured."""
SETUP_S = {"llama3": 25.0, "qwen2_vl": 30.0, "wan_dit": 20.0}
"""Seconds per plan outside the timed steps on an H200 (build on meta, materialize, wrap, first CUDA graphs of
the warm-up), by model; a rough figure for the time estimate only."""
START_S = 60.0
"""Process start, imports, NCCL set-up and calibration of one job, seconds."""


def unmeasured(cand, world: int, has_cp_loss: bool) -> str | None:
    """Why the check does not measure ``cand`` (None: it does)."""
    plan = cand.plan
    if plan.pp > 1:
        return "pp > 1: the check runs one module per rank (bench/llama3_parallel.py measures pipelines)"
    if plan.cp > 1 and not has_cp_loss:
        return "cp > 1: no context-parallel loss for this model in the check"
    if plan.dp_replicate > 1:
        return "HSDP: one node only"
    return None


def select(ranked, space: str, world: int, has_cp_loss: bool) -> tuple[list, list[dict]]:
    """(candidates to measure in ranking order, skipped ``{plan, recompute, why}``) of the sweep ``space`` (a
    :data:`SWEEPS` key, or ``"any"``: every plan of the ranking)."""
    want = SWEEPS.get(space)  # None ("any"): the ranking as it is
    keep, skipped, seen = [], [], set()
    for cand in ranked:
        plan = cand.plan
        if want is None and world == 1 and plan.zero_stage:
            continue
        if want is not None and (plan.zero_stage not in want["zero"] or cand.recompute not in want["recompute"]
                or plan.micro_batch not in want["micro_batch"] or (world == 1 and plan.zero_stage)):
            continue
        key = (plan.describe(), cand.recompute)
        if key in seen:
            continue
        seen.add(key)
        why = unmeasured(cand, world, has_cp_loss)
        if why:
            skipped.append({"plan": plan.describe(), "recompute": cand.recompute, "why": why})
        else:
            keep.append(cand)
    return keep, skipped


def estimate_s(cands, model: str, warmup: int, steps: int) -> float:
    """Rough GPU seconds of measuring ``cands`` (predicted step times, :data:`SETUP_S`, :data:`START_S`)."""
    return START_S + sum(SETUP_S[model] + (warmup + steps) * 1.3 * c.cost.step_s for c in cands)


def summary(rows: list[dict]) -> dict:
    """The tuner's choice against the sweep: the first measured plan of the ranking (``chosen``), the fastest
    measured (``best``), ``chosen_fraction_of_best`` = best step / chosen step (throughput ratio), and the
    median and worst relative error of the predicted step."""
    done = [r for r in rows if "step_s" in r.get("measured", {})]
    if not done:
        return {"measured": 0}
    chosen = done[0]
    best = min(done, key=lambda r: r["measured"]["step_s"])
    errors = [abs(r["error"]["step_default"]) for r in done]
    rank_pred = sorted(range(len(done)), key=lambda i: done[i]["predicted_default"]["step_s"])
    rank_meas = sorted(range(len(done)), key=lambda i: done[i]["measured"]["step_s"])
    return {"measured": len(done), "chosen": {"plan": chosen["plan"], "recompute": chosen["recompute"],
                                              "step_s": chosen["measured"]["step_s"]},
            "best": {"plan": best["plan"], "recompute": best["recompute"], "step_s": best["measured"]["step_s"]},
            "chosen_fraction_of_best": best["measured"]["step_s"] / chosen["measured"]["step_s"],
            "median_abs_step_error": statistics.median(errors), "max_abs_step_error": max(errors),
            "same_order": rank_pred == rank_meas}
