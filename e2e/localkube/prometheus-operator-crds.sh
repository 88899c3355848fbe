#!/usr/bin/env bash
# The prometheus-operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule, …) as its Go
# module ships them, fetched through the Go module proxy (this network reaches no GitHub
# download) and cached; prints the directory holding the YAML files.
set -euo pipefail
VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
CACHE="${KVRANK_CACHE:-$HOME/.cache/kvrank}/prometheus-operator-crds-$VERSION"
if [ ! -d "$CACHE" ]; then
  work=$(mktemp -d)
  trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  GOMODCACHE="$work/mod" GOFLAGS=-mod=mod \
    go mod download -json "github.com/prometheus-operator/prometheus-operator@$VERSION" > "$work/module.json"
  dir=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["Dir"])' "$work/module.json")
  mkdir -p "$CACHE.partial"
  cp "$dir"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$CACHE.partial/"
  mv "$CACHE.partial" "$CACHE"
fi
echo "$CACHE"
