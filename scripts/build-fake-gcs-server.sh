#!/usr/bin/env bash
# Builds fake-gcs-server (a Google Cloud Storage-compatible server in one process, the one
# object_store's own tests use: the store the tests fetch gs:// model artifacts from, serving
# a folder as buckets) from its Go module, once:
# $KVRANK_CACHE/tools/fake-gcs-server-<version>/bin/fake-gcs-server. Prints the bin directory.
set -euo pipefail
FAKE_GCS_SERVER_VERSION="${FAKE_GCS_SERVER_VERSION:-v1.56.1}"
exec bash "$(dirname "$0")/build-go-tool.sh" fake-gcs-server github.com/fsouza/fake-gcs-server \
  "$FAKE_GCS_SERVER_VERSION" github.com/fsouza/fake-gcs-server
