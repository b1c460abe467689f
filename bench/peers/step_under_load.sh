#!/usr/bin/env bash
# Engine vs PyTorch training step beside busy processes (issue 42): the setup of step_vs_pytorch.sh
# (build, CPU PyTorch in its own virtual environment, `scalify info`), then step_under_load.py.
#   bench/peers/step_under_load.sh                      # alone and beside 1, 2, 4 busy processes, 3 rounds
#   bench/peers/step_under_load.sh --busy 2 --rounds 5 --columns engine,PyTorch
exec "$(dirname "$0")/step_vs_pytorch.sh" --under-load "$@"
