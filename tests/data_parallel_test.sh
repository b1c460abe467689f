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
# - ranks that disagree (an MPMD launch: steps, eval_every, recipe, command, kernel ISA; per-rank
#   folders: corpus, recipe file, checkpoint, --init model) stop before the first step with one message naming
#   what differs; a rank stopped with SIGSTOP ends the run with a message naming it;
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

# Ranks that disagree stop together before the first step, with one message naming what differs:
# an MPMD launch (A : B) gives each rank its own arguments, environment (-x) or folder (-wdir,
# where relative paths name other files, as on another machine).
expect_ranks_disagree() {  # the message, then mpirun's arguments
  local message="$1"; shift
  if (cd "$out/two" && timeout 300 "$mpirun" --oversubscribe "$@" > bad.log 2>&1); then echo "accepted: $*"; exit 1; fi
  grep -qF "scalify: error: $message" "$out/two/bad.log" || { echo "no '$message' in:"; cat "$out/two/bad.log"; exit 1; }
  if grep -q "MPI_ERR" "$out/two/bad.log"; then echo "an MPI error beside the message:"; cat "$out/two/bad.log"; exit 1; fi
}
run=(train --out differ --steps 12 "${tiny[@]}")
expect_ranks_disagree "ranks disagree on steps: rank 0 has 12, rank 1 has 13" -np 1 "$cli" "${run[@]}" : -np 1 "$cli" "${run[@]}" --set steps=13
expect_ranks_disagree "ranks disagree on eval_every: rank 0 has 6, rank 1 has 4" \
  -np 1 "$cli" "${run[@]}" : -np 1 "$cli" "${run[@]}" --set eval_every=4
expect_ranks_disagree "ranks disagree on recipe: rank 0 has 'f32', rank 1 has 'delayed'" \
  -np 1 "$cli" "${run[@]}" : -np 1 "$cli" "${run[@]}" --recipe delayed
expect_ranks_disagree "ranks disagree on the command: rank 0 has 'train', rank 1 has 'eval'" -np 1 "$cli" "${run[@]}" : -np 1 "$cli" eval f32
expect_ranks_disagree "ranks disagree on the command: rank 0 has 'compare', rank 1 has 'train'" \
  -np 1 "$cli" compare --out differ --steps 2 "${tiny[@]}" : -np 1 "$cli" "${run[@]}"
# Arguments that rank 1 alone refuses end the run at once, not when rank 0's wait times out.
if (cd "$out/two" && timeout 300 "$mpirun" --oversubscribe -np 1 "$cli" "${run[@]}" : -np 1 "$cli" "${run[@]}" --steps 13 > bad.log 2>&1); then
  echo "accepted --steps twice"; exit 1
fi
grep -q -- "--steps: At Most 1 required but received 2" "$out/two/bad.log" || { cat "$out/two/bad.log"; exit 1; }
if grep -q "does not answer" "$out/two/bad.log"; then echo "ended by the collective timeout:"; cat "$out/two/bad.log"; exit 1; fi
# Another kernel ISA on rank 1 (SCALIFY_ISA=scalar differs from any this test runs under).
isa=$("$cli" info | sed -n 's/^format kernels: //p')
[[ "$isa" != scalar ]] || { echo "the kernels here are scalar: the ISA check needs another"; exit 1; }
expect_ranks_disagree "ranks disagree on 'format kernels' (scalify info): rank 0 has $isa, rank 1 has scalar" \
  -np 1 "$cli" "${run[@]}" : -np 1 -x SCALIFY_ISA=scalar "$cli" "${run[@]}"
# Each rank in its own folder (a machine of its own) with its own copy of a corpus, recipe file
# or run folder of the same name.
for w in w0 w1; do mkdir "$out/two/$w"; done
seq 1 20000 > "$out/two/w0/corpus.txt"
seq 2 20001 > "$out/two/w1/corpus.txt"
local_run=(train --out differ --steps 12 --data corpus.txt "${tiny[@]}")
expect_ranks_disagree "ranks disagree on the corpus: rank 0 has CRC-32C" \
  -np 1 -wdir "$out/two/w0" "$cli" "${local_run[@]}" : -np 1 -wdir "$out/two/w1" "$cli" "${local_run[@]}"
grep -qF "rank 1 has CRC-32C" "$out/two/bad.log"
python3 - "$out/two" <<'PY'
import json, struct, sys
d = sys.argv[1]
with open(f"{d}/f32/model.safetensors", "rb") as f:  # a valid recipe file: the f32 run's recipe, renamed
    recipe = json.loads(json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]["recipe"])
