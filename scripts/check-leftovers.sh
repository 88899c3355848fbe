#!/usr/bin/env bash
# Fails when a service started by the test suite is still running. Test services live in
# pytest temp dirs: their command line or (redis-server rewrites its title) their cwd.
set -uo pipefail
left=""
for pid in $(pgrep -f 'etcd|kube-|kwok|redis-server|prometheus|kvrank' || true); do
  [[ -r /proc/$pid/cmdline ]] || continue
  cmd=$(tr '\0' ' ' < /proc/$pid/cmdline)
  cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
  if [[ "$cmd $cwd" == *pytest-of-* ]]; then left+="$pid $cmd (cwd $cwd)"$'\n'; fi
done
if [[ -n "$left" ]]; then
  echo "processes left behind by the tests:"; echo -n "$left"; exit 1
fi
echo "no test processes left behind"
