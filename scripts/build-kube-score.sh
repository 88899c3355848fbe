#!/usr/bin/env bash
# Builds kube-score (the manifest linter platform teams gate on) from its Go module, once:
# $KVRANK_CACHE/tools/kube-score-<version>/bin/kube-score. Prints the bin directory.
set -euo pipefail
KUBE_SCORE_VERSION="${KUBE_SCORE_VERSION:-v1.20.0}"
exec bash "$(dirname "$0")/build-go-tool.sh" kube-score github.com/zegl/kube-score \
  "$KUBE_SCORE_VERSION" github.com/zegl/kube-score/cmd/kube-score \
  "-X main.version=$KUBE_SCORE_VERSION"
