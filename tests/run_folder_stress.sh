#!/usr/bin/env bash
# Run folders under abuse, through the CLI as a user would (issue 29):
#   kill -9   a trainer that checkpoints every step is killed at random moments; its checkpoint must
#             always load, no temporary of a dead writer survives the next write, and a resume finishes.
#   resume    a run killed at a random step and resumed must end byte-identical to an uninterrupted one.
#   two       two trainers started on one --out at once: one trains, the other is refused (naming the
#             holder's PID) or finds a finished run; a --resume while the trainer runs is refused and
#             leaves it running; the folder ends consistent (one loss record per step).
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
# A random delay of 0.05 to 1.5 s.
nap() { sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", 0.05 + r / 32767 * 1.45 }')"; }

echo "== kill -9 during checkpoint writes ($rounds kills)"
# Each round kills the trainer of the round before's folder again (a resume, once it has a
# checkpoint): every checkpoint a kill leaves must load. A writer that got as far as a checkpoint
# has removed the temporaries of the writers before it, so after such a kill the only temporary
# left can be the killed writer's own.
loaded=0
rm -rf k
for ((i = 0; i < rounds; i++)); do
  if [[ -e k/checkpoint.safetensors ]]; then
    "$cli" train --resume k > /dev/null 2>&1 &
  else
    rm -rf k
    "$cli" train "${model[@]}" --steps 100000 --set checkpoint_every=1 --set eval_every=100000 --out k > /dev/null 2>&1 &
  fi
  pid=$!
  before=$(stat -c %Y.%s k/checkpoint.safetensors 2> /dev/null || echo none)
  nap
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  [[ -e k/checkpoint.safetensors ]] || continue  # killed before its first checkpoint
  if [[ "$(stat -c %Y.%s k/checkpoint.safetensors)" != "$before" ]]; then  # this writer saved a checkpoint
    for tmp in k/*.tmp.*; do
      [[ -e "$tmp" && "${tmp##*.}" != "$pid" ]] && fail "kill $i: a temporary of an earlier, dead writer survived: $tmp"
    done
  fi
  "$cli" eval k > /dev/null 2> err || fail "kill $i: the checkpoint does not load: $(cat err)"
  loaded=$((loaded + 1))
done
echo "checkpoints loaded after a kill: $loaded of $rounds kills (the rest came before the first checkpoint)"
(( loaded > 0 )) || fail "no kill landed after a checkpoint"

echo "== kill at a random step, resume: byte-identical to an uninterrupted run ($pairs pairs)"
mkdir -p whole split
resumed=0
(cd whole && "$cli" train "${model[@]}" --steps 300 --set checkpoint_every=7 --recipe delayed --out r > /dev/null 2>&1)
for ((i = 0; i < pairs; i++)); do
  rm -rf split/r
  (cd split && exec "$cli" train "${model[@]}" --steps 300 --set checkpoint_every=7 --recipe delayed --out r > /dev/null 2>&1) &
  pid=$!
  nap
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  if [[ -e split/r/model.safetensors ]]; then
    :  # finished before the kill
  elif [[ -e split/r/checkpoint.safetensors ]]; then
    resumed=$((resumed + 1))
    (cd split && "$cli" train --resume r > /dev/null 2> err) || fail "resume $i failed: $(cat split/err)"
  else
    (cd split && rm -rf r && "$cli" train "${model[@]}" --steps 300 --set checkpoint_every=7 --recipe delayed --out r > /dev/null 2>&1)
  fi
  cmp -s whole/r/model.safetensors split/r/model.safetensors || fail "pair $i: the resumed run's model differs"
  cmp -s whole/r/checkpoint.safetensors split/r/checkpoint.safetensors || fail "pair $i: the resumed run's checkpoint differs"
done
echo "runs byte-identical to the uninterrupted one: $pairs of $pairs ($resumed resumed from a checkpoint, the rest killed before one)"

echo "== two writers on one run folder ($pairs trials)"
for ((i = 0; i < pairs; i++)); do
  rm -rf c
  "$cli" train "${model[@]}" --steps 400 --out c > out1 2> err1 &
  p1=$!
  "$cli" train "${model[@]}" --steps 400 --out c > out2 2> err2 &
  p2=$!
  sleep 0.3
  if "$cli" train --resume c --steps 500 > /dev/null 2> err3; then fail "trial $i: a --resume ran beside a live trainer"; fi
  rc1=0 rc2=0
  wait "$p1" || rc1=$?
  wait "$p2" || rc2=$?
  (( (rc1 == 0) + (rc2 == 0) == 1 )) || fail "trial $i: exit codes $rc1 and $rc2 (exactly one trainer must run)"
  # grep reads the files itself: `cat ... | grep -q` under pipefail failed whenever grep matched
  # and quit before cat had written the second file (SIGPIPE).
  grep -Eq "in use by another scalify process \(PID [0-9]+, scalify train\)|already holds a run" err1 err2 ||
    fail "trial $i: the refused trainer did not say why: $(cat err1 err2)"
  # Refused by the lock, or (on a slow host) before the trainer made the folder or wrote its config.
  grep -Eq "in use by another scalify process|holds no checkpoint|is not a run folder|cannot open|is at step 400" err3 ||
    fail "trial $i: the refused resume did not say why: $(cat err3)"
  losses=$(grep -c '"loss":' c/metrics.jsonl)
  (( losses == 400 )) || fail "trial $i: $losses loss records for 400 steps"
  "$cli" eval c > /dev/null 2> err || fail "trial $i: the finished run does not load: $(cat err)"
done
echo "concurrent writers refused cleanly: $pairs of $pairs trials"
