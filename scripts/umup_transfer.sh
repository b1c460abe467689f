#!/usr/bin/env bash
# Issue 47's learning-rate transfer study (docs/RESULTS.md "u-μP: does the learning rate transfer?"):
# lr sweeps over widths 64/128/256 (4 layers) and depths 2/4 (width 128), 300 steps each, one seed,
# on the default corpus, under the standard parametrisation (f32) and u-μP (umup, umup_fp8).
# Each recipe's grid spans nine powers of two around its optimum: u-μP's effective learning rates
# are lr times fan_in^-1/2 and depth^-1/2, so its best base lr (about 2^0, as the u-μP paper finds)
# sits far above the standard model's (2^-8). Rerunning skips finished cells.
# Usage: scripts/umup_transfer.sh [OUT]   (default runs/umup_transfer; about 40 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
scalify=${SCALIFY:-build/apps/scalify/scalify}
out=${1:-runs/umup_transfer}
common=(--steps 300 --set eval_every=300)
"$scalify" sweep --out "$out/f32_widths" --recipes f32 --vary lr=2^-12:2^-4 --widths 64,128,256 "${common[@]}"
"$scalify" sweep --out "$out/umup_widths" --recipes umup,umup_fp8 --vary lr=2^-6:2^2 --widths 64,128,256 "${common[@]}"
"$scalify" sweep --out "$out/f32_depths" --recipes f32 --vary lr=2^-12:2^-4 --widths 128 --depths 2,4 "${common[@]}"
"$scalify" sweep --out "$out/umup_depths" --recipes umup,umup_fp8 --vary lr=2^-6:2^2 --widths 128 --depths 2,4 "${common[@]}"
