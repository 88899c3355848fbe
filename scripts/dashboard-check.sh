#!/usr/bin/env bash
# Builds dashboard-check (Grafana's dashboard schema, from grafana-foundation-sdk through the
# Go module proxy) once per source version, cached; prints the binary's path.
set -euo pipefail
src="$(cd "$(dirname "$0")/dashboard-check" && pwd)"
key=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
bin="${KVRANK_CACHE:-$HOME/.cache/kvrank}/dashboard-check-$key"
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  (cd "$src" && go build -trimpath -o "$bin.partial" .)
  mv "$bin.partial" "$bin"
fi
echo "$bin"
