#!/usr/bin/env bash
# Builds the local Kubernetes cluster's Go binaries: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and helm for the control plane,
# kubelet and kube-proxy for its real node, all from their Go modules (GOTOOLCHAIN=local,
# CGO_ENABLED=0). The node's container runtime and add-ons come from build-node.sh.
#
# Output: $KVRANK_CACHE/k8s/<versions>/bin (default ~/.cache/kvrank/k8s/...). A second run
# with the same pinned versions finds the binaries and returns in seconds.
# Prints the bin directory as its last line of stdout.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"   # newest release whose go directive fits Go 1.26
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"    # the etcd line that Kubernetes 1.37 requires
HELM_VERSION="${HELM_VERSION:-v3.22.0}"

CACHE_ROOT="${KVRANK_CACHE:-$HOME/.cache/kvrank}"
KEY="kube-${KUBE_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
OUT="$CACHE_ROOT/k8s/$KEY"
BIN="$OUT/bin"
WORK="$OUT/src"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm kubelet kube-proxy)

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
LOG_TAG=localkube-build
# shellcheck source=build-common.sh
source "$(dirname "$0")/build-common.sh"

command -v go >/dev/null || { echo "localkube-build: 'go' is not on PATH; install Go >= 1.26" >&2; exit 1; }
PROXY="$(go env GOPROXY | cut -d, -f1)"
if [[ "$PROXY" == http* ]] && ! curl -fsS -o /dev/null --max-time 20 "$PROXY/k8s.io/kubernetes/@v/$KUBE_VERSION.mod"; then
  echo "localkube-build: the Go module proxy $PROXY does not serve k8s.io/kubernetes $KUBE_VERSION" >&2
  exit 1
fi
mkdir -p "$BIN" "$WORK"

# wrapper_module DIR MODULE VERSION [replace lines...]: a tiny module that requires MODULE
# so its commands can be built despite replace directives in MODULE's own go.mod.
wrapper_module() {
  local dir="$1" mod="$2" ver="$3"; shift 3
  mkdir -p "$dir"
  {
    echo "module kvrank.local/build/$(basename "$dir")"
    echo
    echo "go 1.26.0"
    echo
    echo "require $mod $ver"
    for r in "$@"; do echo "replace $r"; done
  } > "$dir/go.mod"
}

build_kubernetes() {
  local dir="$WORK/kubernetes" minor="${KUBE_VERSION#v1.}"
  local staging_ver="v0.${minor}"
  # Every staging module is required as v0.0.0 and replaced by ./staging in the release's
  # own go.mod; here each gets the published v0.Y.Z tag instead.
  mapfile -t staging < <(curl -fsS "$PROXY/k8s.io/kubernetes/@v/$KUBE_VERSION.mod" \
    | awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' | sort -u)
  local replaces=()
  for m in "${staging[@]}"; do replaces+=("$m => $m $staging_ver"); done
  wrapper_module "$dir" k8s.io/kubernetes "$KUBE_VERSION" "${replaces[@]}"
  local major=1 kminor="${minor%%.*}"
  local ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$kminor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    [[ -x "$BIN/$cmd" ]] && continue
    log "building $cmd $KUBE_VERSION"
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
}

build_simple() {  # NAME MODULE VERSION PACKAGE [LDFLAGS]
  local name="$1" mod="$2" ver="$3" pkg="$4" ldflags="${5:-}"
  local dir="$WORK/$name"
  wrapper_module "$dir" "$mod" "$ver"
  log "building $name $ver"
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$BIN/$name" "$pkg")
}

[[ -x "$BIN/etcd" ]] || build_simple etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
KUBE_MINOR="${KUBE_VERSION#v1.}"; KUBE_MINOR="${KUBE_MINOR%%.*}"
[[ -x "$BIN/helm" ]] || build_simple helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
   -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$KUBE_MINOR \
   -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$KUBE_MINOR"
have_all || build_kubernetes

have_all || { echo "localkube-build: some binaries are missing in $BIN" >&2; exit 1; }
log "done: $(ls "$BIN" | tr '\n' ' ')"
echo "$BIN"
