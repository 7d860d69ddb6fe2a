"""Per-library sessions: each installs only that library and its declared LoongForge deps.

    nox -s lint tests                      # what CI runs (README quick-start 2)
    nox -s "tests(lib='lf-ir')"            # one library alone, in a fresh virtualenv
    nox -s "build(lib='lf-ir')"            # its wheel, into dist/
    nox -s demo                            # the default `lf run`
"""

from __future__ import annotations

import shutil

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False

TORCH = "torch==2.13.0"
"""Pinned for the sessions: the CPU build on the CI machines. The packages accept torch >= 2.11."""

# Library -> (folder, install extras, LoongForge libraries it depends on), in dependency order.
LIBS: dict[str, tuple[str, str, list[str]]] = {
    "lf-tokenize-action": ("libs/lf-tokenize-action", "", []),
    "lf-kernels": ("libs/lf-kernels", "[test]", []),
    "lf-ir": ("libs/lf-ir", "[test]", ["lf-kernels"]),
    "lf-memory": ("libs/lf-memory", "", ["lf-kernels", "lf-ir"]),
    "lf-parallel": ("libs/lf-parallel", "[test]", ["lf-kernels", "lf-ir", "lf-memory"]),
    "lf-data": ("libs/lf-data", "[sim,test]", ["lf-tokenize-action"]),
    "lf-orchestrator": ("apps/lf-orchestrator", "[test]", ["lf-tokenize-action", "lf-kernels", "lf-ir",
                                                     "lf-memory", "lf-parallel", "lf-data"]),
}
TEST_DEPS = ["pytest>=8", "hypothesis>=6"]


def _install(session: nox.Session, lib: str) -> str:
    folder, extras, deps = LIBS[lib]
    session.install(TORCH)
    targets = [LIBS[d][0] + (LIBS[d][1] if d == "lf-data" else "") for d in deps]
    session.install(*targets, folder + extras, *TEST_DEPS)
    return folder


@nox.session
@nox.parametrize("lib", list(LIBS))
def tests(session: nox.Session, lib: str) -> None:
    """Run one library's tests with only it and its declared dependencies installed.

    The virtualenv (torch alone is ~1 GB) is deleted when the session ends, pass or fail, so the whole suite
    needs the disk of one session at a time, not seven.
    """
    try:
        folder = _install(session, lib)
        session.env.setdefault("MUJOCO_GL", "osmesa")
        session.run("python", "-m", "pytest", f"{folder}/tests", "-q", "-rs", "-p", "no:cacheprovider",
                    *session.posargs)
    finally:
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over every library, app and the benchmarks."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "libs", "apps", "bench", "noxfile.py")
    session.run("python", "bench/report.py", "--check")


@nox.session
@nox.parametrize("lib", list(LIBS))
def build(session: nox.Session, lib: str) -> None:
    """Build one library's wheel into dist/."""
    session.install("build")
    session.run("python", "-m", "build", "--wheel", "--outdir", "dist", LIBS[lib][0])


@nox.session
def demo(session: nox.Session) -> None:
    """The default run: Meta-World demonstrations, VLA training, closed-loop evaluation."""
    _install(session, "lf-orchestrator")
    session.env.setdefault("MUJOCO_GL", "osmesa")
    session.run("lf", "run", *session.posargs)
