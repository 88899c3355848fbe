#!/usr/bin/env bash
# Builds gofakes3 (an S3-compatible server in one process: the store the tests fetch s3://
# model artifacts from, serving a folder as a bucket) from its Go module, once:
# $KVRANK_CACHE/tools/gofakes3-<version>/bin/gofakes3. Prints the bin directory as its last
# line of stdout; a second run finds the binary and returns at once. (MinIO's server is
# AGPL-licensed and SeaweedFS's build takes many minutes; this one builds in about 30 s.)
set -euo pipefail

GOFAKES3_VERSION="${GOFAKES3_VERSION:-v1.2.0}"
CACHE_ROOT="${KVRANK_CACHE:-$HOME/.cache/kvrank}"
OUT="$CACHE_ROOT/tools/gofakes3-$GOFAKES3_VERSION"
BIN="$OUT/bin"
BINARIES=(gofakes3)
LOG_TAG=gofakes3-build
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod"
# shellcheck source=../e2e/localkube/build-common.sh
source "$(dirname "$0")/../e2e/localkube/build-common.sh"
command -v go >/dev/null || { echo "gofakes3-build: 'go' is not on PATH" >&2; exit 1; }

mkdir -p "$BIN" "$OUT/src"
printf 'module kvrank.local/build/s3\n\ngo 1.26.0\n\nrequire github.com/johannesboyne/gofakes3 %s\n' \
  "$GOFAKES3_VERSION" > "$OUT/src/go.mod"
log "building gofakes3 $GOFAKES3_VERSION"
(cd "$OUT/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
  -o "$BIN/gofakes3" github.com/johannesboyne/gofakes3/cmd/gofakes3)
have_all || { echo "gofakes3-build: gofakes3 missing in $BIN" >&2; exit 1; }
echo "$BIN"
