#!/usr/bin/env bash
# Installs the Debian packages Scalify needs to build, test and plot (root on a fresh Debian 12).
# Fast no-op when everything is already there.
set -euo pipefail
packages=(cmake g++ make pkg-config zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
          libcli11-dev gnuplot-nox libdnnl-dev libopenblas-dev
          nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "scalify setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
