#!/usr/bin/env bash
# Installs LoongForge into ./.venv: the OS library for offscreen MuJoCo rendering (OSMesa),
# PyTorch, and every library of the monorepo (editable). Safe to run twice.
#   TORCH_SPEC   pip requirement for torch (default torch==2.13.0; any 2.11-2.13 build works)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-osmesa.sh
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e libs/lf-tokenize-action -e libs/lf-kernels -e libs/lf-ir \
  -e libs/lf-memory -e libs/lf-parallel -e "libs/lf-data[sim]" -e apps/lf-orchestrator
echo "installed: $(.venv/bin/lf --version)"
