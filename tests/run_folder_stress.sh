#!/usr/bin/env bash
# Run folders under abuse, through the CLI as a user would (issue 29):
#   kill -9   a trainer that checkpoints every step is killed at random moments; its checkpoint must
#             always load, no temporary of a dead writer survives the next write, and a resume finishes.
#   resume    a run killed at a random step and resumed must end byte-identical to an uninterrupted one.
#   two       two trainers started on one --out at once: one trains, the other is refused (naming the
#             holder's PID) or finds a finished run; a --resume while the trainer runs is refused and
#             leaves it running; the folder ends consistent (one loss record per step).
# Every kill and every check waits for an event on disk (a checkpoint written, a step's loss record),
# never for a time (issue 42): a slow or loaded host only makes it slower. A wait has no limit of
# its own; ctest's TIMEOUT (tests/CMakeLists.txt) bounds the whole.
# Usage: run_folder_stress.sh SCALIFY [ROUNDS]   (ROUNDS: kills; resume pairs and concurrency trials
# are a tenth of it, at least 2). CI runs 10 rounds; the slow-labelled test runs 100.
set -euo pipefail
cli="$(realpath "$1")"
rounds="${2:-10}"
pairs=$(( rounds / 10 > 2 ? rounds / 10 : 2 ))
work="$(mktemp -d)"
trap 'pkill -9 -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
head -c 300000 /usr/share/games/fortunes/fortunes > corpus.txt
model=(--data "$work/corpus.txt" --set d_model=64 --set layers=2 --set heads=2 --set seq=64 --set batch=8
       --set eval_windows=8 --set warmup=10)
fail() { echo "run_folder_stress: $*" >&2; exit 1; }
# A file's identity: each checkpoint is a new file renamed onto the old, so this changes with every write.
identity() { stat -c '%i %.9Y %s' "$1" 2> /dev/null || echo none; }
changed() { [[ "$(identity "$1")" != "$2" ]]; }
steps_done() { [[ -e "$1" ]] && (( $(grep -c '"loss":' "$1" || true) >= $2 )); }
# wait_until PID CHECK...: polls CHECK until it holds; returns 1 if PID has ended first (its last
# writes are then checked once more).
wait_until() {
  local pid=$1
  shift
  until "$@"; do
    if ! kill -0 "$pid" 2> /dev/null; then "$@"; return; fi
    sleep 0.01
  done
}
# After the event, a random pause of 0 to 0.3 s: where in the next steps and checkpoint writes the kill lands.
jitter() { sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", r / 32767 * 0.3 }')"; }

echo "== kill -9 during checkpoint writes ($rounds kills)"
# Each round kills the trainer of the round before's folder again (a resume), once it has written a
# checkpoint of its own: every checkpoint a kill leaves must load. A writer that got as far as a
# checkpoint has removed the temporaries of the writers before it, so after the kill the only
# temporary left can be the killed writer's own.
rm -rf k
for ((i = 0; i < rounds; i++)); do
  before=$(identity k/checkpoint.safetensors)
  if [[ -e k/checkpoint.safetensors ]]; then
    "$cli" train --resume k > /dev/null 2> train_err &
  else
    "$cli" train "${model[@]}" --steps 100000 --set checkpoint_every=1 --set eval_every=100000 --out k > /dev/null 2> train_err &
  fi
  pid=$!
  wait_until "$pid" changed k/checkpoint.safetensors "$before" ||
    fail "kill $i: the trainer ended before it wrote a checkpoint: $(cat train_err)"
  jitter
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  for tmp in k/*.tmp.*; do
    [[ -e "$tmp" && "${tmp##*.}" != "$pid" ]] && fail "kill $i: a temporary of an earlier, dead writer survived: $tmp"
  done
  "$cli" eval k > /dev/null 2> err || fail "kill $i: the checkpoint does not load: $(cat err)"
done
echo "checkpoints loaded after a kill: $rounds of $rounds kills"

echo "== kill at a random step, resume: byte-identical to an uninterrupted run ($pairs pairs)"
mkdir -p whole split
resumed=0
(cd whole && "$cli" train "${model[@]}" --steps 300 --set checkpoint_every=7 --recipe delayed --out r > /dev/null 2>&1)
for ((i = 0; i < pairs; i++)); do
  rm -rf split/r
  (cd split && exec "$cli" train "${model[@]}" --steps 300 --set checkpoint_every=7 --recipe delayed --out r > /dev/null 2> ../train_err) &
  pid=$!
  # A random step past the first checkpoint (step 7): the kill lands in the steps after it.
  at=$(( 8 + RANDOM % 290 ))
  wait_until "$pid" steps_done split/r/metrics.jsonl "$at" || fail "pair $i: the trainer ended before step $at: $(cat train_err)"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if [[ ! -e split/r/model.safetensors ]]; then  # else it finished before the kill
    resumed=$((resumed + 1))
    (cd split && "$cli" train --resume r > /dev/null 2> err) || fail "resume $i (killed past step $at) failed: $(cat split/err)"
  fi
  cmp -s whole/r/model.safetensors split/r/model.safetensors || fail "pair $i: the resumed run's model differs"
  cmp -s whole/r/checkpoint.safetensors split/r/checkpoint.safetensors || fail "pair $i: the resumed run's checkpoint differs"
done
echo "runs byte-identical to the uninterrupted one: $pairs of $pairs ($resumed resumed from a checkpoint, the rest finished before the kill)"

echo "== two writers on one run folder ($pairs trials)"
beside=0
for ((i = 0; i < pairs; i++)); do
  rm -rf c
  "$cli" train "${model[@]}" --steps 400 --out c > out1 2> err1 &
  p1=$!
  "$cli" train "${model[@]}" --steps 400 --out c > out2 2> err2 &
  p2=$!
  # Once one trainer has trained a step it holds the folder (or both have ended). Both are then
  # stopped, so a trainer that has not finished still holds it while the --resume tries.
  wait_until "$p1" steps_done c/metrics.jsonl 1 || wait_until "$p2" steps_done c/metrics.jsonl 1 || true
  kill -STOP "$p1" "$p2" 2> /dev/null || true
  if ! steps_done c/metrics.jsonl 400; then
    if "$cli" train --resume c --steps 500 > /dev/null 2> err3; then fail "trial $i: a --resume ran beside a live trainer"; fi
    grep -q "in use by another scalify process" err3 || fail "trial $i: the refused resume did not say why: $(cat err3)"
    beside=$((beside + 1))
  fi
  kill -CONT "$p1" "$p2" 2> /dev/null || true
  rc1=0 rc2=0
  wait "$p1" || rc1=$?
  wait "$p2" || rc2=$?
  (( (rc1 == 0) + (rc2 == 0) == 1 )) || fail "trial $i: exit codes $rc1 and $rc2 (exactly one trainer must run)"
  # grep reads the files itself: `cat ... | grep -q` under pipefail failed whenever grep matched
  # and quit before cat had written the second file (SIGPIPE).
  grep -Eq "in use by another scalify process \(PID [0-9]+, scalify train\)|already holds a run" err1 err2 ||
    fail "trial $i: the refused trainer did not say why: $(cat err1 err2)"
  losses=$(grep -c '"loss":' c/metrics.jsonl)
  (( losses == 400 )) || fail "trial $i: $losses loss records for 400 steps"
  "$cli" eval c > /dev/null 2> err || fail "trial $i: the finished run does not load: $(cat err)"
done
echo "concurrent writers refused cleanly: $pairs of $pairs trials ($beside with a --resume refused beside the live trainer, the rest finished first)"
