#!/usr/bin/env bash
# Builds gofakes3 (an S3-compatible server in one process: the store the tests fetch s3://
# model artifacts from, serving a folder as a bucket) from its Go module, once:
# $KVRANK_CACHE/tools/gofakes3-<version>/bin/gofakes3. Prints the bin directory. (MinIO's
# server is AGPL-licensed and SeaweedFS's build takes many minutes; this one about 30 s.)
set -euo pipefail
GOFAKES3_VERSION="${GOFAKES3_VERSION:-v1.2.0}"
exec bash "$(dirname "$0")/build-go-tool.sh" gofakes3 github.com/johannesboyne/gofakes3 \
  "$GOFAKES3_VERSION" github.com/johannesboyne/gofakes3/cmd/gofakes3
