"""``bench/kernels/varlen_docs.py --dry`` on the CPU: the benchmark's cases and FLOP accounting cannot rot.

Oracle: the documented cases (two causal document-length distributions, one image packing) and the kept-entry
count written out by hand for a small id row.
"""

import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "kernels" / "varlen_docs.py"


def test_varlen_docs_dry(tmp_path, monkeypatch):
    out = tmp_path / "varlen_dry.json"
    subprocess.run([sys.executable, str(SCRIPT), "--dry", "--out", str(out)], check=True, cwd=REPO,
                   capture_output=True)
    report = json.loads(out.read_text())
    assert [c["case"] for c in report["cases"]] == ["d_causal_docs_mean88", "d_causal_docs_mean1024",
                                                    "e_vision_images"]
    assert report["cases"][2]["documents"] == 8 and all("ms" in c["results"]["dispatcher"] for c in report["cases"])
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from varlen_docs import document_ids, kept

    ids = torch.tensor([[0, 0, 0, 1, 1, 2]])  # lengths 3, 2, 1
    assert kept(ids, causal=True) == 6 + 3 + 1 and kept(ids, causal=False) == 9 + 4 + 1
    row = document_ids(4096, 64.0, seed=0)
    assert row.shape == (1, 4096) and row[0, 0] == 0 and (row.diff() >= 0).all() and 40 < 4096 / (row.max() + 1) < 100
