#!/usr/bin/env bash
# The Gateway API CRDs (standard channel: HTTPRoute, Gateway, GatewayClass) and Envoy
# Gateway's BackendTrafficPolicy CRD, as their Go modules ship them, cached; prints the
# directory holding the YAML files.
set -euo pipefail
source "$(dirname "$0")/module-crds.sh"
GATEWAY_API="${GATEWAY_API_VERSION:-v1.6.3}"
ENVOY_GATEWAY="${ENVOY_GATEWAY_VERSION:-v1.9.1}"
api=$(module_crds "gateway-api-crds-$GATEWAY_API" "sigs.k8s.io/gateway-api@$GATEWAY_API" \
  config/crd/standard/gateway.networking.k8s.io_httproutes.yaml \
  config/crd/standard/gateway.networking.k8s.io_gateways.yaml \
  config/crd/standard/gateway.networking.k8s.io_gatewayclasses.yaml)
eg=$(module_crds "envoy-gateway-crds-$ENVOY_GATEWAY" "github.com/envoyproxy/gateway@$ENVOY_GATEWAY" \
  charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_backendtrafficpolicies.yaml)
cache="${KVRANK_CACHE:-$HOME/.cache/kvrank}/gateway-crds-$GATEWAY_API-$ENVOY_GATEWAY"
if [ ! -d "$cache" ]; then
  mkdir -p "$cache.partial" && cp "$api"/*.yaml "$eg"/*.yaml "$cache.partial/" && mv "$cache.partial" "$cache"
fi
echo "$cache"
