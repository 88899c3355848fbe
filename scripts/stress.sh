#!/usr/bin/env bash
# Runs a command RUNS times in a row with BUSY more cores kept busy the whole time (a loop
# each, at normal priority, as a neighbour's process would be); stops at the first failure.
#   stress.sh BUSY RUNS CMD...
set -uo pipefail
busy="$1" runs="$2"; shift 2
pids=()
stop_busy() { ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; }
trap stop_busy EXIT
for _ in $(seq "$busy"); do
  sh -c 'while :; do :; done' &
  pids+=("$!")
done
echo "==> stress: $busy busy loop(s) beside the run: ${pids[*]:-none}"
for run in $(seq "$runs"); do
  start=$(date +%s)
  if "$@"; then
    echo "==> stress run $run/$runs: passed in $(( $(date +%s) - start ))s"
  else
    echo "==> stress run $run/$runs: FAILED in $(( $(date +%s) - start ))s"
    exit 1
  fi
done
echo "==> stress: $runs run(s) in a row passed"
