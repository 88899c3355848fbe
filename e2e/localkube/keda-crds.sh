#!/usr/bin/env bash
# KEDA's CRDs (ScaledObject, ScaledJob, TriggerAuthentication, …) as its Go module ships
# them, cached; prints the directory holding the YAML files.
set -euo pipefail
source "$(dirname "$0")/module-crds.sh"
VERSION="${KEDA_VERSION:-v2.21.0}"
module_crds "keda-crds-$VERSION" "github.com/kedacore/keda/v2@$VERSION" \
  'config/crd/bases/keda.sh_*.yaml'
