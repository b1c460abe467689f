#!/usr/bin/env bash
# Installs the Debian packages Scalify needs to build, test and plot (root on a fresh Debian 12).
# Fast no-op when everything is already there.
set -euo pipefail
packages=(
  cmake g++ make pkg-config
  clang-format               # the format check (scripts/check_format.sh)
  zlib1g-dev                 # gzip-compressed reference vectors in tests/data
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev               # the CLI's argument parser
  nlohmann-json3-dev         # recipes, metrics and checkpoint headers
  libtomlplusplus-dev        # training configuration files
  fortunes                   # the default training corpus: real English text, no download
  gnuplot-nox                # PNG plots (scalify snr, compare)
  libdnnl-dev                # oneDNN: f32 and bf16 GEMM
  libsleef-dev               # SLEEF: vectorised exp and tanh (GELU, softmax)
  libsentencepiece-dev       # SentencePiece: the tokenizers of Llama-family models (tokenizer.model)
  # oneDNN's CMake config (dnnl-config.cmake) calls find_package(OpenCL) even for the CPU-only
  # build; the package that satisfies it is only a Recommends of libdnnl-dev, which
  # --no-install-recommends skips, so it is named here.
  ocl-icd-opencl-dev
  libopenblas-dev            # bench_gemm compares oneDNN against OpenBLAS
  python3-venv python3-dev   # the Python package: its virtual environment and extension headers
  libopenmpi-dev openmpi-bin # data-parallel training (mpirun -np N scalify train) and its test
)
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