for w in ("w0", "w1"):
    json.dump(dict(recipe, name=f"mine_{w}"), open(f"{d}/{w}/mine.json", "w"))
PY
expect_ranks_disagree 'ranks disagree on the recipe'"'"'s name: rank 0 has "mine_w0", rank 1 has "mine_w1"' \
  -np 1 -wdir "$out/two/w0" "$cli" "${local_run[@]}" --recipe mine.json : -np 1 -wdir "$out/two/w1" "$cli" "${local_run[@]}" --recipe mine.json
grep -qF "give every rank the same recipe" "$out/two/bad.log"
# The same config, corpus and step, yet checkpoints that differ (trained on other text before).
for w in w0 w1; do (cd "$out/two/$w" && "$cli" train --out stale --steps 6 --data corpus.txt "${tiny[@]}" > /dev/null 2>&1); done
cp "$out/two/w0/corpus.txt" "$out/two/w1/corpus.txt"
expect_ranks_disagree "ranks disagree on the parameters at step 6: rank 0 has CRC-32C" \
  -np 1 -wdir "$out/two/w0" "$cli" train --resume stale --steps 12 : -np 1 -wdir "$out/two/w1" "$cli" train --resume stale --steps 12
# An --init model of the same name whose weights differ by one bit: a run records its init folder's
# absolute path and the CRC-32C of its files (train/init_record), so the ranks disagree on the init
# before a weight is read.
for w in w0 w1; do cp -r "$(dirname "$0")/data/hf/tiny_gpt2" "$out/two/$w/init"; done
python3 - "$out/two/w1/init/model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
b[8 + n + json.loads(b[8 : 8 + n])["wte.weight"]["data_offsets"][0]] ^= 4
open(sys.argv[1], "wb").write(b)
PY
init_run=(train --init init --data corpus.txt --out tuned --steps 4 --set batch=2 --set accum=2 --set eval_windows=2)
expect_ranks_disagree "ranks disagree on init: rank 0 has '$out/two/w0/init', rank 1 has '$out/two/w1/init'" \
  -np 1 -wdir "$out/two/w0" "$cli" "${init_run[@]}" : -np 1 -wdir "$out/two/w1" "$cli" "${init_run[@]}"

# A rank that stops answering (SIGSTOP) ends the run, with a message naming it, once rank 0 has
# waited SCALIFY_MPI_TIMEOUT seconds in a collective (rank 0's alone: whenever it times out, the
# rank it waits for is rank 1).
cd "$out/two"
"$mpirun" --oversubscribe -np 1 -x SCALIFY_MPI_TIMEOUT=5 "$cli" train --recipe f32 --out stopped --steps 100000 "${tiny[@]}" : \
  -np 1 "$cli" train --recipe f32 --out stopped --steps 100000 "${tiny[@]}" > stopped.log 2>&1 &
mpirun_pid=$!
cd - > /dev/null
for _ in $(seq 600); do [[ -f "$out/two/stopped/checkpoint.safetensors" ]] && break; sleep 0.1; done
rank1=$(pgrep -f "scalify train --recipe f32 --out stopped" | while read -r p; do
  grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/"$p"/environ 2>/dev/null && echo "$p"; done | head -1)
[[ -n "$rank1" ]] || { echo "no rank 1 process found"; exit 1; }
kill -STOP "$rank1"
start=$SECONDS
while kill -0 $mpirun_pid 2>/dev/null; do  # a guard against a hang, far above the 5 s + 5 s the ranks wait
  (( SECONDS - start < 120 )) || { echo "the run did not end after rank 1 stopped"; kill -9 "$rank1" $mpirun_pid; exit 1; }
  sleep 0.2
done
if wait $mpirun_pid; then echo "mpirun exited 0 after a rank stopped"; exit 1; fi
grep -q "scalify (rank 0): error: rank 0 waited 5 s for the other ranks in its [0-9]*[a-z][a-z] collective (.*): rank 1 does not answer" \
  "$out/two/stopped.log" || { echo "no message naming the stopped rank:"; cat "$out/two/stopped.log"; exit 1; }
state=$(awk '/^State/ {print $2}' /proc/"$rank1"/status 2> /dev/null || true)  # gone, or a zombie being reaped
[[ -z "$state" || "$state" == Z ]] || { echo "the stopped rank outlived the run (state $state)"; kill -9 "$rank1"; exit 1; }
echo "data parallel: all checks passed"
