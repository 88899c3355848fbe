#!/usr/bin/env bash
# Builds one command from a Go module, once, into $KVRANK_CACHE/tools/<name>-<version>/bin:
#   build-go-tool.sh NAME MODULE VERSION PACKAGE [LDFLAGS]
# Prints the bin directory as its last line of stdout; a second run finds the binary and
# returns at once. (The tools the tests and the linters run: see build-kube-score.sh and
# build-gofakes3.sh, build-fake-gcs-server.sh.)
set -euo pipefail

NAME="$1" MODULE="$2" VERSION="$3" PACKAGE="$4" LDFLAGS="${5:-}"
CACHE_ROOT="${KVRANK_CACHE:-$HOME/.cache/kvrank}"
OUT="$CACHE_ROOT/tools/$NAME-$VERSION"
BIN="$OUT/bin"
BINARIES=("$NAME")
LOG_TAG="$NAME-build"
export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod"
# shellcheck source=../e2e/localkube/build-common.sh
source "$(dirname "$0")/../e2e/localkube/build-common.sh"
command -v go >/dev/null || { echo "$LOG_TAG: 'go' is not on PATH" >&2; exit 1; }

mkdir -p "$BIN" "$OUT/src"
printf 'module kvrank.local/build/%s\n\ngo 1.26.0\n\nrequire %s %s\n' \
  "$NAME" "$MODULE" "$VERSION" > "$OUT/src/go.mod"
log "building $NAME $VERSION"
(cd "$OUT/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $LDFLAGS" \
  -o "$BIN/$NAME" "$PACKAGE")
have_all || { echo "$LOG_TAG: $NAME missing in $BIN" >&2; exit 1; }
echo "$BIN"
