"""Per-library sessions: each installs only that library and its declared LoongForge deps.

    nox -s lint tests bench                # what CI runs (README quick-start 2)
    nox -s "tests(lib='lf-ir')"            # one library alone, in a fresh virtualenv
    nox -s "build(lib='lf-ir')"            # its wheel, into dist/
    nox -s demo                            # the default `lf run`
    nox -s "tests(lib='lf-ir')" -- -x      # arguments after -- go to pytest

Each test session prints its 25 slowest tests. The virtualenvs are made with uv when it is installed (`pip install
uv`), else with venv and pip; either way they install from the package sources pip is configured with.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import nox

nox.options.sessions = ["lint", "tests", "bench"]
# uv (`pip install uv`; scripts/test.sh does) creates the virtualenvs and installs from its cache: torch is unpacked
# once per machine, not once per session. Without uv, the standard library's venv and pip.
nox.options.default_venv_backend = "uv|venv"
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
TEST_DEPS = ["pytest>=8", "hypothesis>=6", "pytest-xdist>=3.5"]

# pytest-xdist workers per library: the two whose tests are long and spend much of their time starting Python
# processes (torchrun jobs, gloo worlds) and in small single-threaded steps, which two workers overlap (five of
# lf-parallel's gloo test files: 172 s -> 101 s on the 2-core machine). The shorter suites are slower on two
# workers (lf-kernels 121 s -> 182 s, lf-ir 34 s -> 61 s: each worker imports torch, transformers, diffusers and
# compiles its own flex-attention kernels). Each worker runs one test file at a time (--dist loadfile), so a
# module's fixtures (a gloo world's run) are built once.
WORKERS: dict[str, int] = {"lf-parallel": 2, "lf-orchestrator": 2, "bench": 2}

# pip's settings that choose where packages come from, and uv's flag for each. uv does not read pip's
# configuration, and the machines point pip at a local folder holding the CPU build of torch: uv must look in the
# same places, or it would download the CUDA build from the index.
_PIP_TO_UV = {"index-url": "--default-index", "extra-index-url": "--index", "find-links": "--find-links",
              "constraint": "--constraint", "no-index": "--no-index"}


def _uv_sources() -> list[str]:
    """uv flags for the package sources of pip's configuration (``pip config list``: its files and PIP_* variables).

    pip takes the best match over all its sources, so uv is told to as well (``--index-strategy
    unsafe-best-match``; uv's default stops at the first index that has the package at all).
    """
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=False).stdout
    pairs: dict[tuple[str, str], None] = {}  # ordered, without the repeats of a setting given twice
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        flag = _PIP_TO_UV.get(key.rpartition(".")[2])
        for item in ast.literal_eval(value).split() if flag and value else []:
            if flag != "--no-index":
                pairs[flag, item] = None
            elif item.lower() in ("1", "true", "yes", "on"):
                pairs[flag, ""] = None
    return ["--index-strategy", "unsafe-best-match", *(a for pair in pairs for a in pair if a)]


def _pip_install(session: nox.Session, *requirements: str) -> None:
    """``session.install`` from the sources pip is configured with, through uv or pip, whichever made the venv."""
    session.install(*(_uv_sources() if session.venv_backend == "uv" else []), *requirements)


def _install(session: nox.Session, lib: str) -> str:
    folder, extras, deps = LIBS[lib]
    targets = [LIBS[d][0] + (LIBS[d][1] if d == "lf-data" else "") for d in deps]
    _pip_install(session, TORCH, *targets, folder + extras, *TEST_DEPS)
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
        _pytest(session, f"{folder}/tests", WORKERS.get(lib, 0))
    finally:
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


def _pytest(session: nox.Session, folder: str, workers: int) -> None:
    session.env.setdefault("MUJOCO_GL", "osmesa")
    # One thread per worker when two share the cores (tests that need more set it themselves).
    if workers and "OMP_NUM_THREADS" not in os.environ:
        session.env["OMP_NUM_THREADS"] = "1"
    parallel = ["-n", str(workers), "--dist", "loadfile"] if workers else []
    session.run("python", "-m", "pytest", folder, "-q", "-rs", "-p", "no:cacheprovider",
                "--durations=25", *parallel, *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks' CPU dry runs (bench/tests), so the GPU scripts cannot rot: every library installed, as the
    benchmarks import several, and the peers they compare with (transformers). They live beside bench/, not in a
    library's tests, so each library's tests need nothing outside the library."""
    try:
        libs = [LIBS[lib][0] + LIBS[lib][1] for lib in LIBS if lib != "lf-orchestrator"]
        # transformers: the peer models (bench/qwen2_vl_peer.py is written against and tested with 5.24).
        _pip_install(session, TORCH, *libs, "transformers>=5.24,<6", *TEST_DEPS)
        _pytest(session, "bench/tests", WORKERS["bench"])
    finally:
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over every library, app and the benchmarks; the import contracts (``.importlinter``: the layers of
    DESIGN.md, and private modules imported only from inside their package) and the same rule for the tests and
    bench/ (scripts/check_private_imports.py, which lint-imports cannot see)."""
    _pip_install(session, "ruff>=0.6", "import-linter>=2.17", "pytest>=8")  # 2.17: the private_modules contract
    session.run("ruff", "check", "libs", "apps", "bench", "scripts", "noxfile.py")
    session.run("python", "bench/report.py", "--check")
    # lint-imports parses the sources (grimp) and imports none of them: the src folders on the path, no install.
    session.env["PYTHONPATH"] = os.pathsep.join(f"{folder}/src" for folder, _, _ in LIBS.values())
    session.run("lint-imports", "--no-cache")
    session.run("python", "scripts/check_private_imports.py")
    session.run("python", "-m", "pytest", "scripts/tests", "-q", "-p", "no:cacheprovider")


@nox.session
@nox.parametrize("lib", list(LIBS))
def build(session: nox.Session, lib: str) -> None:
    """Build one library's wheel into dist/."""
    _pip_install(session, "build")
    session.run("python", "-m", "build", "--wheel", "--outdir", "dist", LIBS[lib][0])


@nox.session
def demo(session: nox.Session) -> None:
    """The default run: Meta-World demonstrations, VLA training, closed-loop evaluation."""
    _install(session, "lf-orchestrator")
    session.env.setdefault("MUJOCO_GL", "osmesa")
    session.run("lf", "run", *session.posargs)
