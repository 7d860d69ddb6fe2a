#!/usr/bin/env bash
# Runs the whole test suite: lint, then every library's tests in its own fresh virtualenv
# with only that library and its declared dependencies installed (see noxfile.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-osmesa.sh
python3 -m pip install -q "nox>=2024.4"
export MUJOCO_GL="${MUJOCO_GL:-osmesa}"
exec python3 -m nox -s lint tests "$@"
