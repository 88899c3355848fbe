#!/usr/bin/env bash
# The prometheus-operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule, …) as its Go
# module ships them, cached; prints the directory holding the YAML files.
set -euo pipefail
source "$(dirname "$0")/module-crds.sh"
VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
module_crds "prometheus-operator-crds-$VERSION" \
  "github.com/prometheus-operator/prometheus-operator@$VERSION" \
  'example/prometheus-operator-crd/monitoring.coreos.com_*.yaml'
