#!/usr/bin/env bash
# Installs Bitnami's readme-generator-for-helm (renders a chart README's parameter tables from
# the `## @param` tags in values.yaml) from the npm registry, once:
# $KVRANK_CACHE/tools/readme-generator-<version>/node_modules/.bin/readme-generator. Prints the
# bin directory as its last line of stdout; a second run finds it and returns at once.
set -euo pipefail

VERSION="${README_GENERATOR_VERSION:-2.7.2}"
CACHE_ROOT="${KVRANK_CACHE:-$HOME/.cache/kvrank}"
OUT="$CACHE_ROOT/tools/readme-generator-$VERSION"
BIN="$OUT/node_modules/.bin"
BINARIES=(readme-generator)
LOG_TAG=readme-generator
# shellcheck source=../e2e/localkube/build-common.sh
source "$(dirname "$0")/../e2e/localkube/build-common.sh"
command -v npm >/dev/null || { echo "readme-generator: 'npm' is not on PATH" >&2; exit 1; }

mkdir -p "$OUT"
log "installing @bitnami/readme-generator-for-helm $VERSION"
npm install --prefix "$OUT" --no-audit --no-fund --silent \
  "@bitnami/readme-generator-for-helm@$VERSION" >&2
have_all || { echo "readme-generator: readme-generator missing in $BIN" >&2; exit 1; }
echo "$BIN"
