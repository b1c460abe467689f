#!/usr/bin/env bash
# The main job: build, print the format table and the SNR report (CSV + PNG in runs/snr), then
# train a small model with SCALIFY scale propagation in scaled f16 (Algorithm 1 of seed 000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build/apps/scalify/scalify formats
build/apps/scalify/scalify snr --out runs/snr
build/examples/algorithm1_training_step
