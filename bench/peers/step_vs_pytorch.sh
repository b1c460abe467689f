#!/usr/bin/env bash
# Engine vs PyTorch training step (issue 15): builds the engine, installs CPU PyTorch from PyPI
# into its own virtual environment (a benchmark dependency only: never needed by the build or the
# tests), prints `scalify info`, then the alternating comparison of step_ratio.py.
#   bench/peers/step_vs_pytorch.sh                       # three sizes, f32, 3 rounds
#   bench/peers/step_vs_pytorch.sh --sizes small --recipes f32,current,scalify_fp8_3 --rounds 2
# With --under-load first it runs step_under_load.py instead (step_under_load.sh).
set -euo pipefail
script=step_ratio.py
if [[ "${1:-}" == --under-load ]]; then
  script=step_under_load.py
  shift
fi
cd "$(dirname "$0")/../.."
venv=${SCALIFY_PEERS_VENV:-$HOME/.cache/scalify-peers-venv}
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then  # Debian splits venv (ensurepip) out
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
  scripts/install_torch_cpu.sh "$venv"
fi
scripts/build.sh
build/apps/scalify/scalify info
"$venv/bin/python" -c "import torch; print('pytorch:', torch.__version__, torch.backends.cpu.get_cpu_capability())"
exec "$venv/bin/python" "bench/peers/$script" --python "$venv/bin/python" "$@"
