#!/usr/bin/env bash
# Data parallelism end to end (train/data_parallel.hpp), as a user runs it: `mpirun -np 2`
# against one process. Usage: data_parallel_test.sh SCALIFY_CLI MPIRUN
# - exactness: 2 ranks of one micro-batch each give the checkpoint and final model of one process
#   accumulating the same 2 micro-batches, byte for byte (f32, a SCALIFY preset, delayed, mxfp8);
# - resume on another number of ranks: 1 process to step 6, then 2 ranks to step 12, equals 12
#   steps on one process;
# - low-precision gradient exchange: f32_allreduce_e4m3 trains, its metrics report the bytes a
#   rank sends, 1/4 of the f32 exchange's (checked against the formula), and its loss stays near f32's;
# - faults: a rank killed with -9 ends the run non-zero within a bounded time, leaving a valid
#   checkpoint; bad input (accum not divisible by the ranks, a missing corpus, a run folder that
#   holds a run) stops every rank with one clear error;
# - compare on 2 ranks gives one process's table; a command other than train and compare refuses.
set -euo pipefail
cli="$(realpath "$1")"
mpirun="$2"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
export OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1  # results are a function of the thread count: both sides use one
mpi2() { timeout 300 "$mpirun" --oversubscribe -np 2 "$cli" "$@"; }
tiny=(--set d_model=32 --set layers=2 --set heads=2 --set seq=16 --set batch=4 --set eval_windows=8 --set checkpoint_every=5
      --set eval_every=6 --set accum=2)
mkdir -p "$out/one" "$out/two"

for recipe in f32 scalify_fp8_3 delayed mxfp8; do
  (cd "$out/one" && "$cli" train --recipe $recipe --out $recipe --steps 12 "${tiny[@]}" > /dev/null 2>&1)
  (cd "$out/two" && mpi2 train --recipe $recipe --out $recipe --steps 12 "${tiny[@]}" > $recipe.log 2>&1) ||
    { cat "$out/two/$recipe.log"; exit 1; }
  for f in checkpoint.safetensors model.safetensors; do
    cmp "$out/one/$recipe/$f" "$out/two/$recipe/$f" || { echo "$recipe: 2 ranks' $f differs from one process's"; exit 1; }
  done
  # The validation losses (split over the ranks) are one process's too.
  diff <(grep val_loss "$out/one/$recipe/metrics.jsonl") <(grep val_loss "$out/two/$recipe/metrics.jsonl")
  grep -q "^data parallel: 2 processes (MPI)" "$out/two/$recipe/train.log"
  grep -q "^data parallel: 2 ranks" "$out/two/$recipe.log"
done

# Resume on another number of ranks continues the same run.
mkdir "$out/resumed"  # the same run folder name: the checkpoint's config holds it
(cd "$out/resumed" && "$cli" train --recipe delayed --out delayed --steps 6 "${tiny[@]}" > /dev/null 2>&1)
(cd "$out/resumed" && mpi2 train --resume delayed --steps 12 > resume.log 2>&1) || { cat "$out/resumed/resume.log"; exit 1; }
cmp "$out/one/delayed/model.safetensors" "$out/resumed/delayed/model.safetensors" ||
  { echo "1 process to step 6 then 2 ranks to 12 differs from 12 steps on one process"; exit 1; }

# Low-precision exchange: the bytes a rank sends per step, 2 (N-1)/N slices of one byte per
# gradient element plus 16 bytes per tensor (the f32 exchange: N-1 copies of 4 bytes per element).
(cd "$out/two" && mpi2 train --recipe f32_allreduce_e4m3 --out e4m3 --steps 12 "${tiny[@]}" > e4m3.log 2>&1) ||
  { cat "$out/two/e4m3.log"; exit 1; }
python3 - "$out/two" <<'PY'
import json, math, struct, sys
d = sys.argv[1]
def steps(run):
    return [j for j in map(json.loads, open(f"{d}/{run}/metrics.jsonl")) if "loss" in j]
