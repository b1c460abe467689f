#!/usr/bin/env bash
# OpenMP's wait (issue 42, src/scalify/platform/openmp_wait.hpp): the libgomp that runs the work
# spins scalify's count before it sleeps, unless the user chose with OMP_WAIT_POLICY or
# GOMP_SPINCOUNT. OMP_DISPLAY_ENV=verbose makes libgomp print its settings as it loads; the last
# print is the process that does the work (the CLI starts again once to set the count).
# Usage: openmp_wait_test.sh SCALIFY
set -euo pipefail
cli="$(realpath "$1")"
spin() {  # spin [VAR=VALUE...]: the spin count libgomp runs `scalify info` with
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" OMP_DISPLAY_ENV=verbose "$cli" info 2>&1 > /dev/null |
    grep -o "GOMP_SPINCOUNT = '[0-9]*'" | tail -1
}
expect() {  # expect WANTED [VAR=VALUE...]
  local wanted=$1
  shift
  local got
  got=$(spin "$@")
  [[ "$got" == "GOMP_SPINCOUNT = '$wanted'" ]] || { echo "with ${*:-no setting}: libgomp has $got, not $wanted"; exit 1; }
}
expect 1000                            # scalify's choice: microseconds of spinning, then sleep
expect 7 GOMP_SPINCOUNT=7              # the user's count
expect 0 OMP_WAIT_POLICY=passive       # the user's policy
expect 30000000000 OMP_WAIT_POLICY=active
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$cli" info | grep -q "^openmp wait: GOMP_SPINCOUNT=1000$" || { echo "info does not name the wait"; exit 1; }
echo "openmp wait: libgomp spins scalify's count, or the user's"
