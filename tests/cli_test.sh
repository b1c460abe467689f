#!/usr/bin/env bash
# End-to-end checks of the scalify CLI as a user runs it.
set -euo pipefail
cli="$1"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$cli" --help | grep -q "formats"
"$cli" formats | grep -E "^e4m3 +8 +4 +3 +7 +448 " > /dev/null
"$cli" formats --csv | grep -q "^e5m2,8,5,2,15,57344,"

"$cli" snr --out "$out" --from -4 --to 4 --step 1 --samples 4096 --formats e4m3,fp8_e5m2 > "$out/log"
grep -q "INT8 scaled so 180 -> 127" "$out/log"
test "$(grep -c ',e4m3,' "$out/snr.csv")" -eq 9
test -s "$out/snr.png" || { echo "no plot written"; exit 1; }

# Unit-scaling factors: estimated values within 1 % of Table A.2.
"$cli" unit-factors --samples 200000 > "$out/factors"
grep -E "^gelu +1\.70[0-9]+ +1\.7010" "$out/factors" > /dev/null
test "$(grep -c '%' "$out/factors")" -eq 4
"$cli" scale-rules | grep -q "^| matmul |"

# info: the chosen paths follow the environment switches CI uses for the second pass.
"$cli" info > "$out/info"
for key in "scalify:" "cpu:" "cpu features:" "format kernels:" "gemm fp8 codes:" "threads:"; do
  grep -q "^$key" "$out/info" || { echo "info lacks $key"; exit 1; }
done
SCALIFY_ISA=scalar SCALIFY_GEMM=f32 "$cli" info > "$out/info_limited"
grep -q "^format kernels: scalar$" "$out/info_limited"
grep -q "^gemm fp8 codes: f32" "$out/info_limited"
if SCALIFY_GEMM=fp4 "$cli" info 2> "$out/err"; then echo "accepted SCALIFY_GEMM=fp4"; exit 1; fi
grep -q "SCALIFY_GEMM='fp4'" "$out/err"

# Bad input: an unknown format is a clear error naming it and listing the valid ones.
if "$cli" snr --out "$out" --formats e4m4 2> "$out/err"; then echo "accepted e4m4"; exit 1; fi
grep -q "unknown number format 'e4m4'" "$out/err"
grep -q "e5m2fnuz" "$out/err"
# compare: a tiny comparison end to end (f32 is added as the baseline), then bad input.
"$cli" compare --recipes current --steps 3 --out "$out/cmp" --set d_model=16 --set layers=1 --set heads=1 \
  --set seq=16 --set batch=2 --set eval_every=3 --set eval_windows=2 > "$out/cmp.log" 2> /dev/null
grep -q "^| f32 | ok |" "$out/cmp.log"
grep -q "^| current | ok |" "$out/cmp.log"
grep -q "report: $out/cmp/report.md" "$out/cmp.log"
test -s "$out/cmp/loss.png" || { echo "compare wrote no plot"; exit 1; }
if "$cli" compare --recipes f32,fp9 --out "$out/cmp2" 2> "$out/err"; then echo "accepted fp9"; exit 1; fi
grep -q "recipe 'fp9'" "$out/err"
test ! -e "$out/cmp2" || { echo "a bad recipe list left a folder"; exit 1; }
if "$cli" compare --resume "$out/none" 2> "$out/err"; then echo "resumed nothing"; exit 1; fi
grep -q "holds no comparison" "$out/err"
if "$cli" compare --resume "$out/cmp" --steps 5 2> "$out/err"; then echo "resume took --steps"; exit 1; fi
grep -q "drop --steps" "$out/err"
if "$cli" compare --recipes current --out "$out/cmp" 2> "$out/err"; then echo "overwrote a comparison"; exit 1; fi
grep -q "already holds a comparison" "$out/err"
echo "cli ok"