with open(f"{d}/f32/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
sizes = [math.prod(v["shape"]) for k, v in header.items() if k.startswith("param.")]
f32, e4m3 = steps("f32"), steps("e4m3")
# In storage (f32): to the other rank a 24-byte header per tensor, then half of each tensor's
# 4-byte elements (rounded up) there and the sums back.
assert f32[0]["allreduce_bytes"] == 24 * len(sizes) + sum(8 * ((n + 1) // 2) for n in sizes), f32[0]
# e4m3: half the concatenated gradient, one byte per element, there and back, and 40 bytes per
# tensor (its header and two amax).
assert e4m3[0]["allreduce_bytes"] == 2 * ((sum(sizes) + 1) // 2) + 40 * len(sizes), e4m3[0]
l32, l8 = f32[-1]["loss"], e4m3[-1]["loss"]
assert abs(l8 - l32) < 0.02, (l32, l8)  # measured: 0.002 after 12 steps
PY

# compare on 2 ranks: the same table as on one process (the losses; timings differ), report from rank 0.
mkdir "$out/cmp1" "$out/cmp2"
cmp_args=(--recipes delayed --steps 6 "${tiny[@]}")
(cd "$out/cmp1" && "$cli" compare --out cmp "${cmp_args[@]}" > log 2>&1) || { cat "$out/cmp1/log"; exit 1; }
(cd "$out/cmp2" && mpi2 compare --out cmp "${cmp_args[@]}" > log 2>&1) || { cat "$out/cmp2/log"; exit 1; }
diff <(cut -d, -f1-11 "$out/cmp1/cmp/summary.csv") <(cut -d, -f1-11 "$out/cmp2/cmp/summary.csv")
grep -q "processes: 2 processes (MPI)" "$out/cmp2/cmp/report.md"

# Faults: kill -9 of rank 1 mid-run: the run ends non-zero, quickly, and the checkpoint it left loads.
cd "$out/two"
"$mpirun" --oversubscribe -np 2 "$cli" train --recipe f32 --out killed --steps 100000 "${tiny[@]}" > killed.log 2>&1 &
mpirun_pid=$!
cd - > /dev/null
for _ in $(seq 600); do [[ -f "$out/two/killed/checkpoint.safetensors" ]] && break; sleep 0.1; done
rank1=$(pgrep -f "scalify train --recipe f32 --out killed" | while read -r p; do
  grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/"$p"/environ 2>/dev/null && echo "$p"; done | head -1)
[[ -n "$rank1" ]] || { echo "no rank 1 process found"; exit 1; }
kill -9 "$rank1"
start=$SECONDS
while kill -0 $mpirun_pid 2>/dev/null; do
  (( SECONDS - start < 60 )) || { echo "the run did not end within 60 s of a rank's death"; kill -9 $mpirun_pid; exit 1; }
  sleep 0.2
done
if wait $mpirun_pid; then echo "mpirun exited 0 after a rank was killed"; exit 1; fi
"$cli" eval "$out/two/killed" > /dev/null
if ls "$out/two/killed" | grep -q tmp; then echo "a temporary file was left behind"; ls "$out/two/killed"; exit 1; fi

# Bad input stops every rank with one clear error and a non-zero exit.
expect_error() {  # pattern, then the command's arguments
  local pattern="$1"; shift
  if (cd "$out/two" && mpi2 "$@" > bad.log 2>&1); then echo "accepted: $*"; exit 1; fi
  grep -q "$pattern" "$out/two/bad.log" || { echo "no '$pattern' in:"; cat "$out/two/bad.log"; exit 1; }
}
expect_error "cannot be split evenly over 2 ranks" train --out odd --steps 2 "${tiny[@]}" --set accum=3
expect_error "no-such-corpus" train --out nodata --steps 2 "${tiny[@]}" --data no-such-corpus
expect_error "already holds a run" train --out f32 --steps 2 "${tiny[@]}"
expect_error "'eval' runs on one process" eval f32
echo "data parallel: all checks passed"
