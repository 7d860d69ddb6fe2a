"""Imports of another package's private modules from the files outside the packages: tests and bench/.

A package's private module (a name starting with ``_``) is imported only from inside that package; the others use
its public ``__init__``. lint-imports checks the packages themselves (``.importlinter``), but it only sees
packages: the libraries' and the app's ``tests/`` folders and ``bench/`` are checked here. A library's own tests
may import its private modules, and so may ``bench/kernels/`` (lf-kernels' micro-benchmarks, which time its own
tile and block choices). Strings (code a test writes for a subprocess) are not read.

    python scripts/check_private_imports.py [ROOT]    # exit 1, one line per import found
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = {"lf_tokenize_action", "lf_kernels", "lf_ir", "lf_memory", "lf_parallel", "lf_data", "lf_orchestrator"}


def owner(rel: tuple[str, ...]) -> str | None:
    """The package a file (its path parts under the repository) belongs to, None for the rest of bench/."""
    if rel[0] in ("libs", "apps"):
        return rel[1].replace("-", "_")
    return "lf_kernels" if rel[:2] == ("bench", "kernels") else None


def private_imports(path: Path, own: str | None) -> list[str]:
    """``"path:line: module"`` for each import in ``path`` of a private module of a package other than ``own``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            private = [i for i, p in enumerate(parts) if i and p.startswith("_") and not p.startswith("__")]
            if parts[0] in PACKAGES and parts[0] != own and private:
                module, top = ".".join(parts[:private[0] + 1]), parts[0]
                found.append(f"{path}:{node.lineno}: imports {module}; use {top}'s public __init__ (export it there)")
                break
    return found


def main(root: Path) -> int:
    files = [*root.glob("libs/*/tests/**/*.py"), *root.glob("apps/*/tests/**/*.py"), *root.glob("bench/**/*.py")]
    found = [line for f in sorted(files) for line in private_imports(f, owner(f.relative_to(root).parts))]
    print("\n".join(found) or f"no private imports across packages in {len(files)} test and bench files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])))
