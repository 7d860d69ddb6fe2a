"""Pin the CPU kernels' instruction set so a seeded CPU run repeats on every machine of one kind.

PyTorch picks its CPU kernels at run time from the processor's vector instructions
(ATen's ``DEFAULT`` / ``AVX2`` / ``AVX512`` builds of each kernel; MKL and oneDNN do the
same for matrix products), and the kernels of two instruction sets sum in different orders.
A seeded run therefore gives bitwise-equal losses on one machine, but not on two machines of
the same kind whose processors differ (an AVX2 and an AVX-512 server, say): the rounding
differences of the first step compound over a run of a thousand steps into another model.

:func:`pin_cpu_isa` asks every library for its AVX2 code path (the instruction set every
x86-64 server of the last decade has) before torch is imported, unless the user set the
library's variable already or chose ``LF_CPU_ISA=native`` (the fastest kernels the processor
has, without cross-machine repeatability). The thread count matters too (``run.threads``:
reductions split over threads), so the run records both in ``plan.json``.
"""

from __future__ import annotations

import os
import platform

ISA_ENV = "LF_CPU_ISA"
"""``avx2`` (default: pin the kernels to AVX2 on x86-64) or ``native`` (the processor's best kernels)."""

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""The variables that pin ATen's, MKL's and oneDNN's CPU kernels to AVX2 (each read when torch loads)."""


def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


def pin_cpu_isa(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the AVX2-pinning variables in ``environ`` (default ``os.environ``) and return those set.

    Must run before ``import torch`` (ATen, MKL and oneDNN read them once). Does nothing on a
    processor that is not x86-64 with AVX2, under ``LF_CPU_ISA=native``, or for a variable the
    user set already (theirs wins).

    Raises:
        ValueError: ``LF_CPU_ISA`` is neither ``avx2`` nor ``native``.
    """
    env = os.environ if environ is None else environ
    choice = env.get(ISA_ENV, "avx2").strip().lower()
    if choice not in ("avx2", "native"):
        raise ValueError(f"{ISA_ENV}={env[ISA_ENV]!r}: expected 'avx2' (repeatable CPU numerics, the default) "
                         "or 'native' (the processor's fastest kernels)")
    if choice == "native" or platform.machine().lower() not in ("x86_64", "amd64") or not _has_avx2():
        return {}
    added = {k: v for k, v in PINNED.items() if k not in env}
    env.update(added)
    return added


def cpu_numerics() -> dict[str, object]:
    """What decides the CPU kernels' summation order in this process (for ``plan.json``): the ATen
    capability torch runs, the pinning variables and torch's intra-op thread count."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            **{k: os.environ.get(k) for k in (ISA_ENV, *PINNED)}}
