#!/usr/bin/env bash
# Installs the Debian packages the tests and the local cluster's real node need, when
# missing: redis-server (the cache tests' Redis), prometheus (the operator's TTL source),
# iptables, ipset and conntrack (kube-proxy, kube-router, the node's network fence),
# containernetworking-plugins (the node's CNI bridge), libseccomp-dev (runc is built with
# seccomp), and, where no Docker engine answers, docker.io (dockerd builds the images) with
# debootstrap (the stand-in base image where Docker Hub is unreachable), and docker-registry
# (the registry `make push-images` is tested against). Tests start and stop
# the processes themselves.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v prometheus >/dev/null || need+=(prometheus)
command -v iptables >/dev/null || need+=(iptables)
command -v ipset >/dev/null || need+=(ipset)
command -v conntrack >/dev/null || need+=(conntrack)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
[[ -f /usr/include/seccomp.h ]] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v nsenter >/dev/null || need+=(util-linux)
command -v docker-registry >/dev/null || need+=(docker-registry)
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
iptables --version
command -v dockerd >/dev/null && dockerd --version || docker version --format 'docker engine {{.Server.Version}}'
