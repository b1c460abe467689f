#!/usr/bin/env bash
# Every tracked C++ file is formatted as .clang-format says. Run by ctest (format); prints the
# files that differ and exits 1 when there is one. To fix: scripts/check_format.sh --fix.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then echo "clang-format is missing: scripts/setup.sh installs it"; exit 1; fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.inc' 2>/dev/null || find src apps tests bench examples -name '*.cpp' -o -name '*.hpp' -o -name '*.inc')
if [[ "${1:-}" == "--fix" ]]; then clang-format -i "${files[@]}"; exit 0; fi
status=0
for f in "${files[@]}"; do
  if ! clang-format "$f" | cmp -s - "$f"; then echo "$f: not formatted as .clang-format says (scripts/check_format.sh --fix)"; status=1; fi
done
(( status == 0 )) && echo "format: ${#files[@]} files as .clang-format says"
exit $status
