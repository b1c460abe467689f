#!/usr/bin/env bash
# The main job: build, print the machine, then `scalify compare` — one small GPT (about 0.1M
# parameters, 300 steps) trained on the default corpus (Debian's fortunes) under every seeded
# recipe in turn: FP32, SCALIFY FP16/FP8 #1-#4, unit scaling in FP32/FP16/FP8, per-tensor FP8
# (current, delayed, FP8-AMAX, FP8-CSCALE), MXFP8, blockwise, FP16 with loss scaling, the
# unscaled FP16/FP8 baselines, and FP4 (NVFP4, its ablations, MXFP4). Prints the table and the
# path of the report (report.md, summary.csv, delta.png, loss_delta.png, loss.png). About 5 minutes on 2
# cores; larger models: see docs/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cli=build/apps/scalify/scalify
$cli info
out=runs/compare
rm -rf "$out"
$cli compare --out "$out" --steps 300 \
  --set d_model=64 --set layers=2 --set heads=2 --set seq=64 --set batch=16 --set warmup=30 \
  --set eval_windows=256
