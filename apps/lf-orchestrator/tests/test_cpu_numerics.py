"""`lf` pins the CPU kernels' instruction set before torch loads (repeatable seeded runs across processors).

Oracles: the environment the function writes, and what torch itself reports it runs
(``torch.backends.cpu.get_cpu_capability()``) in a fresh interpreter started through the `lf` entry point.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from lf_orchestrator._cpu_numerics import PINNED, _has_avx2, pin_cpu_isa

X86_AVX2 = platform.machine().lower() in ("x86_64", "amd64") and _has_avx2()


@pytest.mark.skipif(not X86_AVX2, reason="the pin applies to x86-64 processors with AVX2 only")
def test_pins_every_library_and_keeps_the_users_choice():
    env = {"MKL_CBWR": "COMPATIBLE"}
    added = pin_cpu_isa(env)
    assert env["MKL_CBWR"] == "COMPATIBLE", "a variable the user set must win"
    assert added == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert {k: env[k] for k in added} == added


def test_native_sets_nothing_and_a_typo_is_refused():
    env = {"LF_CPU_ISA": "native"}
    assert pin_cpu_isa(env) == {} and set(env) == {"LF_CPU_ISA"}
    with pytest.raises(ValueError, match="LF_CPU_ISA='avx512'.*'avx2'.*'native'"):
        pin_cpu_isa({"LF_CPU_ISA": "avx512"})


def _numerics_through_lf(extra_env: dict[str, str]) -> dict:
    """``cpu_numerics()`` in a fresh process whose first import of torch happens inside an `lf` command."""
    code = ("import sys; from typer.testing import CliRunner; import typer\n"
            "from lf_orchestrator.cli import app\n"
            "@app.command('probe-isa', hidden=True)\n"
            "def probe():\n"
            "    import json; from lf_orchestrator._cpu_numerics import cpu_numerics\n"
            "    print(json.dumps(cpu_numerics()))\n"
            "r = CliRunner().invoke(app, ['probe-isa']); print(r.output); sys.exit(r.exit_code)\n")
    env = {k: v for k, v in os.environ.items() if k not in (*PINNED, "LF_CPU_ISA")} | extra_env
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not X86_AVX2, reason="the pin applies to x86-64 processors with AVX2 only")
def test_lf_commands_run_avx2_kernels_whatever_the_processor_offers():
    """On an AVX-512 machine torch would pick AVX512 kernels; through `lf` it must run AVX2 ones. A user who set
    ATEN_CPU_CAPABILITY (here: the portable DEFAULT kernels) keeps their choice."""
    pinned = _numerics_through_lf({})
    assert pinned["cpu_capability"] == "AVX2"
    assert {k: pinned[k] for k in PINNED} == PINNED
    assert _numerics_through_lf({"ATEN_CPU_CAPABILITY": "default"})["cpu_capability"] == "DEFAULT"
