#!/usr/bin/env bash
# The main job: build, then print the format table and the SNR report (CSV + PNG in runs/snr).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build/apps/scalify/scalify formats
build/apps/scalify/scalify snr --out runs/snr
