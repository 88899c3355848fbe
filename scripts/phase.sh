#!/usr/bin/env bash
# Runs one phase of a make target and prints how long it took: phase.sh NAME CMD...
set -uo pipefail
name="$1"; shift
start=$(date +%s)
echo "==> [$name] start $(date -u +%H:%M:%S)"
"$@"
rc=$?
echo "==> [$name] $( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)") in $(( $(date +%s) - start ))s"
exit "$rc"
