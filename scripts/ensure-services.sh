#!/usr/bin/env bash
# Installs the Debian packages whose binaries the test fixtures start: redis-server
# (standalone and cluster fixtures) and prometheus (the operator's TTL source). Tests start
# and stop the processes themselves.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v prometheus >/dev/null || need+=(prometheus)
if ((${#need[@]})); then
  echo "installing ${need[*]} (apt-get)"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
redis-server --version | head -1
prometheus --version 2>&1 | head -1
