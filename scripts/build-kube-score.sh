#!/usr/bin/env bash
# Builds kube-score (the manifest linter platform teams gate on) from its Go module, once:
# $KVRANK_CACHE/tools/kube-score-<version>/bin/kube-score. Prints the bin directory as its
# last line of stdout; a second run finds the binary and returns at once.
set -euo pipefail

KUBE_SCORE_VERSION="${KUBE_SCORE_VERSION:-v1.20.0}"
CACHE_ROOT="${KVRANK_CACHE:-$HOME/.cache/kvrank}"
OUT="$CACHE_ROOT/tools/kube-score-$KUBE_SCORE_VERSION"
BIN="$OUT/bin"
BINARIES=(kube-score)
LOG_TAG=kube-score-build
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod"
# shellcheck source=../e2e/localkube/build-common.sh
source "$(dirname "$0")/../e2e/localkube/build-common.sh"
command -v go >/dev/null || { echo "kube-score-build: 'go' is not on PATH" >&2; exit 1; }

mkdir -p "$BIN" "$OUT/src"
printf 'module kvrank.local/build/lint\n\ngo 1.26.0\n\nrequire github.com/zegl/kube-score %s\n' \
  "$KUBE_SCORE_VERSION" > "$OUT/src/go.mod"
log "building kube-score $KUBE_SCORE_VERSION"
(cd "$OUT/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$KUBE_SCORE_VERSION" \
  -o "$BIN/kube-score" github.com/zegl/kube-score/cmd/kube-score)
have_all || { echo "kube-score-build: kube-score missing in $BIN" >&2; exit 1; }
echo "$BIN"
