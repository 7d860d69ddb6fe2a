"""scripts/check_private_imports.py on a small tree written here, and on this repository.

Oracle: the rule in the script's docstring, case by case: another package's private module is flagged (``import``,
``from ... import`` and a private name imported from a package), a library's own tests and ``bench/kernels/`` with
lf-kernels are not, and the repository itself has none (its exit status is 0).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "check_private_imports.py"

FILES = {
    "libs/lf-ir/tests/test_own.py": "from lf_ir._table import graph_cost\n",  # its own package: allowed
    "libs/lf-memory/tests/test_other.py": "import torch\nfrom lf_ir._table import graph_cost\n",  # flagged, line 2
    "apps/lf-orchestrator/tests/test_x.py": "import lf_parallel._checkpoint as ck\nfrom lf_ir import _fused\n",
    "bench/peer.py": "from lf_ir import graph_cost\nfrom lf_memory.__init__ import plan_recompute\n",  # public
    "bench/kernels/sweep.py": "from lf_kernels.triton._layout import cdiv\n",  # lf-kernels' own benchmarks
    "bench/kernels/other.py": "from lf_ir._mask import as_mask\n",  # but not another package's
}


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, check=False)


def test_flags_each_private_import_across_packages(tmp_path):
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    out = _run(tmp_path)
    assert out.returncode == 1
    lines = sorted(line.removeprefix(str(tmp_path) + "/") for line in out.stdout.splitlines())
    assert [line.split(";")[0] for line in lines] == [
        "apps/lf-orchestrator/tests/test_x.py:1: imports lf_parallel._checkpoint",
        "apps/lf-orchestrator/tests/test_x.py:2: imports lf_ir._fused",
        "bench/kernels/other.py:1: imports lf_ir._mask",
        "libs/lf-memory/tests/test_other.py:2: imports lf_ir._table",
    ]
    assert all(line.endswith("use lf_ir's public __init__ (export it there)") for line in lines if "lf_ir" in line)


def test_this_repository_has_none():
    out = _run(SCRIPT.parents[1])
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith("no private imports across packages in ")
