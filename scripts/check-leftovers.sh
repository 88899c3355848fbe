#!/usr/bin/env bash
# Fails when the test suite left something behind: a service it started (test services live
# in pytest temp dirs, make test's lanes under /tmp/kvrank-tests: their command line or, for
# redis-server which rewrites its title, their cwd), a container shim of the local node, or the node's network namespace, routes or
# firewall chain (the host's network must be as the run found it).
set -uo pipefail
left=""
for pid in $(pgrep -f 'etcd|kube-|kubelet|containerd|coredns|redis-server|prometheus|kvrank' || true); do
  [[ -r /proc/$pid/cmdline ]] || continue
  cmd=$(tr '\0' ' ' < /proc/$pid/cmdline)
  cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
  if [[ "$cmd $cwd" == *pytest-of-* || "$cmd $cwd" == */kvrank-tests/* ]]; then left+="$pid $cmd (cwd $cwd)"$'\n'; fi
done
ip netns list 2>/dev/null | grep -q '^kvrank-node' && left+="network namespace kvrank-node"$'\n'
routes=$(ip -4 route show | grep -E '^(blackhole )?10\.(96|243|244)\.' || true)
[[ -n "$routes" ]] && left+="routes: $routes"$'\n'
iptables -S FORWARD 2>/dev/null | grep -q KVRANK-FENCE && left+="iptables chain KVRANK-FENCE"$'\n'
if [[ -n "$left" ]]; then
  echo "left behind by the tests:"; echo -n "$left"; exit 1
fi
echo "no test processes, namespaces, routes or firewall rules left behind"
