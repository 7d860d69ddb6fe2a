#!/usr/bin/env bash
# Runs the whole test suite: lint, then every library's tests in its own fresh virtualenv
# with only that library and its declared dependencies installed (see noxfile.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-osmesa.sh
# Each library's session installs torch (~1 GB) into a fresh virtualenv (deleted when it ends): say how much disk
# there is, so a "No space left on device" in the log is read as the machine's, not the code's.
echo "disk free where the sessions run: $(df -h --output=avail . | tail -n 1 | tr -d ' ')" >&2
# A one-node Slurm cluster on localhost, so `lf launch --backend slurm` runs a real job in the tests
# (best effort: without root or the Debian packages that one test is skipped, and says so).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  bash scripts/ci-slurm.sh || echo "warning: local Slurm did not start; the Slurm launch test will be skipped" >&2
fi
python3 -m pip install -q "nox>=2024.4"
# uv makes each session's virtualenv and installs into it from its cache (torch is unpacked once, then linked);
# without it the sessions fall back to venv and pip, slower but the same packages (noxfile.py).
python3 -m pip install -q "uv>=0.5" || echo "warning: uv did not install; the sessions use venv and pip" >&2
export MUJOCO_GL="${MUJOCO_GL:-osmesa}"
exec python3 -m nox -s lint tests bench "$@"
