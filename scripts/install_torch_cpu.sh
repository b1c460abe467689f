#!/usr/bin/env bash
# Installs PyTorch from PyPI into the virtual environment VENV for CPU use: the PyPI wheel is the
# CUDA build, so torch goes in without its dependencies, then the pure-Python ones it imports,
# then the few CUDA libraries its CPU path still links (cuFile, cuSPARSELt, NVSHMEM, NCCL) at
# torch's pins. Used by the Python tests (DLPack) and bench/peers/step_vs_pytorch.sh.
#   scripts/install_torch_cpu.sh build/venv
set -euo pipefail
venv=$1
"$venv/bin/python" -c "import torch" 2>/dev/null && exit 0
"$venv/bin/pip" install -q --no-deps torch
"$venv/bin/pip" install -q numpy filelock typing-extensions sympy networkx jinja2 fsspec "setuptools>=77"
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  pins=$("$venv/bin/python" -c '
import importlib.metadata as m, re
for r in m.requires("torch") or []:
    p = re.match(r"(nvidia-(?:cusparselt|nvshmem|nccl)-cu[0-9]+)==([^ ;]+)", r)
    if p: print(p.group(1) + "==" + p.group(2))')
  "$venv/bin/pip" install -q --no-deps nvidia-cufile $pins
fi
"$venv/bin/python" -c "import torch"
