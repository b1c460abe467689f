#!/usr/bin/env bash
# The main job: build, print the machine and the format table, then train a small GPT (~0.8M
# parameters) on the default corpus (Debian's fortunes) under SCALIFY FP8 (seed 000, Table 3 #3)
# and, as the reference, in f32 — same model, data and seed — evaluate both and sample from them.
# Run folders: runs/main_scalify_fp8_3 and runs/main_f32 (about 6 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
cli=build/apps/scalify/scalify
$cli info
$cli formats
for recipe in scalify_fp8_3 f32; do
  run=runs/main_$recipe
  rm -rf "$run"
  echo "== training under $recipe"
  $cli train --recipe "$recipe" --out "$run" --steps 600 \
    --set d_model=128 --set layers=4 --set heads=4 --set seq=64 --set batch=16 --set eval_every=200
  $cli eval "$run"
  $cli sample "$run" --prompt "The meaning of life is " --tokens 160 --seed 1
  echo "run folder: $run (config.toml, metrics.jsonl, train.log, checkpoint.safetensors, model.safetensors)"
done
