#!/usr/bin/env bash
# Installs the Debian packages whose binaries the test fixtures start: redis-server
# (standalone and cluster fixtures), prometheus (the operator's TTL source), and, where no
# Docker engine answers, docker.io (dockerd for the image tests) with debootstrap (the
# stand-in base image where Docker Hub is unreachable). Tests start and stop the processes
# themselves.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v prometheus >/dev/null || need+=(prometheus)
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || need+=(docker.io)
  command -v debootstrap >/dev/null || need+=(debootstrap)
fi
if ((${#need[@]})); then
  echo "installing ${need[*]} (apt-get)"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
redis-server --version | head -1
prometheus --version 2>&1 | head -1
command -v dockerd >/dev/null && dockerd --version || docker version --format 'docker engine {{.Server.Version}}'
