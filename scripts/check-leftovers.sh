#!/usr/bin/env bash
# Fails when a service started by the test suite is still running (pytest temp dirs).
set -uo pipefail
left=$(pgrep -af 'pytest-of-' | grep -E 'etcd|kube-|kwok|redis-server|prometheus|kvrank' | grep -v pgrep || true)
if [[ -n "$left" ]]; then
  echo "processes left behind by the tests:"; echo "$left"; exit 1
fi
echo "no test processes left behind"
