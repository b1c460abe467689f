#!/usr/bin/env bash
# The library's floors, bottom to top: a folder of src/scalify may include its own headers, the
# top-level ones (error.hpp, note.hpp) and those of folders on floors below it, never one above:
# so no folder-level cycle can form. A new folder must be given its floor here. Run by ctest
# (include_floors); prints every upward include and exits 1 when there is one.
set -euo pipefail
cd "$(dirname "$0")/../src/scalify"
floors=(platform formats tensor scaled autograd io tokenize report unit optim quant nn hub train inspect compare)
declare -A rank
for i in "${!floors[@]}"; do rank[${floors[$i]}]=$i; done
status=0
for dir in */; do
  dir=${dir%/}
  if [[ -z "${rank[$dir]+set}" ]]; then echo "src/scalify/$dir has no floor in scripts/check_include_floors.sh"; status=1; continue; fi
  while IFS=: read -r file line text; do
    target=$(sed -n 's|.*#include "scalify/\([a-z_0-9]*\)/.*|\1|p' <<< "$text")
    [[ -z "$target" || "$target" == "$dir" ]] && continue
    if [[ -z "${rank[$target]+set}" ]]; then echo "$file:$line includes unknown folder '$target'"; status=1; continue; fi
    if (( rank[$target] > rank[$dir] )); then
      echo "src/scalify/$file:$line: $dir (floor ${rank[$dir]}) includes $target (floor ${rank[$target]}), a floor above it"
      status=1
    fi
  done < <(grep -Hn '#include "scalify/' "$dir"/*.hpp "$dir"/*.cpp "$dir"/*.inc 2>/dev/null || true)
done
(( status == 0 )) && echo "include floors: no folder includes one above it (${floors[*]})"
exit $status
